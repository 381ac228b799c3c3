"""The README's commands and examples, run as a new user runs them, so the front page cannot go stale.

The set-up section's server command (its last step, `.venv/bin/a3s-agent serve`; the install before
it is tools/newcomer_check.py's, which takes minutes) starts a real server in a fresh workspace, on
free ports, with a fake model in its environment as "Point it at an LLM" says. Every other ```sh
block of the README then runs with bash against it, in that workspace, in order: `set -euo
pipefail`, curl failing on an HTTP error, the README's ports replaced by the server's. A block is
skipped only when a `<!-- not run: why -->` line right above it says why. The LLM section's lines
each start a server of their own, pointed at a fake of the API they name.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_llm import FakeLLM, text
from a3s_agent.testing.ports import free_port

from .conftest import user, wait_serving

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))  # tools/ holds scripts run on their own, not a package
from newcomer_check import SECTION, Block, readme_blocks  # type: ignore[import-not-found]  # noqa: E402

README = REPO / "README.md"
LLM_SECTION = "## Point it at an LLM"
GRPC_PORT, HTTP_PORT = "4088", "4089"  # the defaults the README's examples address
BLOCK_TIMEOUT_S = 120
# curl as the README writes it, but failing on an HTTP error status (the body still shown).
PRELUDE = 'curl() { command curl --fail-with-body --show-error "$@"; }\n'


def _blocks() -> list[Block]:
    return readme_blocks(README.read_text())


@dataclass
class Server:
    proc: subprocess.Popen[str]
    grpc_port: int
    http_port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self) -> int:
        """SIGTERM to the command's process group: the README's server stops gracefully, exit 0."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise


@pytest.fixture
def newcomer(tmp_path: Path) -> Iterator[Path]:
    """A fresh workspace where `.venv` is this test run's virtual environment, as after the README's
    install; XDG_DATA_HOME and the servers' data stay inside tmp_path."""
    if sys.prefix == sys.base_prefix or not (Path(sys.prefix) / "bin" / "activate").exists():
        pytest.skip("the README's commands need the tests to run from a virtual environment (.venv)")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / ".venv").symlink_to(sys.prefix)
    yield workspace


def _environment(workspace: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("A3S_", "OPENAI_"))}
    env["PATH"] = f"{workspace / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_DATA_HOME"] = str(workspace.parent / "xdg")
    return {**env, **extra}


def _start(command: str, workspace: Path, **env: str) -> Server:
    """`bash -c command` in the workspace, on free ports, until it serves."""
    grpc_port, http_port = free_port(), free_port()
    log = workspace.parent / f"serve-{grpc_port}.log"
    environment = _environment(
        workspace,
        LISTEN_ADDR=f"127.0.0.1:{grpc_port}",
        A3S_HTTP_LISTEN=f"127.0.0.1:{http_port}",
        A3S_DATA_DIR=str(workspace.parent / f"data-{grpc_port}"),
        **env,
    )
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=workspace, env=environment, stdout=out, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
    server = Server(proc, grpc_port, http_port, log)
    try:
        wait_serving(server.address, 30, proc)
    except AssertionError:
        server.stop()
        raise AssertionError(
            f"{command!r} did not serve:\n{log.read_text(errors='replace')[-3000:]}"
        ) from None
    return server


def _serve_command() -> str:
    """The set-up section's first block, less the install: what starts the server."""
    (first, _) = [b for b in _blocks() if b.section == SECTION]
    step = first.code.strip().split(" && ")[-1]
    assert step == ".venv/bin/a3s-agent serve", first.code
    return step


def _examples() -> list[Block]:
    return [b for b in _blocks() if b.section not in (SECTION, LLM_SECTION)]


async def _run(block: Block, workspace: Path, server: Server) -> str:
    """The block with bash, off the event loop (the fake model answers on it)."""
    code = block.code.replace(f"localhost:{GRPC_PORT}", f"localhost:{server.grpc_port}")
    code = code.replace(f"localhost:{HTTP_PORT}", f"localhost:{server.http_port}")
    assert not re.search(rf"\b({GRPC_PORT}|{HTTP_PORT})\b", code), f"an address the test cannot move:\n{code}"
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euo", "pipefail", "-c", PRELUDE + code], cwd=workspace, env=_environment(workspace),
        capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"exit {done.returncode}:\n{block.code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _json_rpc_errors(output: str) -> list[object]:
    """The error replies among the JSON-RPC lines a block printed (MCP, ACP)."""
    errors: list[object] = []
    for line in output.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("jsonrpc") == "2.0" and "error" in message:
            errors.append(message)
    return errors


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail into docs/"
    llm = next(n for n, line in enumerate(lines) if line == LLM_SECTION)
    assert llm < 60, f"{LLM_SECTION!r} is at line {llm + 1}, below the first screen"
    assert [b for b in _blocks() if b.not_run == ""] == []


async def test_every_example_runs_against_the_readme_server(newcomer: Path) -> None:
    examples = _examples()
    assert examples, "the README shows no example"
    async with FakeLLM(fallback=text("The workspace holds ops.json and hello.txt.")) as fake:
        server = _start(
            _serve_command(), newcomer, A3S_LLM_BASE_URL=fake.base_url, A3S_LLM_MODEL="fake-model"
        )
        try:
            for block in examples:
                if block.not_run is None:
                    output = await _run(block, newcomer, server)
                    assert _json_rpc_errors(output) == [], f"{block.code}\n{output[-3000:]}"
        finally:
            code = server.stop()
        assert code == 0, server.log.read_text(errors="replace")[-3000:]
    assert fake.requests, "no example asked the model anything"


LLM_KINDS = ("openai-compatible", "anthropic", "local")


def _llm_lines() -> list[str]:
    """The section's server commands: OpenAI-compatible, Anthropic, a local server, in that order."""
    blocks = [b for b in _blocks() if b.section == LLM_SECTION]
    assert len(blocks) == 1, f"expected one ```sh block under {LLM_SECTION!r}, found {len(blocks)}"
    lines = [line for line in blocks[0].code.splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == len(LLM_KINDS), blocks[0].code
    return lines


def _assignments(line: str) -> dict[str, str]:
    """The VAR=value words before the command, and the command: `.venv/bin/a3s-agent serve`."""
    words = shlex.split(line)
    variables = dict(word.split("=", 1) for word in words if re.match(r"[A-Z_][A-Z0-9_]*=", word))
    assert words[len(variables) :] == [".venv/bin/a3s-agent", "serve"], line
    return variables


@pytest.mark.parametrize("kind", LLM_KINDS)
async def test_each_way_to_point_it_at_an_llm_reaches_that_api(newcomer: Path, kind: str) -> None:
    """The line starts a server as written; only the endpoint is a fake of the API it names (the
    local server's URL replaced, a public API's given as A3S_LLM_BASE_URL underneath)."""
    line = _llm_lines()[LLM_KINDS.index(kind)]
    variables = _assignments(line)
    key = variables.get("A3S_LLM_API_KEY") or variables.get("OPENAI_API_KEY")
    anthropic = variables.get("A3S_LLM_PROVIDER") == "anthropic"
    fake: FakeLLM | FakeAnthropic = (
        FakeAnthropic(fallback="hello from the model", api_key=key)
        if anthropic
        else FakeLLM(fallback=text("hello from the model"), api_key=key)
    )
    async with fake:
        local = variables.get("A3S_LLM_BASE_URL")
        if local is not None:
            assert re.fullmatch(r"http://localhost:\d+/v1", local), local
            server = _start(line.replace(local, fake.base_url), newcomer)
        else:
            server = _start(line, newcomer, A3S_LLM_BASE_URL=fake.base_url)
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                session = await stub.CreateSession(pb.CreateSessionRequest(), timeout=30)
                reply = await stub.Generate(
                    pb.GenerateRequest(session_id=session.session_id, messages=[user("hi")]), timeout=60
                )
        finally:
            server.stop()
    assert reply.message.content == "hello from the model"
    assert [r.model for r in fake.requests] == [variables["A3S_LLM_MODEL"]]
