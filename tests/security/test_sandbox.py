"""The OS sandbox, attacked through the real interface: `ExecuteTool(bash)` against `a3s-agent serve`
run in a planted home directory that is also its workspace (the hard case: every secret lies
inside the tree commands may write), with its data dir and token file there too.

Every read of a secret, every write outside the workspace (directly, through a symlink or a hard
link made inside), every connection and every reach for the server's process must fail, and
fail because the kernel refuses it."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent.config import SandboxSettings, Settings
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.tools import sandbox
from a3s_agent.tools.sandbox import bwrap, landlock

from ..conftest import LiveServer, ServerProcess, alive, eventually, running

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(bwrap.problem() is not None, reason=f"bwrap does not work here: {bwrap.problem()}"),
]

TOKEN = "sandbox-test-token"
IN_ETC = Path("/etc/planted-by-sandbox-test")
IN_THE_USERS_HOME = Path("~/planted-by-sandbox-test").expanduser()  # the test's user, not the server's HOME
SECRETS = {
    ".ssh/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY----- planted-ssh-key",
    ".aws/credentials": "[default]\naws_secret_access_key = planted-aws-key",
    ".git-credentials": "https://user:planted-git-token@example.com",
}


class TokenServer(ServerProcess):
    """`a3s-agent serve` behind a token: ready once grpc.health.v1 (which needs none) says so. Its
    output goes to the file `log`, out of its commands' reach (a pipe no one reads would stop a
    long-lived one)."""

    def __init__(self, workspace: Path, data_dir: Path, env: dict[str, str], log: Path) -> None:
        super().__init__(workspace, data_dir, env)
        self.log = log

    def start(self, timeout_s: float = 30.0) -> TokenServer:
        with self.log.open("w") as log:
            proc = subprocess.Popen(
                self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
        self.proc = proc
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                assert proc.poll() is None, self.output()
                try:
                    if health.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == 1:
                        return self
                except grpc.RpcError:
                    time.sleep(0.05)
        raise AssertionError(f"the server at {self.address} did not serve within {timeout_s} s")

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Served:
    def __init__(self, server: ServerProcess, home: Path, outside: Path) -> None:
        self.server = server
        self.home = home
        self.outside = outside
        self.mechanism = server.env["A3S_SANDBOX"]
        self.metadata = (("authorization", f"Bearer {TOKEN}"),)
        self.channel = grpc.aio.insecure_channel(server.address)
        self.stub = pb_grpc.CodeAgentServiceStub(self.channel)

    async def bash(self, command: str, session_id: str = "") -> pb.ToolResult:
        reply = await self.stub.ExecuteTool(
            pb.ExecuteToolRequest(
                session_id=session_id, tool_name="bash", arguments=json.dumps({"command": command})
            ),
            metadata=self.metadata,
        )
        return reply.result


@pytest.fixture(params=["bwrap", "landlock"])
async def served(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """`a3s-agent serve` with HOME a planted home that is its workspace; its data dir (sessions.db)
    and token file in there too; a directory outside everything."""
    home, outside = tmp_path / "home", tmp_path / "outside"
    for relative, secret in SECRETS.items():
        (home / relative).parent.mkdir(parents=True, exist_ok=True)
        (home / relative).write_text(secret)
    outside.mkdir()
    (outside / "file").write_text("outside, not to be changed")
    (home / ".a3s-token").write_text(TOKEN)
    data_dir = home / ".local" / "share" / "a3s-agent" / "data"
    env = {"HOME": str(home), "A3S_AUTH_TOKEN_FILE": str(home / ".a3s-token"), "A3S_SANDBOX": request.param}
    server = TokenServer(home, data_dir, env, tmp_path / "server.log").start()
    served = Served(server, home, outside)
    try:
        yield served
    finally:
        await served.channel.close()
        server.stop()


async def test_secrets_in_the_workspace_are_unreadable_to_commands(served: Served) -> None:
    other = await served.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(workspace="projects/other")), metadata=served.metadata
    )
    (served.home / "projects" / "other" / "notes.txt").write_text("planted other-session secret")
    mine = await served.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(workspace=".")), metadata=served.metadata
    )
    assert other.session_id and mine.session_id
    db = served.server.data_dir / "sessions.db"
    assert db.is_file()
    reads = " ; ".join(
        f"cat {path}"
        for path in [
            *(served.home / relative for relative in SECRETS),
            served.home / ".a3s-token",
            db,
            served.home / "projects" / "other" / "notes.txt",
        ]
    )
    for session_id in ("", mine.session_id):  # a session-less call, and a session's
        result = await served.bash(f"{reads}; ls ~ /; echo done", session_id)
        assert "done" in result.output, result.error
        for secret in [*SECRETS.values(), TOKEN, "planted other-session secret", "SQLite format"]:
            assert secret not in result.output
        assert result.metadata["sandbox"] == served.mechanism and result.metadata["sandbox_network"] == "off"
    (served.home / "src").mkdir()
    own = await served.bash("echo mine > src/mine.txt && cat src/mine.txt")
    assert own.success and own.output == "mine\n"  # the workspace itself is writable
    beside = await served.bash("echo mine > mine.txt && cat mine.txt")  # beside the hidden paths
    if served.mechanism == "bwrap":
        assert beside.success and beside.output == "mine\n"
    else:  # Landlock cannot grant a directory its hidden paths are in (tools/sandbox/landlock.py)
        assert not beside.success and not (served.home / "mine.txt").exists()
        assert (
            f"nothing can be listed, created, removed or renamed directly in {served.home}," in beside.error
        )
        key = served.home / ".ssh" / "id_rsa"
        assert f"sandbox: {key} is hidden from commands" in (await served.bash(f"cat {key}")).error


async def test_writes_outside_the_workspace_are_refused_by_the_kernel(served: Served) -> None:
    outside = served.outside
    attacks = {
        "direct": f"echo x > {outside}/direct",
        "symlink": f"ln -s {outside} link && echo x > link/through-symlink",
        "hard link": f"ln {outside}/file hard && echo x >> hard",
        "/proc/self/root": f"echo x > /proc/self/root{outside}/through-proc",
        "system": f"echo x > {IN_ETC}",
        "home of the server's user": f"echo x > {IN_THE_USERS_HOME}",
    }
    for name, command in attacks.items():
        result = await served.bash(command)
        assert not result.success, name
    assert sorted(p.name for p in outside.iterdir()) == ["file"]
    assert (outside / "file").read_text() == "outside, not to be changed"
    assert not _planted()
    refused = await served.bash(f"echo x > {IN_ETC}")  # a tree it may read: EROFS, and the hint
    assert f"sandbox: writing {IN_ETC} is outside the workspace" in refused.error


def _planted() -> list[Path]:
    return [path for path in (IN_ETC, IN_THE_USERS_HOME) if path.exists()]


@pytest.fixture
def loopback_http() -> Iterator[int]:
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"reached")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    # A connection reset between select() and accept() would block a blocking accept, and with it
    # serve_forever and the shutdown below: with a timeout, accept gives up and the loop goes on.
    server.socket.settimeout(1.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


async def test_the_network_is_off_loopback_and_the_servers_own_ports_included(
    served: Served, loopback_http: int
) -> None:
    fetch = f"{sys.executable} -I -S -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{{}}').read())\""
    for port in (loopback_http, served.server.port, served.server.http_port):
        result = await served.bash(fetch.format(port))
        assert not result.success and "reached" not in result.output
        assert "sandbox: the network is off for commands" in result.error
    # Reachable from outside the sandbox all along.
    done = subprocess.run(
        [sys.executable, "-c", fetch.format(loopback_http).split(" -c ", 1)[1].strip('"')],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert "reached" in done.stdout


async def test_the_server_is_out_of_reach_of_its_commands(served: Served) -> None:
    pid = served.server.proc.pid  # type: ignore[union-attr]
    result = await served.bash(
        f"cat /proc/{pid}/cmdline; cat /proc/1/environ; kill -9 $PPID; kill -9 {pid}; echo alive"
    )
    # Not its environment (which holds A3S_SANDBOX, tools' does not); under bwrap not even its
    # command line. Landlock has no PID namespace: every process's cmdline stays readable.
    assert "A3S_SANDBOX" not in result.output
    assert ("--listen" in result.output) == (served.mechanism == "landlock")
    assert "alive" in result.output and alive(pid)
    health = await served.stub.HealthCheck(pb.HealthCheckRequest(), metadata=served.metadata)
    assert health.status == pb.HealthCheckResponse.STATUS_HEALTHY


async def test_health_and_capabilities_show_the_sandbox(served: Served) -> None:
    health = await served.stub.HealthCheck(pb.HealthCheckRequest(), metadata=served.metadata)
    assert health.details["sandbox"] == served.mechanism and health.details["sandbox_network"] == "off"
    capabilities = await served.stub.GetCapabilities(pb.GetCapabilitiesRequest(), metadata=served.metadata)
    assert "sandbox" in capabilities.features and capabilities.metadata["sandbox"] == served.mechanism


async def test_initialize_may_narrow_the_network_never_widen_it(served: Served) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Initialize(
            pb.InitializeRequest(config=pb.AgentConfig(custom={"sandbox_network": "on"})),
            metadata=served.metadata,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.custom.sandbox_network" in (err.value.details() or "")
    await served.stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(custom={"sandbox_network": "off"})),
        metadata=served.metadata,
    )


# --- fail closed, and the operator's opt-out --------------------------------------------------------


@pytest.fixture
async def no_mechanism(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[LiveServer]:
    """A server on a machine where neither bwrap nor Landlock works (as in a container whose seccomp
    profile refuses user namespaces, on a kernel without Landlock)."""
    monkeypatch.setattr(
        sandbox, "_choose", lambda requested: ("", "bwrap: user namespaces are off; landlock: none")
    )
    async with running(
        Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data")
    ) as live:
        yield live


async def test_without_a_working_sandbox_every_process_is_refused(
    no_mechanism: LiveServer, workspace: Path
) -> None:
    for tool, arguments in (
        ("bash", {"command": "touch ran"}),
        ("run_script", {"code": "open('ran', 'w')", "language": "python"}),
        ("grep", {"pattern": "x"}),
        ("git_status", {}),
    ):
        reply = await no_mechanism.stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name=tool, arguments=json.dumps(arguments))
        )
        assert not reply.result.success, tool
        assert "sandbox: no sandbox works here (bwrap: user namespaces are off" in reply.result.error, tool
        assert "--sandbox off" in reply.result.error
    assert not (workspace / "ran").exists()
    health = await no_mechanism.stub.HealthCheck(pb.HealthCheckRequest())
    assert (
        health.details["sandbox"] == "unavailable" and "user namespaces" in health.details["sandbox_problem"]
    )


async def test_sandbox_off_runs_unsandboxed_and_says_so(
    workspace: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        listen="127.0.0.1:0",
        workspace=workspace,
        data_dir=tmp_path / "data",
        sandbox=SandboxSettings(mechanism="off"),
    )
    with caplog.at_level("WARNING"):
        async with running(settings) as live:
            reply = await live.stub.ExecuteTool(
                pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": "echo $HOME"}))
            )
            health = await live.stub.HealthCheck(pb.HealthCheckRequest())
    assert reply.result.success and reply.result.metadata["sandbox"] == "off"
    assert health.details["sandbox"] == "off"
    assert any("UNSANDBOXED" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


async def test_landlock_without_the_signal_scope_says_so(
    workspace: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a kernel before Linux 6.12 (Landlock ABI < 6) a command can signal the server: the start
    log, HealthCheck and GetCapabilities say so."""
    monkeypatch.setattr(landlock, "abi", lambda: 5)
    settings = Settings(
        listen="127.0.0.1:0",
        workspace=workspace,
        data_dir=tmp_path / "data",
        sandbox=SandboxSettings(mechanism="landlock"),
    )
    with caplog.at_level("WARNING"):
        async with running(settings) as live:
            health = await live.stub.HealthCheck(pb.HealthCheckRequest())
            capabilities = await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    said = "Landlock ABI is 5, without the signal scope of ABI 6 (Linux 6.12)"
    assert said in health.details["sandbox_weakness"] and said in capabilities.metadata["sandbox_weakness"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("the sandbox is weaker here" in message and said in message for message in warned)


async def test_a_session_keeps_its_home_until_it_is_destroyed(served: Served) -> None:
    created = await served.stub.CreateSession(pb.CreateSessionRequest(), metadata=served.metadata)
    home = served.server.data_dir / "homes" / "sessions" / created.session_id
    made = await served.bash("mkdir -p ~/.cache && echo kept > ~/.cache/x && echo $HOME", created.session_id)
    assert made.output.strip() == str(home)
    again = await served.bash("cat ~/.cache/x", created.session_id)
    assert again.output == "kept\n"  # a later call of the session finds it
    await served.stub.DestroySession(
        pb.DestroySessionRequest(session_id=created.session_id), metadata=served.metadata
    )
    await eventually(lambda: not home.exists(), "the destroyed session's HOME is removed")


async def test_a_concurrent_bash_call_sees_its_own_scratch_directory(served: Served) -> None:
    first, second = await asyncio.gather(served.bash("echo $TMPDIR"), served.bash("echo $TMPDIR"))
    assert first.output != second.output and "/scratch/" in first.output
