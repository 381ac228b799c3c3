"""Token accounting users can bill by: prompt, completion, cache-read, cache-write and reasoning
tokens per model turn and per session, read wherever each server dialect of
`a3s_agent/testing/fake_llm.py` reports them, shown in the METADATA chunks, Generate metadata, the
session's reply metadata (gRPC trailing metadata, HTTP response headers), events and coven's
TokenUsage, and stored with the session (a store written before these columns existed loads with
zeros)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.base.sqlite import connect
from a3s_agent.core.store.sqlite_store import MIGRATIONS
from a3s_agent.faces.coven.threads import session_id_for
from a3s_agent.llm.openai_stream import usage_of
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import coven_pb2 as coven_pb
from a3s_agent.testing.fake_llm import DIALECTS, FakeLLM, text, tool_call

from .conftest import LiveServer, agent_settings, initialize, new_session, running, subscribed, user
from .test_coven import FakeGateway, coven_agent, gateway, send_message
from .test_http import serving

__all__ = ["gateway"]  # the coven tests' fake gateway, as a fixture here

PARTS = ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
LONG = "word " * 5_000  # over OpenAI's 1,024-token caching threshold on the follow-up turn
NOTES = "hello from the notes\n"


def summed(usages: list[dict[str, int]]) -> dict[str, int]:
    return {part: sum(u[part] for u in usages) for part in PARTS}


def parts(metadata: Mapping[str, str], prefix: str = "") -> dict[str, int]:
    """The usage parts of a metadata map (`prefix`: "a3s-" for the session's reply metadata)."""
    return {part: int(metadata[prefix + part.replace("_", "-" if prefix else "_")]) for part in PARTS}


@pytest.fixture(params=sorted(DIALECTS))
async def dialect_fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeLLM]:
    async with FakeLLM(dialect=request.param) as fake:
        yield fake


@pytest.fixture
async def server(workspace: Path, tmp_path: Path, dialect_fake: FakeLLM) -> AsyncIterator[LiveServer]:
    (workspace / "notes.txt").write_text(NOTES)
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        await initialize(live, dialect_fake)
        yield live


async def session_metadata(server: LiveServer, session_id: str) -> dict[str, str]:
    call = server.stub.GetSession(pb.GetSessionRequest(session_id=session_id))
    await call
    return dict(await call.trailing_metadata())


async def test_every_dialect_reports_each_part_per_turn_and_per_session(
    server: LiveServer, dialect_fake: FakeLLM
) -> None:
    dialect_fake.script(tool_call("read_file", {"path": "notes.txt"}), text("The notes say hello."))
    session_id = await new_session(server)
    request = pb.GenerateRequest(session_id=session_id, messages=[user(LONG + "what do the notes say?")])
    chunks = [c async for c in server.stub.StreamGenerate(request)]

    turns = [dict(c.metadata) for c in chunks if c.metadata.get("type") == "usage"]
    assert [parts(t) for t in turns] == [{p: u[p] for p in PARTS} for u in dialect_fake.usages]
    assert all(
        int(t["total_tokens"]) == u["total_tokens"] for t, u in zip(turns, dialect_fake.usages, strict=True)
    )
    done = chunks[-1]
    assert done.type == pb.GenerateChunk.CHUNK_TYPE_DONE and done.content == "The notes say hello."
    assert parts(done.metadata) == summed(dialect_fake.usages)
    assert parts(await session_metadata(server, session_id), "a3s-") == summed(dialect_fake.usages)

    # The parts are really there where the dialect reports them (this test would pass on zeros else).
    details = DIALECTS[dialect_fake.dialect_name].usage_details
    total = summed(dialect_fake.usages)
    assert bool(total["cache_read_tokens"]) == (details in ("openai", "openrouter", "deepseek", "moonshot"))
    assert bool(total["reasoning_tokens"]) == (details in ("openrouter", "gemini", "deepseek"))
    assert bool(total["cache_write_tokens"]) == (details == "openrouter")


@pytest.fixture
async def deepseek() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(dialect="deepseek-reasoning") as fake:
        yield fake


@pytest.fixture
async def billed(workspace: Path, tmp_path: Path, deepseek: FakeLLM) -> AsyncIterator[LiveServer]:
    (workspace / "notes.txt").write_text(NOTES)
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        await initialize(live, deepseek)
        yield live


async def test_generate_metadata_and_the_completed_event_carry_every_part(
    billed: LiveServer, deepseek: FakeLLM
) -> None:
    deepseek.script(tool_call("read_file", {"path": "notes.txt"}), text("Hello."))
    session_id = await new_session(billed)
    events = billed.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id, event_types=["generation_completed"])
    )
    await subscribed(billed)
    reply = await billed.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("notes?")]))
    expected = summed(deepseek.usages)
    assert expected["reasoning_tokens"] and expected["cache_read_tokens"]
    assert parts(reply.metadata) == expected
    # The proto's Usage has three fields: they agree with the metadata.
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        expected["prompt_tokens"],
        expected["completion_tokens"],
    )
    completed = await asyncio.wait_for(anext(aiter(events)), 10)
    events.cancel()
    assert parts(completed.data) == expected


async def test_session_usage_survives_a_restart(workspace: Path, tmp_path: Path, deepseek: FakeLLM) -> None:
    settings = agent_settings(workspace, tmp_path / "data")
    async with running(settings) as live:
        await initialize(live, deepseek)
        session_id = await new_session(live)
        deepseek.script(text("one"), text("two"))
        for prompt in ("first", "second"):
            await live.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user(prompt)]))
        before = await session_metadata(live, session_id)
    assert parts(before, "a3s-") == summed(deepseek.usages)
    async with running(settings) as live:
        assert await session_metadata(live, session_id) == before


async def test_a_store_from_before_the_parts_loads_with_zeros(workspace: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = connect(data / "sessions.db", MIGRATIONS[:3])  # the schema of the previous release
    config = json.dumps({"name": "old", "workspace": str(workspace)})
    db.execute(
        "INSERT INTO sessions (id, config, state, created_at, updated_at, prompt_tokens, completion_tokens)"
        " VALUES ('old-session', ?, 1, 1, 1, 1200, 340)",
        (config,),
    )
    db.close()
    async with running(agent_settings(workspace, data)) as live:
        metadata = await session_metadata(live, "old-session")
    assert parts(metadata, "a3s-") == {
        "prompt_tokens": 1200,
        "completion_tokens": 340,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
    }
    assert metadata["a3s-total-tokens"] == "1540"
    reopened = connect(data / "sessions.db", MIGRATIONS)
    assert reopened.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS),)
    reopened.close()


async def test_the_http_face_shows_the_parts_in_metadata_and_headers(
    billed: LiveServer, deepseek: FakeLLM
) -> None:
    deepseek.script(text("first"), text("second"))
    async with serving(billed) as http:
        created = await http.client.post("/sessions", json={})
        session_id = (await created.json())["session_id"]
        assert created.headers["a3s-total-tokens"] == "0" and created.headers["a3s-token-budget"] == "0"
        for prompt in ("one", "two"):
            reply = await http.client.post(
                f"/sessions/{session_id}/generate",
                json={"messages": [{"role": "ROLE_USER", "content": prompt}]},
            )
            body = await reply.json()
            assert reply.status == 200, body
        assert parts(body["metadata"]) == {p: deepseek.usages[-1][p] for p in PARTS}
        assert int(body["usage"]["prompt_tokens"]) == deepseek.usages[-1]["prompt_tokens"]
        got = await http.client.get(f"/sessions/{session_id}")
        assert parts(got.headers, "a3s-") == summed(deepseek.usages)
        by_rpc = await http.client.post("/rpc/GetSession", json={"session_id": session_id})
        assert parts(by_rpc.headers, "a3s-") == summed(deepseek.usages)


async def test_compaction_summaries_count_in_the_session_usage(
    workspace: Path, tmp_path: Path, deepseek: FakeLLM
) -> None:
    deepseek.fallback = text("Goal: refactor the parser. Next: read the tests.")
    context = [
        pb.Message(
            role=pb.Message.ROLE_ASSISTANT if i % 2 else pb.Message.ROLE_USER, content=f"m{i} " * 2_000
        )
        for i in range(30)
    ]
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        await initialize(live, deepseek)
        created = await live.stub.CreateSession(
            pb.CreateSessionRequest(
                config=pb.SessionConfig(max_context_length=32_000), initial_context=context
            )
        )
        compacted = await live.stub.CompactContext(pb.CompactContextRequest(session_id=created.session_id))
        assert compacted.after.total_tokens < compacted.before.total_tokens
        metadata = await session_metadata(live, created.session_id)
    assert deepseek.usages, "no summary was asked for"
    assert parts(metadata, "a3s-") == summed(deepseek.usages)


async def test_coven_token_usage_carries_cache_and_thinking(
    workspace: Path, tmp_path: Path, deepseek: FakeLLM, gateway: FakeGateway
) -> None:
    (workspace / "notes.txt").write_text(NOTES)
    deepseek.script(tool_call("read_file", {"path": "notes.txt"}, id="call_1"), text("Read."))
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        await initialize(live, deepseek)
        async with coven_agent(live, gateway):
            stream, _ = await gateway.accept()
            send_message(stream, "r1", "thread-u", "read the notes")
            events = await stream.events("r1")
        session = live.runtime.sessions.get(session_id_for("thread-u"))
    [usage] = [value for kind, value in events if kind == "usage"]
    expected = summed(deepseek.usages)
    assert usage == coven_pb.TokenUsage(
        input_tokens=expected["prompt_tokens"],
        output_tokens=expected["completion_tokens"],
        cache_read_tokens=expected["cache_read_tokens"],
        cache_write_tokens=expected["cache_write_tokens"],
        thinking_tokens=expected["reasoning_tokens"],
    )
    assert usage.cache_read_tokens and usage.thinking_tokens
    assert session.usage.reasoning_tokens == expected["reasoning_tokens"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # Nulls and junk where counts belong are 0, never a crash nor a string in a count.
        (
            {"prompt_tokens": 10, "completion_tokens": None, "prompt_tokens_details": None},
            {"prompt_tokens": 10},
        ),
        (
            {"prompt_tokens": "10", "completion_tokens": True, "completion_tokens_details": ["x"]},
            {},
        ),
        ({"prompt_tokens": 10, "completion_tokens": -3, "total_tokens": 7}, {"prompt_tokens": 10}),
        # Gemini: thoughts only in the total; also when it names them (a proxy's reasoning_tokens).
        (
            {"prompt_tokens": 21, "completion_tokens": 0, "total_tokens": 81},
            {"prompt_tokens": 21, "completion_tokens": 60, "reasoning_tokens": 60},
        ),
        (
            {
                "prompt_tokens": 21,
                "completion_tokens": 0,
                "total_tokens": 81,
                "completion_tokens_details": {"reasoning_tokens": 60},
            },
            {"prompt_tokens": 21, "completion_tokens": 60, "reasoning_tokens": 60},
        ),
        # OpenAI's details win over the other places a server may also fill.
        (
            {"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 20}, "cached_tokens": 5},
            {"prompt_tokens": 50, "cache_read_tokens": 20},
        ),
    ],
)
def test_odd_usage_objects(raw: dict[str, Any], expected: dict[str, int]) -> None:
    assert {part: value for part, value in vars(usage_of(raw)).items() if value} == expected
