"""Crash safety: a server killed with SIGKILL in the middle of a stream of writes keeps every write
it acknowledged, on the SQLite file and on PostgreSQL (`--store`).

Writers create sessions (with initial context), run write_file and bash through ExecuteTool on them
(recorded in their history) and reconfigure them, recording client-side what was acknowledged. The
server is killed at a random moment, restarted on the same data directory, and everything
acknowledged so far (in every cycle) must be there: sessions with their configuration, at least the
acknowledged number of messages, the files. A write that was in flight at the kill may or may not
have landed; what landed is adopted as the new lower bound.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .conftest import LoggedServer, env_number

pytestmark = pytest.mark.fault

CYCLES = int(env_number("A3S_CRASH_CYCLES", 12))
POSTGRES_CYCLES = int(env_number("A3S_CRASH_CYCLES_POSTGRES", 4))  # each start is slower
SEED = int(env_number("A3S_CRASH_SEED", 20240607))
WRITERS = 3
MAX_SESSIONS = 150  # stays well under the server's default --max-sessions (1000)
KILL_AFTER_S = (0.2, 1.0)
RPC_TIMEOUT_S = 10.0
MAX_WRITES_PER_WRITER = 2000  # per cycle; the kill comes long before


@dataclass
class Tracked:
    """One session as the client knows it: acknowledged facts and the configure in flight."""

    messages: int
    name: str
    pending_name: str | None = None


@dataclass
class Ledger:
    """Everything acknowledged so far, plus the creates in flight (keyed by client-chosen id)."""

    sessions: dict[str, Tracked] = field(default_factory=dict)
    pending: dict[str, Tracked] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    writes: int = 0


class Killed:
    """Set, in the same event loop turn as the SIGKILL, so no error before it is mistaken for it."""

    def __init__(self) -> None:
        self.done = False


class Writer:
    """One client issuing writes one after another on the sessions it owns, until the server dies."""

    def __init__(
        self, stub: pb_grpc.CodeAgentServiceStub, ledger: Ledger, owned: list[str], rng: random.Random
    ) -> None:
        self.stub = stub
        self.ledger = ledger
        self.owned = owned
        self.rng = rng
        self.tag = f"{rng.getrandbits(48):012x}"
        self.count = 0

    async def run(self, killed: Killed) -> None:
        while self.count < MAX_WRITES_PER_WRITER:
            self.count += 1
            try:
                await self.write_one()
            except grpc.RpcError as exc:
                if killed.done:
                    return
                raise AssertionError(f"a write failed while the server was up: {exc}") from exc
            self.ledger.writes += 1
        raise AssertionError("the server was never killed")

    async def write_one(self) -> None:
        roll = self.rng.random()
        can_create = len(self.ledger.sessions) + len(self.ledger.pending) < MAX_SESSIONS
        if not self.owned or (roll < 0.15 and can_create):
            await self.create()
        elif roll < 0.45:
            await self.write_file(self.rng.choice(self.owned))
        elif roll < 0.7:
            await self.bash(self.rng.choice(self.owned))
        else:
            await self.configure(self.rng.choice(self.owned))

    async def create(self) -> None:
        session_id = f"crash-{self.tag}-{self.count}"
        roles = (pb.Message.ROLE_USER, pb.Message.ROLE_ASSISTANT)
        context = [pb.Message(role=roles[i % 2], content=f"m{i}") for i in range(self.rng.randint(0, 4))]
        tracked = Tracked(messages=len(context), name=f"{session_id}-v0")
        self.ledger.pending[session_id] = tracked
        await self.stub.CreateSession(
            pb.CreateSessionRequest(
                session_id=session_id,
                config=pb.SessionConfig(name=tracked.name, system_prompt="crash test"),
                initial_context=context,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        self.ledger.sessions[session_id] = self.ledger.pending.pop(session_id)
        self.owned.append(session_id)

    async def write_file(self, session_id: str) -> None:
        path, content = f"files/{session_id}/{self.tag}-{self.count}.txt", f"written {self.tag} {self.count}"
        arguments = json.dumps({"path": path, "content": content})
        await self.tool(session_id, "write_file", arguments, path, content)

    async def bash(self, session_id: str) -> None:
        path, content = f"files/{session_id}/{self.tag}-{self.count}.sh", f"bash-{self.tag}-{self.count}"
        command = f"mkdir -p files/{session_id} && printf %s {content} > {path}"
        await self.tool(session_id, "bash", json.dumps({"command": command}), path, content)

    async def tool(self, session_id: str, name: str, arguments: str, path: str, content: str) -> None:
        reply = await self.stub.ExecuteTool(
            pb.ExecuteToolRequest(session_id=session_id, tool_name=name, arguments=arguments),
            timeout=RPC_TIMEOUT_S,
        )
        assert reply.result.success, reply.result.error
        self.ledger.files[path] = content
        self.ledger.sessions[session_id].messages += 2  # the assistant's call and the tool's result

    async def configure(self, session_id: str) -> None:
        tracked = self.ledger.sessions[session_id]
        name = f"{session_id}-v{self.count}"
        tracked.pending_name = name
        await self.stub.ConfigureSession(
            pb.ConfigureSessionRequest(
                session_id=session_id,
                config=pb.SessionConfig(name=name, max_context_length=1000 + self.count),
            ),
            timeout=RPC_TIMEOUT_S,
        )
        tracked.name, tracked.pending_name = name, None


async def write_until_killed(server: LoggedServer, ledger: Ledger, rng: random.Random) -> None:
    """Writers against the server; SIGKILL after a random delay; wait for every writer to notice."""
    owned: list[list[str]] = [[] for _ in range(WRITERS)]
    for index, session_id in enumerate(sorted(ledger.sessions)):
        owned[index % WRITERS].append(session_id)
    killed = Killed()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        writers = [Writer(stub, ledger, owned[i], random.Random(rng.getrandbits(64))) for i in range(WRITERS)]
        tasks = [asyncio.ensure_future(w.run(killed)) for w in writers]
        await asyncio.wait(tasks, timeout=rng.uniform(*KILL_AFTER_S), return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                task.result()  # a writer that stopped while the server was up failed: raise why
        server.kill()
        killed.done = True
        await asyncio.wait_for(asyncio.gather(*tasks), RPC_TIMEOUT_S + 5)


async def verify_and_adopt(server: LoggedServer, ledger: Ledger, backend: str) -> None:
    """Every acknowledged write is there; whatever landed of the writes in flight becomes acknowledged."""
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)
        listed = await stub.ListSessions(pb.ListSessionsRequest(), timeout=RPC_TIMEOUT_S)
    assert health.details["store"] == backend
    stored = {s.session_id: s for s in listed.sessions}
    missing = sorted(set(ledger.sessions) - set(stored))
    assert not missing, f"acknowledged sessions lost: {missing[:5]} ({len(missing)})"
    for session_id, tracked in ledger.sessions.items():
        check_session(session_id, tracked, stored[session_id])
    for session_id, tracked in ledger.pending.items():
        if session_id in stored:  # the create landed though it was never acknowledged
            ledger.sessions[session_id] = tracked
            check_session(session_id, tracked, stored[session_id])
    ledger.pending.clear()
    lost = [p for p, content in ledger.files.items() if not _has(server.workspace / p, content)]
    assert not lost, f"files of acknowledged tool calls lost: {lost[:5]} ({len(lost)})"


def check_session(session_id: str, tracked: Tracked, session: pb.Session) -> None:
    allowed = {tracked.name, tracked.pending_name} - {None}
    assert session.config.name in allowed, (session_id, session.config.name, allowed)
    assert session.config.system_prompt == "crash test", session_id
    version = int(session.config.name.rsplit("-v", 1)[1])  # one ConfigureSession lands whole or not
    assert session.config.max_context_length == (1000 + version if version else 0), session.config
    count = session.context_usage.message_count
    assert count >= tracked.messages, f"{session_id}: {count} stored, {tracked.messages} acknowledged"
    tracked.name, tracked.pending_name = session.config.name, None
    tracked.messages = count


def _has(path: Path, content: str) -> bool:
    return path.is_file() and path.read_text() == content


def integrity(database: Path) -> str:
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def check_integrity(data: Path, backend: str) -> None:
    """The SQLite file's own check (PostgreSQL checks its pages itself)."""
    if backend == "sqlite":
        assert integrity(data / "sessions.db") == "ok"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_sigkill_mid_writes_loses_no_acknowledged_write(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    workspace, data = tmp_path / "workspace", tmp_path / "data"
    workspace.mkdir()
    store = () if backend == "sqlite" else ("--store", request.getfixturevalue("postgres_url"))
    cycles = CYCLES if backend == "sqlite" else POSTGRES_CYCLES
    rng = random.Random(SEED)
    ledger = Ledger()
    for cycle in range(cycles):
        server = LoggedServer(workspace, data, tmp_path / f"server-{cycle}.log", store).start()
        try:
            if cycle:
                await verify_and_adopt(server, ledger, backend)
                check_integrity(data, backend)
                assert "Traceback" not in server.log(), server.log()[-4000:]
            await write_until_killed(server, ledger, rng)
        finally:
            server.kill()
    server = LoggedServer(workspace, data, tmp_path / "server-final.log", store).start()
    try:
        await verify_and_adopt(server, ledger, backend)
        check_integrity(data, backend)
    finally:
        code = server.stop()
    assert code == 0, server.log()[-4000:]  # SIGTERM: a graceful stop, the store closed
    print(
        f"CRASH ({backend}): {cycles} SIGKILLs, {ledger.writes} acknowledged writes, "
        f"{len(ledger.sessions)} sessions, {len(ledger.files)} files, all present"
    )
