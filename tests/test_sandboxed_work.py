"""What a coding task needs runs under the sandbox, under each mechanism: a virtual environment in
the workspace with a package installed into it by pip from an index over the network, when the
operator allows commands the network (and, when not, a refusal that says so); the caches and
dotfiles tools write (pip, npm, cargo) in the session's HOME, kept with the session."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import shutil
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from a3s_agent.config import SandboxSettings, Settings
from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import LiveServer, new_session, running
from .security.sandboxes import MECHANISMS

PACKAGE, WORDS = "greeting", "hello from the local index"


def _wheel(directory: Path) -> Path:
    """A pure-Python wheel of PACKAGE, made by hand (no build backend, no network)."""
    info = f"{PACKAGE}-1.0.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": f"WORDS = {WORDS!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(
        f"{name},sha256={digest(text.encode())},{len(text.encode())}\n" for name, text in files.items()
    )
    wheel = directory / f"{PACKAGE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record + f"{info}/RECORD,,\n"}.items():
            archive.writestr(name, text)
    return wheel


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A package index on loopback (PEP 503) offering PACKAGE's wheel: its URL."""
    root = tmp_path_factory.mktemp("index")
    wheel = _wheel(root)
    listing = root / "simple" / PACKAGE
    listing.mkdir(parents=True)
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (listing / "index.html").write_text(f'<a href="../../{wheel.name}#sha256={sha256}">{wheel.name}</a>\n')

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def end_headers(self) -> None:
            self.send_header("Cache-Control", "max-age=600")  # as PyPI's: pip may keep it
            super().end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


async def _bash(live: LiveServer, session: str, command: str) -> pb.ToolResult:
    arguments = json.dumps({"command": command, "timeout_ms": 120_000})
    reply = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=session, tool_name="bash", arguments=arguments)
    )
    return reply.result


async def _in_a_session(
    workspace: Path, data: Path, mechanism: str, network: str, command: str
) -> tuple[pb.ToolResult, Path]:
    """`command` run by bash in a new session of a server under `mechanism` with `network`; its
    result, and the session's HOME."""
    sandbox = SandboxSettings(mechanism=mechanism, network=network)  # type: ignore[arg-type]
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=data, sandbox=sandbox)
    async with running(settings) as live:
        session = await new_session(live)
        return await _bash(live, session, command), data / "homes" / "sessions" / session


def _pip_options(index: str) -> str:
    # One retry (pip says why it retries: the model sees the refusal); a trusted host is cached.
    return (
        f"--disable-pip-version-check --retries 1 --timeout 20 --index-url {index} --trusted-host 127.0.0.1"
    )


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_pip_installs_into_a_workspace_venv_with_the_network_on(
    workspace: Path, tmp_path: Path, index: str, mechanism: str
) -> None:
    venv = f"{sys.executable} -m venv .venv"
    check = f".venv/bin/python -c 'import {PACKAGE} as p; print(p.WORDS)'"
    command = f"{venv} && .venv/bin/pip install {_pip_options(index)} {PACKAGE} && {check}"
    result, home = await _in_a_session(workspace, tmp_path / "data", mechanism, "on", command)
    assert result.success, result.output + result.error
    assert result.output.endswith(f"{WORDS}\n") and result.metadata["sandbox"] == mechanism
    assert (workspace / ".venv" / "bin" / "python").exists()
    assert (home / ".cache" / "pip").is_dir()  # pip's cache: the session's, not the server user's


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_with_the_network_off_pip_is_refused_and_told_why(
    workspace: Path, tmp_path: Path, index: str, mechanism: str
) -> None:
    command = f"{sys.executable} -m pip download --no-deps -d downloaded {_pip_options(index)} {PACKAGE}"
    result, _ = await _in_a_session(workspace, tmp_path / "data", mechanism, "off", command)
    assert not result.success and not (workspace / "downloaded" / f"{PACKAGE}-1.0-py3-none-any.whl").exists()
    assert "sandbox: the network is off for commands" in result.error, result.output + result.error


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_caches_and_dotfiles_land_in_the_sessions_home(
    workspace: Path, tmp_path: Path, mechanism: str
) -> None:
    command = "mkdir -p ~/.cache/x ~/.npm && echo cached > ~/.cache/x/f && echo npm > ~/.npm/f"
    result, home = await _in_a_session(workspace, tmp_path / "data", mechanism, "off", command)
    assert result.success, result.output + result.error
    assert (home / ".cache" / "x" / "f").read_text() == "cached\n"
    assert (home / ".npm" / "f").read_text() == "npm\n"


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed here")
@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_npms_cache_is_the_sessions(workspace: Path, tmp_path: Path, mechanism: str) -> None:
    """A local package packed and added to npm's cache, offline."""
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "package.json").write_text('{"name": "pkg", "version": "1.0.0"}')
    command = "cd pkg && npm pack --silent && npm cache add --offline ./pkg-1.0.0.tgz && npm cache ls"
    result, home = await _in_a_session(workspace, tmp_path / "data", mechanism, "off", command)
    assert result.success, result.output + result.error
    assert (home / ".npm" / "_cacache").is_dir()


@pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo is not installed here")
@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_cargo_builds_with_its_files_in_the_sessions_home(
    workspace: Path, tmp_path: Path, mechanism: str
) -> None:
    """A crate built and run offline; cargo (rustup's, in ~/.cargo/bin) finds its toolchain."""
    (workspace / "src").mkdir()
    (workspace / "Cargo.toml").write_text('[package]\nname = "hello"\nversion = "0.1.0"\nedition = "2021"\n')
    (workspace / "src" / "main.rs").write_text('fn main() { println!("built and ran"); }\n')
    result, home = await _in_a_session(
        workspace, tmp_path / "data", mechanism, "off", "cargo run --offline -q"
    )
    assert result.success and result.output == "built and ran\n", result.output + result.error
    assert (home / ".cargo").is_dir() and (workspace / "target").is_dir()
