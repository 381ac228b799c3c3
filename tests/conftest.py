"""Shared fixtures: an in-process server on port 0 with a real client (against the real-HTTP fake LLM
or the in-process scripted model), a subprocess server, and `eventually`, the one polling helper."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self, TypeVar, overload

import grpc
import pytest

from a3s_agent.app import Application
from a3s_agent.config import SandboxSettings, Settings
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.runtime import Runtime
from a3s_agent.runtime.cron.clock import Clock
from a3s_agent.runtime.providers import ProviderFactory
from a3s_agent.server import AgentServer
from a3s_agent.testing.fake_llm import FakeLLM
from a3s_agent.testing.ports import free_port
from a3s_agent.tools import sandbox
from a3s_agent.tools.builtin import builtin_registry
from a3s_agent.tools.registry import ToolRegistry

from .scripted_model import ScriptedProvider

pytest_plugins = ["tests.postgres"]  # a real PostgreSQL server: postgres_server, postgres_url

T = TypeVar("T")
WITHIN_S = 10.0


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]], what: str = ..., within_s: float = ...
) -> T: ...
@overload
async def eventually(check: Callable[[], T | None], what: str = ..., within_s: float = ...) -> T: ...
async def eventually(
    check: Callable[[], T | Awaitable[T | None] | None],
    what: str = "the condition",
    within_s: float = WITHIN_S,
) -> T:
    """Poll `check` (sync or async) until it returns something true, and return that; fail naming
    `what` after `within_s`. The one way tests wait for something to happen: no sleep-then-assert."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"not within {within_s:g} s: {what}")
        await asyncio.sleep(0.02)


@pytest.fixture(autouse=True)
def sandbox_of_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A3S_SANDBOX=bwrap|landlock in the environment of a test run picks the mechanism of every
    server the tests start, in this process too (whose Settings say auto): the suites run under
    either mechanism."""
    wanted = os.environ.get("A3S_SANDBOX", "").strip().lower()
    if wanted not in ("bwrap", "landlock"):
        return
    choose = sandbox._choose
    monkeypatch.setattr(
        sandbox, "_choose", lambda requested: choose(wanted if requested == "auto" else requested)
    )


@dataclass
class LiveServer:
    runtime: Runtime
    server: AgentServer
    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.CodeAgentServiceStub
    workspace: Path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@asynccontextmanager
async def running(
    settings: Settings,
    connect: ProviderFactory | None = None,
    registry: ToolRegistry | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[LiveServer]:
    """The real server in this process on a free port, and a real client channel to it; `connect`
    replaces the HTTP provider (e.g. with `ScriptedProvider.connect`), `registry` the built-in tools,
    `clock` the cron scheduler's."""
    runtime = Runtime(settings, registry=registry or builtin_registry(), connect=connect, clock=clock)
    server = AgentServer(Application(runtime))
    port = server.bind("127.0.0.1:0")
    await runtime.start()
    await server.start()
    address = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(address)
    try:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        yield LiveServer(runtime, server, address, channel, stub, settings.workspace)
    finally:
        await channel.close()
        await server.stop(0)
        await runtime.close()


@pytest.fixture
async def live(workspace: Path, tmp_path: Path) -> AsyncIterator[LiveServer]:
    async with running(
        Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data")
    ) as server:
        yield server


async def subscribed(server: LiveServer, count: int = 1) -> None:
    """Wait until `count` event subscriptions are in place (before publishing what they must see)."""
    await eventually(
        lambda: server.runtime.events.subscriber_count >= count, f"{count} event subscription(s) in place"
    )


_FRESH_SERVER_PRELUDE = """
import asyncio
from pathlib import Path

import grpc

from a3s_agent import server
from a3s_agent.config import Settings
from a3s_agent.proto import code_agent_pb2 as pb


def serve():
    settings = Settings(
        listen="127.0.0.1:{port}", http_listen="127.0.0.1:{http_port}",
        workspace=Path({workspace!r}), data_dir=Path({data!r}),
    )
    return asyncio.create_task(server.run(settings))


async def until_serving(stub):
    while True:
        try:
            if (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=0.5)).status == 1:
                return
        except grpc.RpcError:
            await asyncio.sleep(0.05)
"""


def run_fresh_server(
    script: str, tmp_path: Path, env: dict[str, str], timeout_s: float, **fields: object
) -> tuple[dict[str, Any], str]:
    """Run `script` in a fresh interpreter (one that has imported and loaded nothing yet), after a
    prelude giving it `serve()` (the server's own `run` as a task, on {port} and {http_port}, in
    {workspace} with {data}) and `until_serving(stub)`. The script prints a JSON report as its last
    line; returns the report and the script's stderr."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    child = (_FRESH_SERVER_PRELUDE + script).format(
        port=free_port(),
        http_port=free_port(),
        workspace=str(workspace),
        data=str(tmp_path / "data"),
        **fields,
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


class ServerProcess:
    """`a3s-agent serve` as a subprocess, as A3S Box would run it."""

    def __init__(self, workspace: Path, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.workspace = workspace
        self.data_dir = data_dir
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.http_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "a3s_agent", "serve",
            "--listen", self.address,
            "--http-listen", f"127.0.0.1:{self.http_port}",
            "--workspace", str(self.workspace),
            "--data-dir", str(self.data_dir),
        ]  # fmt: skip

    def start(self, timeout_s: float = 15.0) -> Self:
        self.proc = subprocess.Popen(
            self.command(), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        token = self.env.get("A3S_AUTH_TOKEN", "")
        wait_serving(
            self.address, timeout_s, self.proc, [("authorization", f"Bearer {token}")] if token else []
        )
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)

    def output(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.read()

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)


def wait_serving(
    address: str,
    timeout_s: float,
    proc: subprocess.Popen[str] | None = None,
    metadata: list[tuple[str, str]] | None = None,
) -> None:
    """Block until HealthCheck (with `metadata`: a server's token) answers HEALTHY, failing early
    if the process died."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"server exited early: {proc.stdout.read() if proc.stdout else ''}")
            try:
                reply = stub.HealthCheck(pb.HealthCheckRequest(), timeout=0.5, metadata=metadata)
                if reply.status == pb.HealthCheckResponse.STATUS_HEALTHY:
                    return
            except grpc.RpcError:
                time.sleep(0.05)
    raise AssertionError(f"server at {address} did not become healthy in {timeout_s}s")


@pytest.fixture
def unsandboxed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tools called outside a server run their processes unsandboxed, as with --sandbox off."""
    monkeypatch.setattr(sandbox, "_default", sandbox.Sandbox(SandboxSettings(mechanism="off")))


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[ServerProcess]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = ServerProcess(workspace, tmp_path / "data")
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


# --- the agent against the fake LLM -------------------------------------------------------


def user(content: str) -> pb.Message:
    return pb.Message(role=pb.Message.ROLE_USER, content=content)


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def agent_settings(workspace: Path, data: Path) -> Settings:
    return Settings(
        listen="127.0.0.1:0", workspace=workspace, data_dir=data, llm_timeout_s=1.0, llm_retries=2
    )


@pytest.fixture
async def agent(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[LiveServer]:
    """A server whose Initialize points at the fake LLM."""
    async with running(agent_settings(workspace, tmp_path / "data")) as server:
        await initialize(server, fake)
        yield server


async def initialize(server: LiveServer, fake: FakeLLM | None = None) -> None:
    """Initialize with the fake model: at the fake server's URL, or (None) the scripted model's."""
    base_url = fake.base_url if fake is not None else ""
    await server.stub.Initialize(
        pb.InitializeRequest(
            config=pb.AgentConfig(llm=pb.LLMConfig(provider="openai", model="fake-model", base_url=base_url))
        )
    )


@pytest.fixture
def scripted() -> ScriptedProvider:
    """The in-process scripted model: script turns, read `requests` (see tests/scripted_model.py)."""
    return ScriptedProvider()


@pytest.fixture
async def scripted_agent(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> AsyncIterator[LiveServer]:
    """A server whose model is the scripted one, in process: loop, context and control tests need no HTTP."""
    async with running(agent_settings(workspace, tmp_path / "data"), connect=scripted.connect) as server:
        await initialize(server)
        yield server


async def new_session(server: LiveServer, **config: Any) -> str:
    reply = await server.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(**config)))
    return reply.session_id


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return False
    return state != "Z"


MCP_FIXTURE = Path(__file__).with_name("mcp_fixture.py")


def fixture_readable(settings: Settings, tmp_path: Path) -> Settings:
    """As an operator running MCP servers of their own would: the sandbox lets them read the MCP
    fixture's script (tests/mcp_fixture.py) and write its log (tmp_path/fixture.log, beside the
    workspace). The log is made here: tmp_path holds the hidden data dir, and under Landlock nothing
    can be made directly in a directory on the way to a hidden path (tools/sandbox/landlock.py)."""
    (tmp_path / "fixture.log").touch()
    sandbox = SandboxSettings(read=(MCP_FIXTURE.parent,), write=(tmp_path.resolve(),))
    return replace(settings, sandbox=sandbox)


def host_pid(pid: int, ancestor: int | None = None) -> int:
    """The pid on this machine of a running process that a sandboxed command knows as `pid` (its `$$`
    in the sandbox's PID namespace), looked for among the descendants of `ancestor` (default: this
    process); `pid` itself when there is none (a command run without a PID namespace)."""
    ancestor = os.getpid() if ancestor is None else ancestor
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        ids = fields.get("NSpid", "").split()
        if len(ids) > 1 and int(ids[-1]) == pid and _descends(int(ids[0]), ancestor):
            return int(ids[0])
    return pid


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if pid == ancestor:
            return True
    return False


def unique_sleep(seconds: int = 30) -> str:
    """`sleep N.XXXXXX`: a command line no other process has, for `running_with` to find."""
    return f"sleep {seconds}.{secrets.randbelow(10**6):06d}"


def running_with(command: str) -> list[int]:
    """The processes (not zombies) whose command line is `command`: wherever a tool call's process
    went, whatever PID namespace it is in."""
    wanted = command.split()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().split(b"\0")[:-1] == [w.encode() for w in wanted] and alive(
                int(cmdline.parent.name)
            ):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found
