"""Context accounting and compaction through the real server and the in-process scripted model."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from a3s_agent.base.errors import Unavailable
from a3s_agent.base.models import Message, ToolCall
from a3s_agent.core.loop.context import _count, byte_bound
from a3s_agent.llm.json_body import fixed_json
from a3s_agent.llm.messages import to_openai, tool_schema
from a3s_agent.llm.tokens import TokenCounter
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import text
from a3s_agent.tools.builtin import builtin_tools

from .conftest import LiveServer, new_session, user
from .scripted_model import ScriptedProvider
from .test_compaction import is_summary_request, summaries

ROLE = pb.Message


def _long(index: int) -> str:
    return f"message {index}: " + " ".join(f"word{index}_{n}" for n in range(300))


async def _big_session(
    server: LiveServer, *, auto_compact: bool, window: int = 30_000, count: int = 60
) -> str:
    """A session with a first task and `count` long exchanged messages, plus a real tool call pair."""
    context = [pb.Message(role=ROLE.ROLE_USER, content="THE TASK: refactor the parser")]
    context += [
        pb.Message(role=ROLE.ROLE_ASSISTANT if i % 2 else ROLE.ROLE_USER, content=_long(i))
        for i in range(count)
    ]
    reply = await server.stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(auto_compact=auto_compact, max_context_length=window),
            initial_context=context,
        )
    )
    (server.workspace / "notes.txt").write_text("tool output " * 200)
    await server.stub.ExecuteTool(
        pb.ExecuteToolRequest(
            session_id=reply.session_id, tool_name="read_file", arguments=json.dumps({"path": "notes.txt"})
        )
    )
    return reply.session_id


async def test_usage_counts_the_conversation_as_it_will_be_sent(scripted_agent: LiveServer) -> None:
    session_id = await new_session(scripted_agent, system_prompt="Be exact.")
    await scripted_agent.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=session_id, tool_name="list_files", arguments="{}")
    )
    usage = (
        await scripted_agent.stub.GetContextUsage(pb.GetContextUsageRequest(session_id=session_id))
    ).usage
    history = await scripted_agent.runtime.sessions.history(session_id)
    counter = TokenCounter("scripted-model")
    tools = [
        tool_schema(t)
        for t in scripted_agent.runtime.tools_for(scripted_agent.runtime.sessions.get(session_id))
    ]
    prompt = scripted_agent.runtime.prompt_for(scripted_agent.runtime.sessions.get(session_id))
    assert prompt.startswith("Be exact.\n\n# Workspace\n")  # facts found when ExecuteTool prepared the tools
    read = [
        {"role": "system", "content": prompt},
        *(to_openai(m) for m in history if m.role != "assistant"),
    ]
    written = [to_openai(m) for m in history if m.role == "assistant"]
    assert usage.prompt_tokens == counter.count_messages(read) + counter.count_tools(tools)
    assert usage.completion_tokens == counter.count_messages(written)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.message_count == 2
    session = (await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.context_usage == usage


async def test_a_long_session_is_compacted_automatically_and_carries_on(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    summary = text("Goal: refactor the parser. Decisions: keep the API. Next step: tests.")
    scripted.fallback = summaries(summary, lambda _: text("continuing"))
    session_id = await _big_session(scripted_agent, auto_compact=True)
    before = (
        await scripted_agent.stub.GetContextUsage(pb.GetContextUsageRequest(session_id=session_id))
    ).usage
    assert before.total_tokens > 0.8 * 30_000
    chunks = [
        c
        async for c in scripted_agent.stub.StreamGenerate(
            pb.GenerateRequest(session_id=session_id, messages=[user("go on")])
        )
    ]
    notice = next(c for c in chunks if c.metadata.get("type") == "context_compacted")
    assert int(notice.metadata["after_tokens"]) < int(notice.metadata["before_tokens"])
    assert notice.metadata["summarized_by"] == "llm"
    *summary_requests, turn = scripted.requests
    assert summary_requests and all(is_summary_request(r.body) for r in summary_requests)
    assert all(not r.tools for r in summary_requests)
    sent = turn.messages
    assert sent[1] == {"role": "user", "content": "THE TASK: refactor the parser"}  # the task stays
    assert sent[2]["content"].startswith("[Summary of") and "keep the API" in sent[2]["content"]
    assert sent[-1] == {"role": "user", "content": "go on"}
    # The recent tail keeps each tool call with its result.
    calls = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == calls
    after = (
        await scripted_agent.stub.GetContextUsage(pb.GetContextUsageRequest(session_id=session_id))
    ).usage
    assert after.total_tokens < before.total_tokens and after.message_count < before.message_count


async def test_without_the_llm_compaction_still_shrinks_the_context(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(Unavailable("the LLM provider failed (HTTP 500): summariser down"))
    session_id = await _big_session(scripted_agent, auto_compact=False, count=40)
    reply = await scripted_agent.stub.CompactContext(pb.CompactContextRequest(session_id=session_id))
    assert reply.success
    assert reply.after.total_tokens < reply.before.total_tokens
    assert reply.after.total_tokens <= 0.8 * 30_000 * 0.5 + 6000  # target, plus the kept head and tail
    history = await scripted_agent.runtime.sessions.history(session_id)
    assert history[0].content == "THE TASK: refactor the parser"
    assert any("earlier messages were removed" in m.content for m in history)


async def test_compacting_a_small_session_changes_nothing(scripted_agent: LiveServer) -> None:
    session_id = await new_session(scripted_agent)
    reply = await scripted_agent.stub.CompactContext(pb.CompactContextRequest(session_id=session_id))
    assert reply.success and reply.before == reply.after


async def test_clear_context_drops_the_history_but_keeps_the_session(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(text("hi"), text("fresh start"))
    session_id = await new_session(scripted_agent, name="keep", system_prompt="sys")
    await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("remember 42")])
    )
    assert (await scripted_agent.stub.ClearContext(pb.ClearContextRequest(session_id=session_id))).success
    session = (await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.context_usage.message_count == 0 and session.config.name == "keep"
    await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("what number?")])
    )
    system, *rest = scripted.requests[-1].messages
    assert system["content"].startswith("sys\n\n# Workspace\n")
    assert [m["content"] for m in rest] == ["what number?"]


@pytest.mark.parametrize("rpc", ["GetContextUsage", "CompactContext", "ClearContext"])
async def test_context_rpcs_need_a_known_session(live: LiveServer, rpc: str) -> None:
    request = getattr(pb, f"{rpc}Request")(session_id="ghost")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(live.stub, rpc)(request)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_window_is_in_capabilities(live: LiveServer, tmp_path: Path) -> None:
    caps = await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert caps.limits.max_context_tokens == 2_000_000
    assert "auto_compaction" in caps.features


_TEXTS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200) | st.sampled_from(
    ["", "  \n\n  ", "日本語のテキスト", "🙂" * 40, "a" * 3000, "def f(x):\n    return x * 2\n" * 20]
)
_CALLS = st.lists(st.builds(ToolCall, id=_TEXTS, name=_TEXTS, arguments=_TEXTS), max_size=3)
_MESSAGES = st.lists(
    st.one_of(
        st.builds(Message, role=st.sampled_from(["user", "system"]), content=_TEXTS),
        st.builds(Message, role=st.just("assistant"), content=_TEXTS, tool_calls=_CALLS),
        st.builds(Message, role=st.just("tool"), content=_TEXTS, tool_call_id=_TEXTS),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=_TEXTS, history=_MESSAGES, with_tools=st.booleans())
@example(  # where the bound is tightest: nothing but the overheads, roles and the id-less prefix
    prompt="",
    history=[Message("user"), Message("assistant"), Message("tool", tool_call_id="c"), Message("tool")] * 50,
    with_tools=False,
)
def test_the_byte_bound_is_never_below_the_exact_count(
    prompt: str, history: list[Message], with_tools: bool
) -> None:
    """The auto-compaction check skips the count when the bound fits under the threshold: a
    bound below the exact count would skip a compaction the count would do."""
    schemas = [tool_schema(t) for t in builtin_tools()] if with_tools else []
    exact = _count(TokenCounter("gpt-4o"), prompt, schemas, fixed_json(schemas), history).total_tokens
    bound = byte_bound(prompt, fixed_json(schemas).text, history, float("inf"))
    assert bound is not None and bound >= exact
    assert byte_bound(prompt, fixed_json(schemas).text, history, bound - 1) is None
