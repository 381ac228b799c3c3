"""A fast first session: while the tokenizer is still loading (the warm-up after ready), session
replies do not wait for it: their context usage is counted chars/4 and marked
`a3s-usage-estimated: true` (gRPC trailing metadata, HTTP headers); GetContextUsage waits for the
exact count; once the load is done, session replies are exact and unmarked; with no load under way,
a session reply counts exactly (loading the tokenizer itself). The load is held on an event in this
process (fresh encoding tables, so pytest's loaded tokenizer does not count)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from a3s_agent.config import Settings
from a3s_agent.core.loop.context import byte_bound
from a3s_agent.llm import messages, tokens
from a3s_agent.llm.json_body import fixed_json
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.runtime.warmup import WarmUp
from a3s_agent.testing.fake_llm import FakeLLM, text

from .conftest import LiveServer, initialize, new_session, running, user
from .test_http import JSON, serving

ESTIMATED = "a3s-usage-estimated"
TEXT = "1234567890 " * 1000  # tiktoken: 5 tokens a group, 5000 in all; chars/4: 2750
WINDOW = 12_000  # a threshold share of it is below the schemas' UTF-8 bytes, above their tokens


class HeldLoad:
    """The tokenizer's loader, held until `release`."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()

    def release(self) -> None:
        self.gate.set()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> HeldLoad:
    hold = HeldLoad()
    real_load = tokens._load

    def load(name: str) -> object:
        hold.entered.set()
        assert hold.gate.wait(60), "the held load was never released"
        return real_load(name)

    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setattr(tokens, "_ASKED", set())
    monkeypatch.setattr(tokens, "_load", load)
    return hold


@pytest.fixture
async def warming(held: HeldLoad, workspace: Path, tmp_path: Path) -> AsyncIterator[LiveServer]:
    """A server whose warm-up has built the tool schemas and is held in the tokenizer's load."""
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data")
    async with running(settings) as server:
        warm_up = WarmUp(server.runtime)
        warm_up.start()
        try:
            assert await asyncio.to_thread(held.entered.wait, 30), "the warm-up never began the load"
            yield server
        finally:
            held.release()
            await warm_up.stop()


def _estimate_bounds(server: LiveServer, session_id: str, content: str) -> tuple[int, int]:
    """chars/4 of what the prompt holds (system prompt, tool schemas as compact JSON, the message),
    give or take the per-message overheads."""
    runtime = server.runtime
    session = runtime.sessions.get(session_id)
    schemas = [messages.tool_schema(t) for t in runtime.tools_for(session)]
    chars = (
        len(runtime.prompt_for(session))
        + len(json.dumps(schemas, ensure_ascii=False, separators=(",", ":")))
        + len(content)
    )
    return chars // 4, chars // 4 + 30


async def test_session_replies_estimate_while_the_tokenizer_loads_and_are_exact_after(
    warming: LiveServer, held: HeldLoad
) -> None:
    stub = warming.stub
    # The warm-up built the offered tools' schemas before it began the load.
    for tool in warming.runtime.tools_for(None):
        kept = messages._SCHEMAS.get(id(tool))
        assert kept is not None and kept[0] is tool, tool.name

    call = stub.CreateSession(pb.CreateSessionRequest(initial_context=[user(TEXT)]), timeout=30)
    created = await call  # answers while the load is held
    assert not held.gate.is_set()
    assert dict(await call.trailing_metadata())[ESTIMATED] == "true"
    session_id = created.session_id
    low, high = _estimate_bounds(warming, session_id, TEXT)
    estimate = created.session.context_usage
    assert low <= estimate.prompt_tokens <= high and estimate.message_count == 1
    assert estimate.completion_tokens == 0

    exact_call = stub.GetContextUsage(pb.GetContextUsageRequest(session_id=session_id))
    pending = asyncio.ensure_future(exact_call)
    got = stub.GetSession(pb.GetSessionRequest(session_id=session_id))
    assert (await got).session.context_usage == estimate
    assert dict(await got.trailing_metadata())[ESTIMATED] == "true"
    assert not pending.done(), "GetContextUsage answered before the tokenizer was loaded"

    held.release()
    exact = (await pending).usage
    assert exact.message_count == 1 and exact.prompt_tokens > estimate.prompt_tokens + 1000

    after = stub.GetSession(pb.GetSessionRequest(session_id=session_id))
    assert (await after).session.context_usage == exact
    assert ESTIMATED not in dict(await after.trailing_metadata())


async def test_the_http_face_marks_the_estimate_in_its_headers(warming: LiveServer, held: HeldLoad) -> None:
    async with serving(warming) as http:
        body = json.dumps({"session_id": "h1", "initial_context": [{"role": "ROLE_USER", "content": TEXT}]})
        async with http.client.post("/sessions", data=body, headers=JSON) as reply:
            assert reply.status == 201 and reply.headers[ESTIMATED] == "true"
            usage = (await reply.json())["session"]["context_usage"]
        low, high = _estimate_bounds(warming, "h1", TEXT)
        assert low <= usage["prompt_tokens"] <= high
        held.release()
        await asyncio.to_thread(tokens.load_encoding, tokens.DEFAULT_ENCODING)  # the load is done
        async with http.client.get("/sessions/h1") as reply:
            assert reply.status == 200 and ESTIMATED not in reply.headers
            exact = (await reply.json())["session"]["context_usage"]
        assert exact["prompt_tokens"] > usage["prompt_tokens"] + 1000


async def test_with_no_load_under_way_a_session_reply_counts_exactly(
    held: HeldLoad, live: LiveServer
) -> None:
    """No warm-up here: the first session reply loads the tokenizer itself and is exact."""
    held.release()
    call = live.stub.CreateSession(pb.CreateSessionRequest(initial_context=[user(TEXT)]))
    created = await call
    assert held.entered.is_set() and ESTIMATED not in dict(await call.trailing_metadata())
    exact = await live.stub.GetContextUsage(pb.GetContextUsageRequest(session_id=created.session_id))
    assert created.session.context_usage == exact.usage


async def test_a_generation_while_the_tokenizer_loads_does_not_wait_for_it(
    warming: LiveServer, held: HeldLoad, fake: FakeLLM
) -> None:
    """The auto-compaction check before each model call: the conversation's UTF-8 bytes (a bound
    on its tokens) fit far below the threshold, so the answer comes with the load still held."""
    await initialize(warming, fake)
    fake.script(text("hello"))
    session_id = await new_session(warming, auto_compact=True)
    reply = await warming.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("hi")]), timeout=10
    )
    assert reply.message.content == "hello" and len(fake.requests) == 1
    assert not held.gate.is_set() and not tokens._ENCODINGS, "the generation loaded the tokenizer"


async def test_a_generation_the_bound_cannot_settle_waits_for_the_exact_count(
    warming: LiveServer, held: HeldLoad, fake: FakeLLM
) -> None:
    """A window so small that the bound (UTF-8 bytes: system prompt, schemas, messages) passes the
    threshold: the check waits for the load, then counts exactly (under the threshold: no
    compaction), and the model is asked."""
    await initialize(warming, fake)
    fake.script(text("hello"))
    session_id = await new_session(warming, auto_compact=True, max_context_length=WINDOW)
    session = warming.runtime.sessions.get(session_id)
    threshold, _ = warming.runtime.context.shares(session)
    schemas = fixed_json([messages.tool_schema(t) for t in warming.runtime.tools_for(session)]).text
    prompt = warming.runtime.prompt_for(session)
    assert byte_bound(prompt, schemas, [], threshold * WINDOW) is None, "the bound must not settle it"
    pending = asyncio.ensure_future(
        warming.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("hi")]), timeout=30)
    )
    await warming.stub.GetSession(pb.GetSessionRequest(session_id=session_id))  # a round trip later
    await asyncio.sleep(0.3)
    assert not pending.done() and not fake.requests, "the model was asked before the exact count"
    held.release()
    reply = await pending
    assert reply.message.content == "hello" and len(fake.requests) == 1
    exact = await warming.stub.GetContextUsage(pb.GetContextUsageRequest(session_id=session_id))
    assert exact.usage.total_tokens <= threshold * WINDOW, "the exact count must fit (no compaction)"
