"""Tool processes that escape their process group (setsid, double forks, a scrubbed environment) do
not outlive their call: after a normal end, a timeout, a Cancel, a client hanging up, or a kill -9
of the server and a restart on the same data dir. Run through the real gRPC server (in-process and
`a3s-agent serve`), with and without per-call cgroups, watching the escaped processes in /proc."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call
from a3s_agent.tools import cgroups, procfs
from a3s_agent.tools.containment import CGROUPS_VARIABLE, MARKER
from a3s_agent.tools.sandbox import bwrap

from ..conftest import (
    LiveServer,
    agent_settings,
    alive,
    initialize,
    new_session,
    run_fresh_server,
    running,
    user,
)
from ..fault.conftest import LoggedServer, zombie_children
from ..test_control import eventually

pytestmark = pytest.mark.security
SANDBOX_VARIABLE = "A3S_SANDBOX"

# The escaped process touches its flag (so the test knows it ran), then becomes `sleep <tag>`.
PAYLOAD = 'touch "$1"; exec sleep "$2"'
PY_DOUBLE_FORK = """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sh", ["sh", "-c", sys.argv[1], "sh", sys.argv[2], sys.argv[3]])
    os._exit(0)
"""
ESCAPES = {
    "setsid": "setsid -f sh -c {payload} sh {flag} {tag}",
    "subshell": "(sh -c {payload} sh {flag} {tag} &) &",
    "python": "{python} -c {py} {payload} {flag} {tag}",
    # No marker left in its environment, and in a session of its own.
    "scrubbed": "env -i /bin/sh -c {payload_setsid} sh {flag} {tag}",
    # No marker, a session of its own, and the escape below a shell that stays: two levels under
    # the server once setsid's fork exits (both the shell and its child carry the tag).
    "nested": "env -u A3S_AGENT_SCOPE setsid -f sh -c {payload_nested} sh {flag} {tag}",
}


class Escapes:
    """One bash command starting every escape, each as `sleep <unique tag>`, and what to look for."""

    def __init__(self, directory: Path, kinds: list[str]) -> None:
        self.flags = {kind: directory / f"escaped-{kind}" for kind in kinds}
        self.tags = {kind: f"300.{secrets.randbelow(10**9)}" for kind in kinds}
        lines = [
            ESCAPES[kind].format(
                payload=shlex.quote(PAYLOAD),
                payload_setsid=shlex.quote(f'setsid -f sh -c {shlex.quote(PAYLOAD)} sh "$1" "$2"'),
                payload_nested=shlex.quote(f'sh -c {shlex.quote(PAYLOAD)} sh "$1" "$2"; :'),
                python=shlex.quote(sys.executable),
                py=shlex.quote(PY_DOUBLE_FORK),
                flag=shlex.quote(str(self.flags[kind])),
                tag=self.tags[kind],
            )
            for kind in kinds
        ]
        waits = [
            f"while [ ! -e {shlex.quote(str(flag))} ]; do sleep 0.01; done" for flag in self.flags.values()
        ]
        self.command = "\n".join([*lines, *waits])

    def all_escaped(self) -> bool:
        return all(flag.exists() for flag in self.flags.values())

    def running(self) -> dict[str, list[int]]:
        """The escaped processes still running, by kind (zombies count as gone)."""
        found: dict[str, list[int]] = {}
        for kind, tag in self.tags.items():
            pids = [pid for pid, argv in _processes() if tag.encode() in argv]
            if pids:
                found[kind] = pids
        return found

    async def wait_gone(self, within_s: float = 10.0) -> None:
        await eventually(lambda: not self.running(), "the tagged processes are gone", within_s)


def _processes() -> list[tuple[int, list[bytes]]]:
    """(pid, argv) of every process that is not a zombie."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append((int(entry.name), argv))
    return found


@pytest.fixture(params=["cgroups", "no-cgroups"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """With per-call cgroups where this machine allows them, and with the fallback alone
    (subreaper, markers, process trees)."""
    monkeypatch.setenv(CGROUPS_VARIABLE, "1" if request.param == "cgroups" else "0")
    return request.param


@pytest.fixture
async def server(mode: str, workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[LiveServer]:
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        await initialize(live, fake)
        yield live


async def _bash(stub: pb_grpc.CodeAgentServiceStub, command: str, **extra: object) -> pb.ToolResult:
    arguments = json.dumps({"command": command, **extra})
    reply = await stub.ExecuteTool(pb.ExecuteToolRequest(tool_name="bash", arguments=arguments))
    return reply.result


ALL = list(ESCAPES)


async def test_escapes_end_with_a_call_that_ends_normally(server: LiveServer) -> None:
    escapes = Escapes(server.workspace, ALL)
    result = await _bash(server.stub, escapes.command)
    assert result.success, result.error
    assert escapes.all_escaped()
    await escapes.wait_gone()


async def test_escapes_end_with_a_call_that_times_out(server: LiveServer) -> None:
    escapes = Escapes(server.workspace, ALL)
    result = await _bash(server.stub, escapes.command + "\nsleep 60", timeout_ms=2000)
    assert not result.success and "timed out" in result.error
    assert escapes.all_escaped()
    await escapes.wait_gone()


async def test_escapes_end_with_a_generation_cancelled_during_the_call(
    server: LiveServer, fake: FakeLLM
) -> None:
    escapes = Escapes(server.workspace, ALL)
    fake.script(tool_call("bash", {"command": escapes.command + "\nsleep 60"}), text("never reached"))
    session_id = await new_session(server)
    generation = asyncio.ensure_future(
        server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
    )
    await eventually(escapes.all_escaped)
    assert escapes.running().keys() == set(ALL)
    assert (await server.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generation
    assert err.value.code() == grpc.StatusCode.CANCELLED
    await escapes.wait_gone()


async def test_escapes_end_when_the_client_hangs_up_during_the_call(server: LiveServer) -> None:
    escapes = Escapes(server.workspace, ALL)
    arguments = json.dumps({"command": escapes.command + "\nsleep 60"})
    call = server.stub.ExecuteTool(pb.ExecuteToolRequest(tool_name="bash", arguments=arguments))
    await eventually(escapes.all_escaped)
    assert escapes.running().keys() == set(ALL)
    call.cancel()
    await escapes.wait_gone()


async def test_a_call_ending_does_not_kill_what_a_concurrent_call_runs(server: LiveServer) -> None:
    # Marked escapes only: without cgroups an orphan that dropped the marker cannot be told apart
    # from another call's, so it waits for the last running call to end (see the README).
    kinds = ["setsid", "subshell", "python"]
    workspace = server.workspace
    first, second = Escapes(workspace / "first", kinds), Escapes(workspace / "second", kinds)
    (workspace / "first").mkdir()
    (workspace / "second").mkdir()
    go = workspace / "go"
    running_first = asyncio.ensure_future(
        _bash(server.stub, f"{first.command}\nwhile [ ! -e {shlex.quote(str(go))} ]; do sleep 0.02; done")
    )
    await eventually(first.all_escaped)
    result = await _bash(server.stub, second.command)
    assert result.success and second.all_escaped()
    await second.wait_gone()
    assert first.running().keys() == set(kinds)  # the first call still runs: its processes too
    go.touch()
    assert (await running_first).success
    await first.wait_gone()


async def test_what_a_call_left_running_being_slow_to_exit_does_not_stall_the_server(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed at the end of its call may take its time to exit (a big one tearing down
    its memory, one in uninterruptible sleep): the event loop, serving every other session, keeps
    turning while the kill waits for it, and the process is gone when the call returns."""
    real_wait = procfs._wait_exited

    def slow_exits(handles: list[int], wait_s: float) -> None:
        time.sleep(min(wait_s, 0.4))  # the exits take this long, up to the wait's bound
        real_wait(handles, wait_s)

    monkeypatch.setattr(procfs, "_wait_exited", slow_exits)
    escapes = Escapes(server.workspace, ["subshell"])
    turns = [time.monotonic()]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            turns.append(time.monotonic())

    ticker = asyncio.create_task(tick())
    try:
        result = await _bash(server.stub, escapes.command)
    finally:
        ticker.cancel()
    assert result.success and escapes.all_escaped(), result.error
    assert not escapes.running()
    stall = max(later - earlier for earlier, later in itertools.pairwise(turns))
    assert stall < 0.2, f"the event loop stood still for {stall:.2f} s"


@pytest.fixture
def logged(mode: str, tmp_path: Path) -> LoggedServer:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {CGROUPS_VARIABLE: "1" if mode == "cgroups" else "0"}
    return LoggedServer(workspace, tmp_path / "data", tmp_path / "server.log", env=env)


async def test_escapes_of_a_served_call_end_and_leave_no_zombies(logged: LoggedServer) -> None:
    logged.start()
    try:
        async with grpc.aio.insecure_channel(logged.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            for round_ in range(2):  # a normal end, then a timeout
                escapes = Escapes(logged.workspace / f"round-{round_}", ALL)
                (logged.workspace / f"round-{round_}").mkdir()
                result = await _bash(
                    stub, escapes.command + ("\nsleep 60" if round_ else ""), timeout_ms=2000
                )
                assert escapes.all_escaped(), result.error
                await escapes.wait_gone()
        # The server adopted the orphans (a subreaper) and reaped every one of them.
        await eventually(lambda: not zombie_children(logged.pid))
    finally:
        logged.stop()
    assert "Traceback" not in logged.log()


async def test_a_call_ending_leaves_alone_what_the_server_did_not_start_even_with_its_marker(
    logged: LoggedServer,
) -> None:
    # A process outside the server's tree, started while the call runs and carrying the call's very
    # marker, is not the call's: its kill looks only below the server (everything a call starts
    # stays there, the server being a subreaper), while the call's own escapes still end.
    escapes = Escapes(logged.workspace, ["scrubbed", "nested"])
    marker_file, go = logged.workspace / "marker", logged.workspace / "go"
    logged.start()
    outsider = None
    try:
        async with grpc.aio.insecure_channel(logged.address) as channel:
            command = (
                f'printf %s "$A3S_AGENT_SCOPE" > {shlex.quote(str(marker_file))}\n{escapes.command}\n'
                f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.02; done"
            )
            call = asyncio.ensure_future(_bash(pb_grpc.CodeAgentServiceStub(channel), command))
            await eventually(lambda: escapes.all_escaped() and marker_file.exists())
            marker = marker_file.read_text()
            assert marker.count(":") == 2, marker
            outsider = await asyncio.create_subprocess_exec(
                "sleep", "300", env={**os.environ, MARKER: marker}, start_new_session=True
            )
            await eventually(lambda: f"{MARKER}={marker}".encode() in _environ(outsider.pid))
            go.touch()
            assert (await call).success
            await escapes.wait_gone()
            assert alive(outsider.pid), "a process the server did not start was killed"
    finally:
        if outsider is not None:
            outsider.kill()
            await outsider.wait()
        logged.stop()
    assert "Traceback" not in logged.log()


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


async def test_what_a_killed_server_left_running_is_killed_at_its_restart(
    mode: str, logged: LoggedServer, tmp_path: Path
) -> None:
    # Without cgroups, a process that dropped the marker and left the session cannot be found once
    # its server is gone (the README's limits); with them it is in the crashed call's cgroup.
    # Unsandboxed: under the sandbox nothing outlives the crash to be found (the test after this one).
    logged.env[SANDBOX_VARIABLE] = "off"
    kinds = ALL if mode == "cgroups" else ["setsid", "subshell", "python"]
    escapes = Escapes(tmp_path, kinds)
    root_flag = tmp_path / "root-pid"
    logged.start()
    channel = grpc.aio.insecure_channel(logged.address)
    stub = pb_grpc.CodeAgentServiceStub(channel)
    command = f"echo $$ > {shlex.quote(str(root_flag))}\n{escapes.command}\nsleep 60"
    call = asyncio.ensure_future(_bash(stub, command))
    try:
        await eventually(lambda: escapes.all_escaped() and root_flag.exists() and root_flag.read_text() != "")
        logged.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        logged.proc.wait(10)  # type: ignore[union-attr]
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        # The crash left them running, as it would without the restart below.
        assert escapes.running().keys() == set(kinds)
        root = int(root_flag.read_text())
        assert alive(root)
        restarted = LoggedServer(
            logged.workspace, logged.data_dir, tmp_path / "restarted.log", env=logged.env
        )
        restarted.start()
        try:
            await escapes.wait_gone()
            await eventually(lambda: not alive(root))
        finally:
            restarted.stop()
        assert "left running by a previous server" in restarted.log()
    finally:
        await channel.close()
        logged.kill()


@pytest.mark.skipif(bwrap.problem() is not None, reason=f"bwrap does not work here: {bwrap.problem()}")
async def test_a_sandboxed_call_does_not_outlive_a_killed_server(logged: LoggedServer) -> None:
    """bwrap dies with the server (kill -9 too) and its PID namespace with it: nothing is left for a
    restart to find. (Landlock has no PID namespace: there the restart kills what is left.)"""
    logged.env[SANDBOX_VARIABLE] = "bwrap"
    escapes = Escapes(logged.workspace, ALL)
    logged.start()
    channel = grpc.aio.insecure_channel(logged.address)
    call = asyncio.ensure_future(_bash(pb_grpc.CodeAgentServiceStub(channel), escapes.command + "\nsleep 60"))
    try:
        await eventually(escapes.all_escaped)
        assert escapes.running().keys() == set(ALL)
        logged.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        logged.proc.wait(10)  # type: ignore[union-attr]
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        await escapes.wait_gone()
    finally:
        await channel.close()
        logged.kill()


async def test_the_record_rewritten_in_place_still_names_the_running_call_after_a_crash(
    tmp_path: Path,
) -> None:
    # Without cgroups, an orphan that dropped the marker but stayed in the call's session is found
    # after a crash only through processes.json. The record is rewritten in place: here the last
    # write (one call) is shorter than the one before it (two calls at once).
    (tmp_path / "workspace").mkdir()
    # Unsandboxed: this is the recovery of what a crash left, and under the sandbox nothing is left.
    env = {CGROUPS_VARIABLE: "0", SANDBOX_VARIABLE: "off"}
    logged = LoggedServer(tmp_path / "workspace", tmp_path / "data", tmp_path / "server.log", env=env)
    root_file, background_file, go = tmp_path / "root", tmp_path / "background", tmp_path / "go"
    tag = f"300.{secrets.randbelow(10**9)}"
    logged.start()
    channel = grpc.aio.insecure_channel(logged.address)
    stub = pb_grpc.CodeAgentServiceStub(channel)
    try:
        flags = [tmp_path / "first", tmp_path / "second"]
        waiting = [
            asyncio.ensure_future(
                _bash(
                    stub,
                    f"touch {shlex.quote(str(flag))}\nwhile [ ! -e {shlex.quote(str(go))} ]; do sleep 0.02; done",
                )
            )
            for flag in flags
        ]
        await eventually(lambda: all(flag.exists() for flag in flags))
        go.touch()
        assert all(result.success for result in await asyncio.gather(*waiting))
        command = (
            f"echo $$ > {shlex.quote(str(root_file))}\n"
            f"(env -u {MARKER} sleep {tag} & echo $! > {shlex.quote(str(background_file))})\nsleep 60"
        )
        call = asyncio.ensure_future(_bash(stub, command))
        await eventually(lambda: background_file.exists() and background_file.read_text().strip())
        background = int(background_file.read_text())
        # `$!` is the `env` that execs sleep: its environment loses the marker once it has.
        await eventually(lambda: MARKER.encode() not in _environ(background), "the orphan to drop the marker")
        logged.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        logged.proc.wait(10)  # type: ignore[union-attr]
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        assert alive(background)
        restarted = LoggedServer(logged.workspace, logged.data_dir, tmp_path / "restarted.log", env=env)
        restarted.start()
        try:
            await eventually(lambda: not alive(background) and not alive(int(root_file.read_text())))
        finally:
            restarted.stop()
    finally:
        await channel.close()
        logged.kill()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(background_file.read_text()), signal.SIGKILL)


async def test_a_server_stopping_kills_the_tool_processes_still_running(tmp_path: Path) -> None:
    # One mode only: the stop waits for the server's grace period (1 s here) before it cancels the call.
    (tmp_path / "workspace").mkdir()
    escapes = Escapes(tmp_path / "workspace", ALL)
    logged = LoggedServer(
        tmp_path / "workspace", tmp_path / "data", tmp_path / "server.log", ("--grace-seconds", "1")
    ).start()
    channel = grpc.aio.insecure_channel(logged.address)
    call = asyncio.ensure_future(_bash(pb_grpc.CodeAgentServiceStub(channel), escapes.command + "\nsleep 60"))
    try:
        await eventually(escapes.all_escaped)
        logged.stop(signal.SIGTERM)
        await escapes.wait_gone()
    finally:
        call.cancel()
        await channel.close()
        logged.kill()


OWN_CGROUP = 'sed -n "s/^0:://p" /proc/self/cgroup'
"""A bash command printing its own cgroup (relative to the cgroup v2 mount)."""


async def _spare_cgroup_with_intruder(
    stub: pb_grpc.CodeAgentServiceStub, data_dir: Path, tag: str
) -> tuple[Path, asyncio.subprocess.Process]:
    """A call's cgroup kept for reuse once the call ended, and a process from outside the server's
    tree (as a daemon handed a command would be) that moved itself into it."""
    result = await _bash(stub, OWN_CGROUP)
    assert result.success, result.error
    run_cgroup = Path(json.loads((data_dir / "processes.json").read_bytes())["cgroup"])
    spare = run_cgroup / Path(result.output.strip()).name
    assert spare.parent == run_cgroup and spare.is_dir(), "the emptied call cgroup is not kept"
    intruder = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        'echo 0 > "$1" && exec sleep "$2"',
        "sh",
        str(spare / "cgroup.procs"),
        tag,
        start_new_session=True,
    )
    await eventually(lambda: str(intruder.pid) in (spare / "cgroup.procs").read_text().split())
    return spare, intruder


async def _ended(intruder: asyncio.subprocess.Process | None) -> None:
    """The intruder killed and reaped, should a failed test have left it running."""
    if intruder is not None and intruder.returncode is None:
        intruder.kill()
        await intruder.wait()


@pytest.fixture
def cgroup_server(tmp_path: Path) -> LoggedServer:
    if cgroups.own_directory() is None:
        pytest.skip("no writable cgroup v2 here")
    (tmp_path / "workspace").mkdir()
    # Unsandboxed: the command reads its own cgroup, which the sandbox's cgroup namespace hides.
    env = {CGROUPS_VARIABLE: "1", SANDBOX_VARIABLE: "off"}
    return LoggedServer(tmp_path / "workspace", tmp_path / "data", tmp_path / "server.log", env=env)


@pytest.mark.parametrize("end", ["the next call", "stop", "crash and restart"])
async def test_a_process_that_entered_a_spare_call_cgroup_is_killed(
    cgroup_server: LoggedServer, tmp_path: Path, end: str
) -> None:
    """By the next call that would use the cgroup (and never runs in it), else with the server."""
    cgroup_server.start()
    intruder = None
    try:
        async with grpc.aio.insecure_channel(cgroup_server.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            spare, intruder = await _spare_cgroup_with_intruder(stub, cgroup_server.data_dir, "300.1")
            if end == "the next call":  # it lists the processes of its own cgroup: only its own
                command = f'cg=$({OWN_CGROUP}); cat "{spare.parent}/${{cg##*/}}/cgroup.procs"'
                result = await _bash(stub, command)
                assert result.success, result.error
                assert str(intruder.pid) not in result.output.split()
        if end == "stop":
            cgroup_server.stop()
        elif end == "crash and restart":
            cgroup_server.kill()
            assert alive(intruder.pid)  # the crash left it running
            restarted = LoggedServer(
                cgroup_server.workspace,
                cgroup_server.data_dir,
                tmp_path / "restarted.log",
                env=cgroup_server.env,
            )
            restarted.start().stop()
        assert await asyncio.wait_for(intruder.wait(), 10) == -signal.SIGKILL
    finally:
        await _ended(intruder)
        cgroup_server.kill()
    assert "Traceback" not in cgroup_server.log()


HAS_CHILDREN_PROBE = """
import subprocess, threading, time
from a3s_agent.tools import procfs
seen = [procfs.has_children()]
started, release = threading.Event(), threading.Event()
def spawn():
    global child
    child = subprocess.Popen(["sleep", "0.3"])
    started.set()
    release.wait()
thread = threading.Thread(target=spawn)
thread.start()
started.wait()
seen.append(procfs.has_children())  # a running child of a thread that is still alive
time.sleep(0.6)
seen.append(procfs.has_children())  # exited, not reaped: still a child, and left unreaped
seen.append(child.wait() == 0)
seen.append(procfs.has_children())
release.set()
print(seen)
"""


def test_a_server_with_no_child_left_is_known_to_have_none_from_one_call() -> None:
    """The shortcut a call's end takes before walking /proc: it must see any thread's children,
    running or exited, and reap none of them."""
    probe = subprocess.run(
        [sys.executable, "-c", HAS_CHILDREN_PROBE], capture_output=True, text=True, timeout=30, check=True
    )
    assert probe.stdout.strip() == "[False, True, True, True, False]"


SIGCHLD_BURST = """
import os, signal

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc


async def main() -> None:
    serving = serve()
    async with grpc.aio.insecure_channel("127.0.0.1:{port}") as channel:
        await until_serving(pb_grpc.CodeAgentServiceStub(channel))
    for _ in range(5000):  # a call's thousands of processes ending at once, the loop not running
        os.kill(os.getpid(), signal.SIGCHLD)
    await asyncio.sleep(0.5)  # whatever the signals scheduled is reported meanwhile
    os.kill(os.getpid(), signal.SIGTERM)
    print(await serving)


asyncio.run(main())
"""


def test_a_burst_of_sigchld_floods_no_log(tmp_path: Path) -> None:
    """The server's wakeup socket filling up (a fork bomb's children killed at once) writes nothing
    to its stderr: one reap takes every exited child."""
    _, stderr = run_fresh_server(SIGCHLD_BURST, tmp_path, {}, 120)
    assert "wakeup fd" not in stderr and "Traceback" not in stderr, stderr[-2000:]
