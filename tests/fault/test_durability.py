"""Durability: what a real server acknowledged is on disk (synced), not only in the page cache.

A power loss cannot be staged here, so these tests watch the syscalls a real `a3s-agent serve` makes,
under strace: with A3S_DURABILITY=full each session commit syncs SQLite's log before the reply,
with =normal none does; write_file, edit_file and Agent Spaces createFile/editFile fsync the file's
directory after the rename that put the new content in place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .conftest import LoggedServer, child_pids

pytestmark = pytest.mark.fault

TRACED = "fsync,fdatasync,rename,renameat,renameat2"
WAIT_S = 10.0
# strace -f -y: "<tid> <call>(<fd><path>, ...) = <result>"
LINE = re.compile(r"^(\d+) +(\w+)\((.*)\) += (-?\d+)")


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(
        ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=fsync", "true"], capture_output=True, timeout=10
    )
    return probe.returncode == 0


needs_strace = pytest.mark.skipif(not _strace_works(), reason="needs strace, allowed to trace (ptrace)")


class TracedServer(LoggedServer):
    """`a3s-agent serve` under strace, which logs the sync and rename calls of all its threads.

    A call's line is written when the call returns, so before the server replies to the request
    that made it; after `kill` the trace holds every call the replies depended on."""

    def __init__(self, tmp_path: Path, env: dict[str, str] | None = None) -> None:
        workspace = tmp_path / "workspace"
        workspace.mkdir()
        super().__init__(workspace, tmp_path / "data", tmp_path / "server.log", env=env)
        self.trace_path = tmp_path / "trace.txt"

    def command(self) -> list[str]:
        strace = ["strace", "-f", "-qq", "-y", "--seccomp-bpf", "-e", f"trace={TRACED}"]
        return [*strace, "-o", str(self.trace_path), *super().command()]

    def kill(self) -> None:
        """SIGKILL the server (strace's child); strace then ends with it."""
        if self.proc is not None and self.proc.poll() is None:
            for pid in child_pids(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(WAIT_S)

    def calls(self) -> list[tuple[int, str, str]]:
        """(thread id, call, arguments) of every completed traced call, in order."""
        found = []
        for line in self.trace_path.read_text(errors="replace").splitlines():
            match = LINE.match(line)
            if match:
                found.append((int(match[1]), match[2], match[3]))
        return found


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[TracedServer]:
    server = TracedServer(tmp_path)
    yield server
    server.kill()


def _stub(server: LoggedServer) -> tuple[grpc.Channel, pb_grpc.CodeAgentServiceStub]:
    channel = server.channel()
    return channel, pb_grpc.CodeAgentServiceStub(channel)


def _tool(stub: pb_grpc.CodeAgentServiceStub, name: str, **arguments: object) -> None:
    request = pb.ExecuteToolRequest(tool_name=name, arguments=json.dumps(arguments))
    result = stub.ExecuteTool(request, timeout=WAIT_S).result
    assert result.success, result.error


def _position(calls: list[tuple[int, str, str]], fragment: str) -> int:
    """Where the first call whose arguments contain `fragment` is."""
    for index, (_, _, arguments) in enumerate(calls):
        if fragment in arguments:
            return index
    raise AssertionError(f"no traced call mentions {fragment!r}")


def _wal_syncs(calls: list[tuple[int, str, str]]) -> int:
    return sum(call in ("fsync", "fdatasync") and "sessions.db-wal>" in args for _, call, args in calls)


@needs_strace
@pytest.mark.parametrize(("setting", "shown"), [(None, "full"), ("normal", "normal")])
def test_each_acknowledged_commit_is_synced_unless_durability_is_normal(
    tmp_path: Path, setting: str | None, shown: str
) -> None:
    server = TracedServer(tmp_path, env={} if setting is None else {"A3S_DURABILITY": setting})
    creates = 8
    try:
        server.start()
        channel, stub = _stub(server)
        with channel:
            health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=WAIT_S)
            # Read back from the store's own connection (PRAGMA synchronous), not from the setting.
            assert health.details["durability"] == shown
            # write_file calls mark the trace: everything between them is the creates' doing.
            _tool(stub, "write_file", path="before.txt", content="x")
            for _ in range(creates):
                stub.CreateSession(pb.CreateSessionRequest(), timeout=WAIT_S)
            _tool(stub, "write_file", path="after.txt", content="x")
        server.kill()
        calls = server.calls()
        during = calls[_position(calls, '"before.txt"') : _position(calls, '"after.txt"')]
        if shown == "full":
            assert _wal_syncs(during) >= creates, during
        else:
            assert _wal_syncs(during) == 0, during
    finally:
        server.kill()


def _every_write_syncs_its_directory(
    calls: list[tuple[int, str, str]], directory: Path, name: str, writes: int
) -> None:
    """`writes` renames put new content at `name` in `directory`; on each one's thread, the call
    before it fsynced the temporary file and the call after it fsynced `directory`."""
    shown = f"<{directory}>"
    renames = [
        (tid, call, args)
        for tid, call, args in calls
        if call.startswith("rename") and args.endswith(f'{shown}, "{name}"')
    ]
    assert len(renames) == writes, f"renames to {name} in {directory}: {renames}"
    for rename in renames:
        thread = [c for c in calls if c[0] == rename[0]]
        at = thread.index(rename)
        before, after = thread[at - 1], thread[at + 1] if at + 1 < len(thread) else None
        assert before[1] == "fsync" and f"/.{name}." in before[2], (before, rename)
        assert after is not None and after[1] == "fsync" and after[2].endswith(shown), (rename, after)


@needs_strace
async def test_file_writes_sync_the_directory_after_the_rename(traced: TracedServer) -> None:
    workspace = traced.workspace.resolve()
    traced.start()
    channel, stub = _stub(traced)
    with channel:
        _tool(stub, "write_file", path="notes/plan.md", content="one\n")
        _tool(stub, "edit_file", path="notes/plan.md", old_string="one", new_string="two")
    edit = {"oldContent": "alpha", "newContent": "beta"}
    batch = {
        "protocolVersion": "1.0",
        "operations": [
            {"type": "createFile", "path": "space/made.txt", "content": "alpha\n"},
            {"type": "editFile", "path": "space/made.txt", "edits": [edit]},
        ],
    }
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{traced.http_port}") as http:
        async with http.post("/v1/spaces", json={"spaceId": "s1", "workspace": str(workspace)}) as reply:
            assert reply.status == 201, await reply.text()
        async with http.post("/v1/spaces/s1/runs", json=batch) as reply:
            run = await reply.json()
    assert run["status"] == "completed", run
    assert [event.get("success") for event in run["events"]] == [True, True], run
    traced.kill()  # right after the replies: what they acknowledged is there, whole
    calls = traced.calls()
    _every_write_syncs_its_directory(calls, workspace / "notes", "plan.md", writes=2)  # write_file, edit_file
    _every_write_syncs_its_directory(calls, workspace / "space", "made.txt", writes=2)  # createFile, editFile
    assert (workspace / "notes" / "plan.md").read_text() == "two\n"
    assert (workspace / "space" / "made.txt").read_text() == "beta\n"


def test_an_unknown_durability_stops_the_server_with_exit_2(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = LoggedServer(
        workspace, tmp_path / "data", tmp_path / "server.log", env={"A3S_DURABILITY": "fast"}
    )
    done = subprocess.run(server.command(), env=server.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "A3S_DURABILITY must be full or normal, not 'fast'" in done.stderr
    assert not (tmp_path / "data").exists()
