"""Compaction is all or nothing: a server killed (SIGKILL) while the summary is being written comes
back with the history it had, and compacting then lands within the server's target
(A3S_COMPACT_TARGET), with the originals archived in the store."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, hang, text

from ..test_compaction import is_summary_request
from .conftest import LoggedServer

pytestmark = pytest.mark.fault

WINDOW = 32_000
TARGET = 0.4
MESSAGES = 41  # the task and 40 long messages


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def _rows(data_dir: Path, session_id: str) -> tuple[int, int]:
    """(live, archived) message rows of the session in the server's store."""
    with closing(sqlite3.connect(data_dir / "sessions.db")) as db:
        rows = db.execute(
            "SELECT archived, COUNT(*) FROM messages WHERE session_id = ? GROUP BY archived", (session_id,)
        )
        counts = dict(rows.fetchall())
    return counts.get(0, 0), counts.get(1, 0)


def _wait_for_summary_request(fake: FakeLLM, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(is_summary_request(r.body) for r in fake.requests):
        assert time.monotonic() < deadline, "the server never asked for a summary"
        time.sleep(0.05)


def test_a_kill_during_compaction_leaves_the_history_whole(tmp_path: Path, fake: FakeLLM) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    data = tmp_path / "data"
    env = {"A3S_LLM_MODEL": "fake-model", "A3S_LLM_BASE_URL": fake.base_url, "A3S_LLM_API_KEY": "test-key"}
    env["A3S_COMPACT_TARGET"] = str(TARGET)
    server = LoggedServer(workspace, data, tmp_path / "server.log", env=env).start()
    try:
        with server.channel() as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            context = [pb.Message(role=pb.Message.ROLE_USER, content="THE TASK")]
            context += [
                pb.Message(role=pb.Message.ROLE_USER, content=" ".join(f"m{i}w{n}" for n in range(600)))
                for i in range(MESSAGES - 1)
            ]
            session_id = stub.CreateSession(
                pb.CreateSessionRequest(
                    config=pb.SessionConfig(max_context_length=WINDOW), initial_context=context
                ),
                timeout=10,
            ).session_id
            fake.fallback = hang(60)  # the summary never comes
            with ThreadPoolExecutor(1) as pool:
                compacting = pool.submit(
                    stub.CompactContext, pb.CompactContextRequest(session_id=session_id), timeout=30
                )
                _wait_for_summary_request(fake)
                server.kill()
                with pytest.raises(grpc.RpcError):
                    compacting.result(timeout=30)
        assert _rows(data, session_id) == (MESSAGES, 0)  # nothing was half applied

        fake.fallback = lambda body: text("Goal: THE TASK.") if is_summary_request(body) else text("ok")
        server = LoggedServer(workspace, data, tmp_path / "server.log", env=env).start()
        with server.channel() as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            usage = stub.GetContextUsage(pb.GetContextUsageRequest(session_id=session_id), timeout=10).usage
            assert usage.message_count == MESSAGES
            reply = stub.CompactContext(pb.CompactContextRequest(session_id=session_id), timeout=30)
        assert reply.before.total_tokens > WINDOW > TARGET * WINDOW >= reply.after.total_tokens
        live, archived = _rows(data, session_id)
        assert live == reply.after.message_count < MESSAGES and archived == MESSAGES
    finally:
        server.kill()
