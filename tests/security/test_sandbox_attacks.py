"""The sandbox attacked through every way the server starts a process, under each mechanism.

One `a3s-agent serve` per mechanism (bwrap, landlock), run as A3S Box would: a planted HOME with
credentials, a token file, a data dir, a second session with a workspace of its own, an MCP server
from --mcp-config, a skill with a script from --skills-dir, an Initialize pointing at a fake model.
Each attack is a shell command given to it through `ExecuteTool(bash)`, a model's bash call, a
`run_script`, the skill's script, an Agent Spaces `shell` operation over HTTP and the MCP server's
tool; whatever it prints comes back, and nothing it was after may be in there, nor anywhere else.
"""

from __future__ import annotations

import json
import secrets
import shlex
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from ..conftest import alive, running_with, unique_sleep
from .sandboxes import MECHANISMS
from .test_sandbox import TokenServer

pytestmark = [pytest.mark.security]

TOKEN = f"attack-token-{secrets.token_hex(8)}"
CANARY = f"canary-{secrets.token_hex(8)}"  # in the server's environment only
SECRETS = {
    ".ssh/id_rsa": f"-----BEGIN OPENSSH PRIVATE KEY----- ssh-{secrets.token_hex(8)}",
    ".aws/credentials": f"[default]\naws_secret_access_key = aws-{secrets.token_hex(8)}",
}
THEIRS = f"the other session's notes {secrets.token_hex(8)}"
OUTSIDE = "outside, not to be changed"
MEMORY_MIB = 512
PROCESSES = 300
BOMB = 2000  # the fork bomb stops here on its own, whatever holds it back
PYTHON = sys.executable
HERE = Path(__file__).parent
SKILL = """---
name: attacker
description: Runs the shell command it is given.
tools:
  - name: attack
    description: Run a shell command.
    parameters:
      type: object
      properties:
        command: {type: string}
      required: [command]
    timeout_ms: 120000
    script: |
      #!/bin/sh
      eval "$TOOL_ARG_COMMAND"
---
Run what you are given.
"""


class Listeners:
    """What a command must not reach: a loopback HTTP server, a Unix socket and an abstract one, a
    UDP port; each answers (or records) anything that gets through."""

    def __init__(self, directory: Path) -> None:
        self.unix_path = str(directory / "listener.sock")
        self.abstract = f"\0a3s-attack-{secrets.token_hex(6)}"
        self.received: list[bytes] = []
        self._sockets = []
        for family, kind, address in (
            (socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)),
            (socket.AF_UNIX, socket.SOCK_STREAM, self.unix_path),
            (socket.AF_UNIX, socket.SOCK_STREAM, self.abstract),
            (socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)),
        ):
            listener = socket.socket(family, kind)
            listener.bind(address)
            if kind == socket.SOCK_STREAM:
                listener.listen()
            self._sockets.append(listener)
        self.tcp_port = self._sockets[0].getsockname()[1]
        self.udp_port = self._sockets[3].getsockname()[1]
        for listener in self._sockets[:3]:
            threading.Thread(target=self._answer, args=(listener,), daemon=True).start()
        threading.Thread(target=self._record, daemon=True).start()

    def _answer(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.sendall(b"HTTP/1.0 200 OK\r\n\r\nREACHED")

    def _record(self) -> None:
        while True:
            try:
                self.received.append(self._sockets[3].recv(100))
            except OSError:
                return

    def close(self) -> None:
        for listener in self._sockets:
            listener.close()


@dataclass
class Target:
    """A server to attack, and what it guards."""

    mechanism: str
    server: TokenServer
    stub: pb_grpc.CodeAgentServiceStub
    fake: FakeLLM
    home: Path
    token_file: Path
    theirs: Path
    outside: Path
    listeners: Listeners
    session: str
    space: str
    their_session: str

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKEN}"),)

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def tool(self, name: str, arguments: dict[str, object]) -> str:
        reply = self.stub.ExecuteTool(
            pb.ExecuteToolRequest(session_id=self.session, tool_name=name, arguments=json.dumps(arguments)),
            metadata=self.metadata,
            timeout=300,
        )
        return f"{reply.result.output}\n{reply.result.error}"

    def http(self, method: str, path: str, body: object | None = None) -> dict[str, object]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.server.http_port}{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as reply:
            answer: dict[str, object] = json.loads(reply.read())
            return answer

    def healthy(self) -> bool:
        reply = self.stub.HealthCheck(pb.HealthCheckRequest(), metadata=self.metadata, timeout=30)
        return alive(self.pid) and reply.status == pb.HealthCheckResponse.STATUS_HEALTHY


# --- the ways in ----------------------------------------------------------------------------------


def via_bash(target: Target, command: str) -> str:
    return target.tool("bash", {"command": command})


def via_run_script(target: Target, command: str) -> str:
    return target.tool("run_script", {"language": "sh", "code": command})


def via_model(target: Target, command: str) -> str:
    target.fake.script(tool_call("bash", {"command": command}), text("done"))
    reply = target.stub.Generate(
        pb.GenerateRequest(
            session_id=target.session,
            messages=[pb.Message(role=pb.Message.ROLE_USER, content="go")],
        ),
        metadata=target.metadata,
        timeout=300,
    )
    [call] = reply.tool_calls
    return f"{call.result.output}\n{call.result.error}"


def via_skill(target: Target, command: str) -> str:
    return target.tool("attack", {"command": command})


def via_spaces(target: Target, command: str) -> str:
    operations = {"protocolVersion": "1.0", "operations": [{"type": "shell", "id": "a", "command": command}]}
    reply = target.http("POST", f"/v1/spaces/{target.space}/runs", operations)
    events = reply["events"]
    assert isinstance(events, list)
    fields = ("stdout", "stderr", "message", "error")  # not "command", which repeats what was asked
    return "\n".join(str(event.get(field, "")) for event in events for field in fields)


def via_mcp(target: Target, command: str) -> str:
    return target.tool("mcp__attacker__shell", {"command": command})


def via_bomber(target: Target, command: str) -> str:
    """The same MCP server under another name: what it leaves running spoils no other test."""
    return target.tool("mcp__bomber__shell", {"command": command})


Route = Callable[[Target, str], str]
ROUTES: dict[str, Route] = {
    "bash": via_bash,
    "model": via_model,
    "run_script": via_run_script,
    "skill": via_skill,
    "spaces": via_spaces,
    "mcp": via_mcp,
}


@pytest.fixture(params=list(ROUTES))
def route(request: pytest.FixtureRequest) -> Route:
    return ROUTES[request.param]


@pytest.fixture(scope="module", params=MECHANISMS)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    root = tmp_path_factory.mktemp(f"attack-{request.param}")
    home, workspace, outside, skills = root / "home", root / "workspace", root / "outside", root / "skills"
    for relative, secret in SECRETS.items():
        (home / relative).parent.mkdir(parents=True, exist_ok=True)
        (home / relative).write_text(secret)
    token_file = home / ".a3s-token"
    token_file.write_text(TOKEN)
    for directory in (workspace / "mine", workspace / "theirs", outside, skills / "attacker"):
        directory.mkdir(parents=True)
    (outside / "file").write_text(OUTSIDE)
    (workspace / "theirs" / "notes.txt").write_text(THEIRS)
    (skills / "attacker" / "SKILL.md").write_text(SKILL)
    attacker = {"command": PYTHON, "args": [str(HERE / "attacker_mcp.py")]}
    (root / "mcp.json").write_text(json.dumps({"mcpServers": {"attacker": attacker, "bomber": attacker}}))
    env = {
        "HOME": str(home),
        "A3S_AUTH_TOKEN_FILE": str(token_file),
        "A3S_SANDBOX": request.param,
        "A3S_SANDBOX_READ": str(HERE),  # the MCP server's script, as an operator would allow it
        "A3S_SANDBOX_MEMORY": f"{MEMORY_MIB}M",
        "A3S_SANDBOX_PROCESSES": str(PROCESSES),
        "A3S_MCP_CONFIG": str(root / "mcp.json"),
        "A3S_SKILL_DIRS": str(skills),
        "A3S_ATTACK_CANARY": CANARY,
    }
    listeners = Listeners(root)
    fake = FakeLLM().start_in_thread()
    server = TokenServer(workspace, root / "data", env, root / "server.log").start()
    channel = grpc.insecure_channel(server.address)
    try:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(
                    llm=pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url)
                )
            ),
            metadata=metadata,
        )
        sessions = [
            stub.CreateSession(
                pb.CreateSessionRequest(config=pb.SessionConfig(workspace=name)), metadata=metadata
            ).session_id
            for name in ("theirs", "mine")
        ]
        loaded = stub.LoadSkill(
            pb.LoadSkillRequest(session_id=sessions[1], skill_name="attacker"), metadata=metadata
        )
        assert loaded.success, loaded
        target = Target(
            request.param, server, stub, fake, home, token_file, workspace / "theirs", outside, listeners,
            sessions[1], "", sessions[0],
        )  # fmt: skip
        space = target.http("POST", "/v1/spaces", {"sessionId": sessions[1], "policy": "permissive"})
        target.space = str(space["spaceId"])
        assert "ran" in via_mcp(target, "echo ran")  # the MCP server runs (its start is slow)
        yield target
    finally:
        channel.close()
        server.stop()
        fake.stop_in_thread()
        listeners.close()


def python(code: str) -> str:
    """A shell command running `code` with this interpreter (which every sandbox lets run)."""
    return f"{PYTHON} -I -c {shlex.quote(code)}"


# --- files ------------------------------------------------------------------------------------------


def test_secrets_and_the_servers_files_are_unreadable(target: Target, route: Route) -> None:
    data = target.server.data_dir
    targets = [
        *(target.home / relative for relative in SECRETS),
        target.token_file,
        data / "sessions.db",
        target.theirs / "notes.txt",
    ]
    reads = [f"cat {path}" for path in targets]
    reads += [f"cat /proc/self/root{path}" for path in targets]  # the same files by another road
    reads += [f"cat /proc/{target.pid}/root{targets[0]}", f"cat /proc/{target.pid}/cwd/../data/sessions.db"]
    reads += [f"ln -s {target.home}/.ssh soft && cat soft/id_rsa", f"ln {targets[0]} hard && cat hard"]
    reads += [f"ls -a {d} | sed 's/^/listed: /'" for d in (target.home / ".ssh", data, target.theirs)]
    output = route(target, "; ".join(reads) + "; rm -f soft hard; echo attempted")
    assert "attempted" in output  # the command ran: the sandbox refused it, not something else
    listed = [f"listed: {name}" for name in ("id_rsa", "sessions.db", "notes.txt")]
    for secret in [*SECRETS.values(), TOKEN, THEIRS, "SQLite format", *listed]:
        assert secret not in output, output


def test_nothing_outside_the_workspace_can_be_written(target: Target, route: Route) -> None:
    outside, etc = target.outside, Path(f"/etc/a3s-attack-{secrets.token_hex(4)}")
    data, home = target.server.data_dir, target.home
    writes = [
        f"echo x > {outside}/direct",
        f"ln -s {outside} soft && echo x > soft/through-symlink",
        f"ln {outside}/file hard && echo x >> hard",
        f"echo x > /proc/self/root{outside}/through-proc",
        f"echo x > /proc/{target.pid}/root{outside}/through-the-servers-root",
        f"mv {outside}/file taken",
        f"echo x >> {home}/.bashrc",
        f"echo x >> {home}/.ssh/authorized_keys",
        f"echo x > {data}/planted",
        f"echo x > {target.theirs}/planted",
        f"echo x > {etc}",
    ]
    try:
        output = route(target, "; ".join(writes) + "; rm -f soft hard taken; echo attempted")
        assert "attempted" in output
        assert sorted(p.name for p in outside.iterdir()) == ["file"]
        assert (outside / "file").read_text() == OUTSIDE
        for planted in (home / ".bashrc", home / ".ssh" / "authorized_keys", data / "planted", etc):
            assert not planted.exists(), planted
        assert not (target.theirs / "planted").exists()
    finally:
        etc.unlink(missing_ok=True)


# --- the network -----------------------------------------------------------------------------------

CONNECT = """
import socket, sys
def attempt(name, family, kind, address):
    try:
        s = socket.socket(family, kind)
        s.settimeout(10)
        if kind == socket.SOCK_DGRAM:
            s.sendto(b"DATAGRAM", address)
        else:
            s.connect(address)
            print(name, "answered", s.recv(100))
        print(name, "CONNECTED")
    except OSError as e:
        print(name, "refused:", e)
for name, port in zip(["loopback", "grpc", "http"], map(int, sys.argv[1:4])):
    attempt(name, socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", port))
attempt("unix", socket.AF_UNIX, socket.SOCK_STREAM, sys.argv[4])
attempt("abstract", socket.AF_UNIX, socket.SOCK_STREAM, "\\0" + sys.argv[5])
attempt("udp", socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", int(sys.argv[6])))
"""


def test_no_connection_reaches_loopback_the_server_or_a_socket_outside(target: Target, route: Route) -> None:
    listeners = target.listeners
    ports = [listeners.tcp_port, target.server.port, target.server.http_port]
    arguments = [*map(str, ports), listeners.unix_path, listeners.abstract[1:], str(listeners.udp_port)]
    output = route(target, f"{python(CONNECT)} {shlex.join(arguments)}")
    assert output.count("refused:") == 6, output
    assert "CONNECTED" not in output and "REACHED" not in output
    assert listeners.received == []


# --- the server's process --------------------------------------------------------------------------

PTRACE = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); print('ptrace', libc.ptrace(16, {pid}, 0, 0))"
)


def test_the_server_cannot_be_signalled_traced_or_read(target: Target, route: Route) -> None:
    pid = target.pid
    attacks = [
        f"cat /proc/{pid}/environ /proc/1/environ /proc/$PPID/environ",
        f"cat /proc/{pid}/maps | head -3",
        f"ls -l /proc/{pid}/fd | head -5",
        f"timeout 10 strace -p {pid} -e trace=none -o /dev/null",
        f"timeout 20 gdb -p {pid} -batch -ex 'info proc'",
        python(PTRACE.format(pid=pid)),
        f"kill -9 {pid}",
        "echo attempted",
        "kill -9 $PPID",  # last: from the MCP server's shell this is the MCP server
    ]
    output = route(target, "; ".join(attacks))
    assert CANARY not in output
    assert "attached" not in output and "cmdline =" not in output and "ptrace 0" not in output
    assert "socket:[" not in output and "/lib" not in output  # its descriptors, its memory map
    assert target.healthy()


def test_what_a_command_sees_of_its_parent(target: Target) -> None:
    """bwrap: the command's parent is the sandbox's own init (bwrap), nothing of the server.
    Landlock has no PID namespace: the parent is the server, whose command line (like every
    process's on the machine) stays readable; its environment, memory and descriptors do not."""
    output = via_bash(target, "cat /proc/$PPID/cmdline | tr '\\0' ' '; echo; cat /proc/$PPID/environ")
    assert CANARY not in output
    if target.mechanism == "bwrap":
        assert "--listen" not in output and "bwrap" in output
    else:
        assert f"--listen {target.server.address}" in output
        assert f"/proc/{target.pid}/environ: Permission denied" in output


def test_another_sessions_command_is_out_of_reach(target: Target) -> None:
    """bwrap: another session's command is not even visible. Landlock has no PID namespace: its
    command line is readable (as every process's on the machine); its environment is not (another
    Landlock domain), and it can be neither signalled (signal scoping) nor traced (seccomp)."""
    sleeper, secret = unique_sleep(300), f"their-secret-{secrets.token_hex(6)}"
    arguments = json.dumps({"command": f"THEIR_SECRET={secret} exec {sleeper}"})
    request = pb.ExecuteToolRequest(session_id=target.their_session, tool_name="bash", arguments=arguments)
    theirs = target.stub.ExecuteTool.future(request, metadata=target.metadata, timeout=300)
    try:
        deadline = time.monotonic() + 60
        while not (pids := running_with(sleeper)) and time.monotonic() < deadline and not theirs.done():
            time.sleep(0.05)
        [pid] = pids
        attacks = [
            f"tr '\\0' ' ' < /proc/{pid}/cmdline",
            f"cat /proc/{pid}/environ",
            f"kill -9 {pid}",
            python(PTRACE.format(pid=pid)),
            "echo attempted",
        ]
        output = via_bash(target, "; ".join(attacks))
        assert "attempted" in output and secret not in output and "ptrace 0" not in output
        assert running_with(sleeper) == [pid]
        if target.mechanism == "bwrap":
            assert sleeper not in output and f"/proc/{pid}/cmdline: No such file or directory" in output
        else:
            assert sleeper in output and f"/proc/{pid}/environ: Permission denied" in output
            assert f"kill: ({pid}) - Operation not permitted" in output
    finally:
        theirs.cancel()
    deadline = time.monotonic() + 60  # their call ends with its client's hang-up
    while running_with(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_with(sleeper) == []


# --- namespaces and mounts -------------------------------------------------------------------------


def test_no_namespace_or_mount_tricks(target: Target, route: Route) -> None:
    tricks = [
        "unshare -Ur id",
        "unshare -m true",
        "unshare -n true",
        "mkdir -p mnt && mount -t tmpfs none mnt",
        "mount --bind / mnt",
        f"nsenter -t {target.pid} -m -p true",
        "chroot / true",
        python("import os; os.setuid(1)"),
    ]
    script = "; ".join(f"{trick} >/dev/null 2>&1 && echo ESCAPED {n}" for n, trick in enumerate(tricks))
    output = route(target, f"{script}; echo attempted")
    assert "attempted" in output and "ESCAPED" not in output


# --- limits ---------------------------------------------------------------------------------------

FORK_BOMB = f"""
import os, signal
forked, why = 0, "it stopped at {BOMB}"
while forked < {BOMB}:
    try:
        pid = os.fork()
    except OSError as e:
        why = e.strerror
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    forked += 1
print("forked", forked, why, flush=True)
"""


def forked(output: str) -> int:
    assert "forked " in output, output
    return int(output.split("forked ", 1)[1].split()[0])


@pytest.mark.parametrize("route_name", [name for name in ROUTES if name != "mcp"])
def test_a_fork_bomb_stops_at_the_process_limit(target: Target, route_name: str) -> None:
    route = ROUTES[route_name]
    assert 0 < forked(route(target, python(FORK_BOMB))) < PROCESSES
    assert target.healthy()
    assert "Traceback" not in target.server.output()  # its children's end floods no log
    assert "ran" in route(target, "echo ran")  # the next call runs: nothing of the bomb is left


def test_an_mcp_servers_processes_stay_within_one_limit_for_its_life(target: Target) -> None:
    """An MCP server is not a call: it and all it starts share one cgroup, the process limit, for as
    long as it runs (they die with it). A fork bomb through one (here a server of its own, which
    leaves what the bomb forked running, as a hostile one would) stops at the limit, the next one
    finds what the first left still counted, and the other tools and servers are not starved."""
    first = forked(via_bomber(target, python(FORK_BOMB)))
    assert 0 < first < PROCESSES
    second = via_bomber(target, python(FORK_BOMB))
    assert first + (forked(second) if "forked " in second else 0) < PROCESSES, second
    assert "forked" in second or "Resource temporarily unavailable" in second, second
    assert target.healthy()
    assert "Traceback" not in target.server.output()
    assert "ran" in via_bash(target, "echo ran") and "ran" in via_mcp(target, "echo ran")


HOG = """
chunks = []
try:
    while len(chunks) < 64:  # 4 GiB at most
        chunks.append(b"x" * (64 << 20))
except MemoryError:
    pass
print("allocated", len(chunks) * 64, "MiB", flush=True)
"""


def test_a_memory_hog_stops_at_the_memory_limit(target: Target, route: Route) -> None:
    output = route(target, python(HOG))
    allocated = int(output.split("allocated ", 1)[1].split()[0])
    assert allocated < MEMORY_MIB, output
    assert target.healthy()


@pytest.mark.parametrize("route_name", [name for name in ROUTES if name != "mcp"])
def test_detached_processes_die_with_the_call(target: Target, route_name: str) -> None:
    """(Not the MCP server's: its processes live as long as it does.)"""
    detached, double, nohup = unique_sleep(300), unique_sleep(300), unique_sleep(300)
    command = f"setsid -f {detached}; ( ( {double} & ) & ); nohup {nohup} >/dev/null 2>&1 & echo started"
    assert "started" in ROUTES[route_name](target, command)
    for sleeper in (detached, double, nohup):
        assert running_with(sleeper) == [], sleeper
