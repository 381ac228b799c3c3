"""Compaction to a token budget, through the real server and the in-process scripted model: what the
model receives stays within the window, overflow errors are recovered, a failed summary falls back,
pinned messages survive, and the per-session settings travel in request metadata. How providers say
"too long" on the wire is tested against the real-HTTP fake LLM."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from a3s_agent.base.errors import Unavailable
from a3s_agent.faces.grpc.convert import message_from_pb
from a3s_agent.llm.tokens import TokenCounter
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import Error, FakeLLM, error, text, tool_call

from .conftest import LiveServer, user
from .scripted_model import ScriptedProvider, ScriptedTurn, overflow

ROLE = pb.Message
WINDOW = 32_000
COUNTER = TokenCounter("fake-model")  # the model the agent fixture configures: the server counts with it
TASK = "THE TASK: refactor the parser"


def is_summary_request(body: dict[str, Any]) -> bool:
    return str(body["messages"][0].get("content", "")).startswith("Summarise the conversation")


def summaries(
    answer: ScriptedTurn, main: Callable[[dict[str, Any]], ScriptedTurn]
) -> Callable[[dict[str, Any]], ScriptedTurn]:
    """A turn for the model's fallback: `answer` to every summary request, `main` to the others."""
    return lambda body: answer if is_summary_request(body) else main(body)


def sent_tokens(body: dict[str, Any]) -> int:
    """The prompt the fake received, counted with the server's tokenizer."""
    return COUNTER.count_messages(body["messages"]) + COUNTER.count_tools(body.get("tools") or [])


def main_requests(model: ScriptedProvider) -> list[dict[str, Any]]:
    return [r.body for r in model.requests if not is_summary_request(r.body)]


def _words(tag: str, count: int) -> str:
    return " ".join(f"{tag}w{n}" for n in range(count))


async def _session(
    server: LiveServer,
    *,
    auto_compact: bool,
    window: int = WINDOW,
    count: int = 0,
    extra: list[pb.Message] | None = None,
    metadata: tuple[tuple[str, str], ...] = (),
) -> str:
    """A session with the first task, `count` long exchanged messages and `extra` ones after them."""
    context = [pb.Message(role=ROLE.ROLE_USER, content=TASK)]
    context += [
        pb.Message(role=ROLE.ROLE_ASSISTANT if i % 2 else ROLE.ROLE_USER, content=_words(f"m{i}", 600))
        for i in range(count)
    ]
    context += extra or []
    reply = await server.stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(auto_compact=auto_compact, max_context_length=window),
            initial_context=context,
        ),
        metadata=metadata,
    )
    return reply.session_id


async def _stream(
    server: LiveServer, session_id: str, content: str, **options: Any
) -> list[pb.GenerateChunk]:
    request = pb.GenerateRequest(session_id=session_id, messages=[user(content)])
    if options:
        request.options.CopyFrom(pb.GenerateOptions(enable_tools=True, **options))
    return [c async for c in server.stub.StreamGenerate(request)]


def _compactions(chunks: list[pb.GenerateChunk]) -> list[dict[str, str]]:
    return [dict(c.metadata) for c in chunks if c.metadata.get("type") == "context_compacted"]


async def test_sixty_large_tool_turns_stay_within_the_window(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    for n in range(60):
        words = _words(f"f{n}", 500).split()
        (scripted_agent.workspace / f"out{n}.txt").write_text(
            "".join(" ".join(words[i : i + 10]) + "\n" for i in range(0, 500, 10))
        )
    tool_outputs = sum(COUNTER.count_text(_words(f"f{n}", 500)) for n in range(60))
    assert tool_outputs > 60 * 1_400  # about 1,500 tokens each: far more than the window in all
    turns = iter(
        [tool_call("read_file", {"path": f"out{n}.txt"}, id=f"call_{n}") for n in range(60)] + [text("done")]
    )
    scripted.fallback = summaries(
        text("Goal: refactor the parser. Next step: read more files."), lambda _: next(turns)
    )
    session_id = await _session(scripted_agent, auto_compact=True)
    chunks = await _stream(scripted_agent, session_id, "read every file", max_tool_calls=100)

    assert chunks[-1].type == pb.GenerateChunk.CHUNK_TYPE_DONE
    compactions = _compactions(chunks)
    assert compactions and all(c["summarized_by"] == "llm" for c in compactions)
    assert all("refactor the parser" in c["summary"] for c in compactions)
    bodies = main_requests(scripted)
    assert len(bodies) == 61
    for number, body in enumerate(bodies):
        assert sent_tokens(body) < WINDOW, f"request {number} overflowed the window"
        assert body["messages"][1] == {"role": "user", "content": TASK}  # the task is always seen
        if number:  # and the latest message: the result of the call just made
            assert body["messages"][-1]["role"] == "tool"
            assert body["messages"][-1]["tool_call_id"] == f"call_{number - 1}"
            assert f"f{number - 1}w499" in body["messages"][-1]["content"]
    # The summariser's own requests fit the window too.
    assert all(sent_tokens(r.body) < WINDOW for r in scripted.requests if is_summary_request(r.body))
    # Every compaction brought the whole prompt to the target share (50%) of the window.
    assert all(int(c["after_tokens"]) <= WINDOW // 2 for c in compactions)


async def test_a_provider_overflow_is_recovered_by_one_compaction_and_a_retry(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    refusal = overflow(
        "This model's maximum context length is 16384 tokens. However, your messages resulted in 60000"
    )
    answers: Iterator[ScriptedTurn] = iter([refusal, text("carried on")])
    scripted.fallback = summaries(text("Goal: refactor the parser."), lambda _: next(answers))
    # 200,000 tokens (A3S's default window) is accepted; the history is far under its threshold.
    session_id = await _session(scripted_agent, auto_compact=True, window=200_000, count=40)
    chunks = await _stream(scripted_agent, session_id, "go on")

    assert chunks[-1].type == pb.GenerateChunk.CHUNK_TYPE_DONE
    assert "carried on" in "".join(c.content for c in chunks)
    [compaction] = _compactions(chunks)
    assert compaction["summarized_by"] == "llm"
    refused, retried = main_requests(scripted)
    assert sent_tokens(retried) <= sent_tokens(refused) // 2
    assert retried["messages"][1]["content"] == TASK and retried["messages"][-1]["content"] == "go on"


async def test_an_overflow_refused_again_after_compacting_is_failed_precondition(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    refusal = overflow("prompt is too long: 210000 tokens > 200000 maximum")
    scripted.fallback = summaries(text("summary"), lambda _: refusal)
    session_id = await _session(scripted_agent, auto_compact=True, window=200_000, count=40)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await scripted_agent.stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("go on")])
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "refused again after compacting" in err.value.details()
    assert len(main_requests(scripted)) == 2  # one retry, no more


@pytest.mark.parametrize(
    "refusal",
    [
        error(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded"),
        error(400, "prompt is too long: 210000 tokens > 200000 maximum"),
        error(400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"),
        error(400, "The decoder prompt (length 9000) is longer than the model's context length 8192"),
        error(
            400,
            "the request exceeds the available context size, try increasing it",
            type="exceed_context_size_error",
        ),
        error(500, "context size exceeded", should_retry=False),
    ],
    ids=["openai", "anthropic", "vllm", "vllm-decoder", "llama.cpp", "llama.cpp-500"],
)
async def test_an_overflow_without_auto_compact_names_it_and_compact_context(
    agent: LiveServer, fake: FakeLLM, refusal: Error
) -> None:
    fake.script(refusal)
    session_id = await _session(agent, auto_compact=False, count=2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go on")]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "context window" in err.value.details() and "CompactContext" in err.value.details()
    assert len(fake.requests) == 1  # no compaction, no retry


async def test_a_failing_summary_falls_back_and_leaves_the_session_whole(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    pair = [
        pb.Message(role=ROLE.ROLE_USER, content="look at the notes"),
    ]
    down = Unavailable("the LLM provider failed (HTTP 500): summariser down")
    scripted.fallback = summaries(down, lambda _: text("carried on"))
    session_id = await _session(scripted_agent, auto_compact=True, count=60, extra=pair)
    (scripted_agent.workspace / "notes.txt").write_text("tool output " * 200)
    await scripted_agent.stub.ExecuteTool(
        pb.ExecuteToolRequest(
            session_id=session_id, tool_name="read_file", arguments=json.dumps({"path": "notes.txt"})
        )
    )
    before = await scripted_agent.runtime.sessions.history(session_id)
    chunks = await _stream(scripted_agent, session_id, "go on")

    assert chunks[-1].type == pb.GenerateChunk.CHUNK_TYPE_DONE
    [compaction] = _compactions(chunks)
    assert (
        compaction["summarized_by"] == "fallback" and "earlier messages were removed" in compaction["summary"]
    )
    [body] = main_requests(scripted)
    assert sent_tokens(body) <= WINDOW // 2 + 200  # the target, plus the turn's new reply budget
    assert body["messages"][1]["content"] == TASK and body["messages"][-1]["content"] == "go on"
    history = await scripted_agent.runtime.sessions.history(session_id)
    assert [m.metadata.get("compaction") for m in history].count("note") == 1
    calls = [c.id for m in history if m.role == "assistant" for c in m.tool_calls]
    assert calls == [m.tool_call_id for m in history if m.role == "tool"]  # no call without its result
    # The store holds exactly the compacted history; the originals stay readable as archived rows.
    assert await scripted_agent.runtime.store.load_messages(session_id) == history
    archived = await scripted_agent.runtime.sessions.archived(session_id)
    assert [m.content for m in archived] == [m.content for m in before] + ["go on"]


async def test_pinned_messages_and_the_summary_survive_compaction(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    pinned = pb.Message(
        role=ROLE.ROLE_USER, content="PINNED: never touch vendor/", metadata={"pinned": "true"}
    )
    scripted.fallback = summaries(text("Goal: refactor the parser."), lambda _: text("ok"))
    later = [
        pb.Message(role=ROLE.ROLE_ASSISTANT if i % 2 else ROLE.ROLE_USER, content=_words(f"late{i}", 600))
        for i in range(30)
    ]
    session_id = await _session(scripted_agent, auto_compact=False, count=30, extra=[pinned, *later])
    reply = await scripted_agent.stub.CompactContext(pb.CompactContextRequest(session_id=session_id))
    assert reply.after.total_tokens <= WINDOW // 2 < reply.before.total_tokens
    history = await scripted_agent.runtime.sessions.history(session_id)
    assert history[0].content == TASK
    assert any(m.content == "PINNED: never touch vendor/" and m.metadata["pinned"] == "true" for m in history)
    [summary] = [m for m in history if m.metadata.get("compaction") == "summary"]
    assert "refactor the parser" in summary.content
    # A second compaction keeps the pin too, and folds the first summary into the new one.
    await scripted_agent.runtime.sessions.append_messages(
        session_id, [message_from_pb(m, "later") for m in later]
    )
    first = len(scripted.requests)
    await scripted_agent.stub.CompactContext(pb.CompactContextRequest(session_id=session_id))
    history = await scripted_agent.runtime.sessions.history(session_id)
    assert any(m.content == "PINNED: never touch vendor/" for m in history)
    assert [m.metadata.get("compaction") for m in history].count("summary") == 1
    read = [r.messages[1]["content"] for r in scripted.requests[first:] if is_summary_request(r.body)]
    assert read[0].startswith("user: [Summary of ") and "refactor the parser" in read[0]


async def test_pinned_content_over_the_budget_is_failed_precondition(scripted_agent: LiveServer) -> None:
    huge_task = pb.Message(role=ROLE.ROLE_USER, content=_words("task", 4_000))
    reply = await scripted_agent.stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(max_context_length=8_000),
            initial_context=[huge_task, *(user(_words(f"x{i}", 100)) for i in range(5))],
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await scripted_agent.stub.CompactContext(pb.CompactContextRequest(session_id=reply.session_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pinned content does not fit" in err.value.details()
    assert len(await scripted_agent.runtime.sessions.history(reply.session_id)) == 6  # untouched


async def test_auto_compact_is_switched_off_through_the_metadata_channel(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(text("no compaction"))
    session_id = await _session(scripted_agent, auto_compact=True, count=40)
    # proto3 cannot send a false auto_compact in a merge: replace mode takes the config as sent.
    call = scripted_agent.stub.ConfigureSession(
        pb.ConfigureSessionRequest(
            session_id=session_id, config=pb.SessionConfig(auto_compact=False, max_context_length=200_000)
        ),
        metadata=(("a3s-config-mode", "replace"), ("a3s-compact-threshold", "0.7")),
    )
    reply = await call
    assert not reply.session.config.auto_compact and reply.session.config.max_context_length == 200_000
    trailing = dict(await call.trailing_metadata())
    assert trailing["a3s-compact-threshold"] == "0.7" and trailing["a3s-compact-target"] == "0.5"
    await scripted_agent.stub.ConfigureSession(
        pb.ConfigureSessionRequest(session_id=session_id, config=pb.SessionConfig(max_context_length=WINDOW))
    )  # a merge keeps auto_compact off
    chunks = await _stream(scripted_agent, session_id, "go on")
    assert not _compactions(chunks)
    [body] = main_requests(scripted)
    assert len(body["messages"]) == 1 + 41 + 1  # everything was sent: the server compacted nothing
    assert sent_tokens(body) > 0.7 * WINDOW


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ((("a3s-compact-threshold", "1.5"),), "a3s-compact-threshold must be a share"),
        ((("a3s-compact-target", "zero"),), "a3s-compact-target must be a share"),
        ((("a3s-compact-target", "0.9"),), "must be below the compaction threshold"),
        ((("a3s-config-mode", "overwrite"),), "a3s-config-mode must be merge or replace"),
    ],
)
async def test_bad_compaction_metadata_is_refused(
    scripted_agent: LiveServer, metadata: tuple[tuple[str, str], ...], problem: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await scripted_agent.stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and problem in err.value.details()


async def test_per_session_threshold_decides_when_auto_compaction_runs(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.fallback = summaries(text("Goal: refactor the parser."), lambda _: text("ok"))
    # About 55% of the window: under the default threshold (80%), over this session's 50%.
    session_id = await _session(
        scripted_agent,
        auto_compact=True,
        count=6,
        metadata=(("a3s-compact-threshold", "0.5"), ("a3s-compact-target", "0.35")),
    )
    call = scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))
    reply = await call
    assert 0.5 * WINDOW < reply.session.context_usage.total_tokens < 0.8 * WINDOW
    assert dict(await call.trailing_metadata())["a3s-compact-target"] == "0.35"
    [compaction] = _compactions(await _stream(scripted_agent, session_id, "go on"))
    assert int(compaction["after_tokens"]) <= 0.35 * WINDOW


async def test_max_context_length_takes_real_windows_up_to_the_cap(live: LiveServer) -> None:
    reply = await live.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(max_context_length=1_000_000))
    )
    assert reply.session.config.max_context_length == 1_000_000
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.CreateSession(
            pb.CreateSessionRequest(config=pb.SessionConfig(max_context_length=3_000_000))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "2000000" in err.value.details()


async def test_compact_context_summarises_all_but_the_recent_turns_whenever_asked(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    """Far under the target, automatic compaction leaves a session alone, but a client's
    CompactContext summarises it: everything but the newest turns, the task and pins kept."""
    scripted.fallback = summaries(
        text("Goal: refactor the parser. Next step: run the tests."), lambda _: text("ok")
    )
    pinned = pb.Message(
        role=ROLE.ROLE_USER, content="PINNED: never touch vendor/", metadata={"pinned": "true"}
    )
    chat = [
        pb.Message(role=ROLE.ROLE_ASSISTANT if i % 2 else ROLE.ROLE_USER, content=f"message {i}")
        for i in range(10)
    ]
    session_id = await _session(scripted_agent, auto_compact=True, extra=[pinned, *chat])
    assert not _compactions(await _stream(scripted_agent, session_id, "go on"))  # under the threshold
    before = await scripted_agent.runtime.sessions.history(session_id)

    request = pb.CompactContextRequest(session_id=session_id)
    reply = await scripted_agent.stub.CompactContext(request)
    assert reply.success and reply.after.total_tokens < reply.before.total_tokens
    assert (reply.before.message_count, reply.after.message_count) == (len(before), 7)
    history = await scripted_agent.runtime.sessions.history(session_id)
    assert [m.content for m in history[:2]] == [TASK, "PINNED: never touch vendor/"]
    assert history[2].metadata["compaction"] == "summary" and "refactor the parser" in history[2].content
    assert [m.content for m in history[3:]] == ["message 8", "message 9", "go on", "ok"]  # the recent turns
    [summarised] = [r.messages[1]["content"] for r in scripted.requests if is_summary_request(r.body)]
    assert "message 0" in summarised and "message 7" in summarised and "message 8" not in summarised

    # Nothing older than the recent turns but the summary itself: nothing to do, and it says so.
    again = await scripted_agent.stub.CompactContext(request)
    assert again.success and again.before == again.after
    assert len([r for r in scripted.requests if is_summary_request(r.body)]) == 1
    assert await scripted_agent.runtime.sessions.history(session_id) == history
