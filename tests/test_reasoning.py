"""The model's reasoning streamed as it comes and shown, never taken for the answer: DeepSeek's
`reasoning_content` (a3s_agent/testing/fake_llm.py's deepseek-reasoning dialect) and Anthropic's
thinking blocks (a3s_agent/testing/fake_anthropic.py with thinking on) reach an editor over a real
ACP pipe as `agent_thought_chunk` updates before the answer, and a gRPC StreamGenerate client as
METADATA chunks of type `reasoning_delta`, never as content; the stored session and Generate's
answer hold none of it. Then the readers: vLLM's, OpenRouter's and Ollama's `reasoning` alias, and
redacted thinking (nothing to show)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from acp import text_block
from acp.schema import AgentMessageChunk, AgentThoughtChunk, ToolCallStart

from a3s_agent.llm.anthropic_request import BLOCKS
from a3s_agent.llm.anthropic_stream import MessageReader
from a3s_agent.llm.openai_stream import TurnReader
from a3s_agent.llm.provider import ReasoningDelta, TextDelta, TurnEnd
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_anthropic import text as claude_text
from a3s_agent.testing.fake_anthropic import tool_call as claude_tool_call
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import agent_settings, initialize, new_session, running, user
from .test_acp import Editor, acp_agent

NOTES = "hello from the notes\n"
KEY = "sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0L"


def deepseek_reasoning(reply: int) -> str:
    """What the fake DeepSeek streams as `reasoning_content` before its reply number `reply`."""
    return f"The user wants reply {reply}; I will work it out step by step."


def claude_thinking(reply: int) -> str:
    """What the fake Anthropic API streams as the thinking block of its reply number `reply`."""
    return f"The user wants reply {reply}; let me think it through step by step."


def runs_of(updates: list[Any]) -> list[tuple[type, str]]:
    """The model's side of a prompt as runs of one kind of update (thought, tool call start,
    answer), each with its text: the order the editor saw them in."""
    runs: list[tuple[type, str]] = []
    for update in updates:
        kind = type(update)
        if kind not in (AgentThoughtChunk, ToolCallStart, AgentMessageChunk):
            continue
        if runs and runs[-1][0] is kind:
            runs[-1] = (kind, runs[-1][1] + shown_text(update))
        else:
            runs.append((kind, shown_text(update)))
    return runs


def shown_text(update: Any) -> str:
    return str(update.content.text) if isinstance(update, AgentMessageChunk | AgentThoughtChunk) else ""


@pytest.mark.parametrize("provider", ["deepseek", "anthropic+thinking"])
async def test_acp_thought_chunks_come_before_the_answer_and_are_never_stored(
    workspace: Path, tmp_path: Path, provider: str
) -> None:
    (workspace / "notes.txt").write_text(NOTES)
    data = tmp_path / "data"
    env: dict[str, str] = {}
    fake: FakeLLM | FakeAnthropic
    # Each event a network write of its own (what one read brings together goes on as one delta).
    apart = 0.002
    if provider == "deepseek":
        fake = FakeLLM(
            replace(tool_call("read_file", {"path": "notes.txt"}, id="read"), chunk_delay=apart),
            replace(text("The notes say hello."), chunk_delay=apart),
            dialect="deepseek-reasoning",
        )
        thought = deepseek_reasoning
    else:
        fake = FakeAnthropic(api_key=KEY, redacted=True)
        fake.script(
            replace(claude_tool_call("read_file", {"path": "notes.txt"}), chunk_delay=apart),
            replace(claude_text("The notes say hello."), chunk_delay=apart),
        )
        env = {"A3S_LLM_PROVIDER": provider, "A3S_LLM_MODEL": "claude-sonnet-4-5", "A3S_LLM_API_KEY": KEY}
        thought = claude_thinking
    async with fake:
        editor = Editor()
        async with acp_agent(editor, workspace, fake, data, env=env) as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            reply = await conn.prompt(session_id=session_id, prompt=[text_block("What do the notes say?")])
        assert reply.stop_reason == "end_turn"
        if isinstance(fake, FakeAnthropic):
            assert fake.refusals == []  # the thinking went back signed, as the API demands

        # Each model turn: its reasoning first, streamed in pieces, then its call or its answer.
        assert runs_of(editor.updates) == [
            (AgentThoughtChunk, thought(1)),
            (ToolCallStart, ""),
            (AgentThoughtChunk, thought(2)),
            (AgentMessageChunk, "The notes say hello."),
        ]
        assert len([u for u in editor.updates if isinstance(u, AgentThoughtChunk)]) > 2

        # Stored without it: a new process replays the session with no thought and no reasoning,
        # and the model got its earlier answer back without it as content.
        again = Editor()
        async with acp_agent(again, workspace, fake, data, env=env) as conn:
            await conn.load_session(cwd=str(workspace), session_id=session_id, mcp_servers=[])
        assert again.updates and not any(isinstance(u, AgentThoughtChunk) for u in again.updates)
        assert not any("step by step" in shown_text(u) for u in again.updates)
        assert "The notes say hello." in [shown_text(u) for u in again.updates]
        assert "step by step" not in answer_sent_back(fake)


def answer_sent_back(fake: FakeLLM | FakeAnthropic) -> str:
    """The text of the assistant turns of the model's last request: what the session stored as the
    answers (Anthropic's signed thinking goes back in its own blocks, as it must)."""
    texts = []
    for message in fake.requests[-1].messages:
        if message["role"] != "assistant":
            continue
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(block.get("text", "") for block in content if block["type"] == "text")
        texts.append(content)
    return "\n".join(texts)


async def test_grpc_stream_sends_reasoning_as_metadata_never_as_content(
    workspace: Path, tmp_path: Path
) -> None:
    (workspace / "notes.txt").write_text(NOTES)
    async with FakeLLM(dialect="deepseek-reasoning") as fake:
        fake.script(tool_call("read_file", {"path": "notes.txt"}), text("Read."), text("Still here."))
        async with running(agent_settings(workspace, tmp_path / "data")) as live:
            await initialize(live, fake)
            session_id = await new_session(live)
            request = pb.GenerateRequest(session_id=session_id, messages=[user("read the notes")])
            chunks = [chunk async for chunk in live.stub.StreamGenerate(request)]
            unary = await live.stub.Generate(
                pb.GenerateRequest(session_id=session_id, messages=[user("anything else?")])
            )

    reasoning = [
        c
        for c in chunks
        if c.type == pb.GenerateChunk.CHUNK_TYPE_METADATA and c.metadata["type"] == "reasoning_delta"
    ]
    assert "".join(c.metadata["text"] for c in reasoning) == deepseek_reasoning(1) + deepseek_reasoning(2)
    assert all(set(c.metadata) == {"type", "text", "seq"} and not c.content for c in reasoning)
    content = [c for c in chunks if c.type == pb.GenerateChunk.CHUNK_TYPE_CONTENT]
    assert "".join(c.content for c in content) == "Read."
    assert chunks.index(reasoning[-1]) < chunks.index(content[0])  # the turn's reasoning, then its answer
    others = [c for c in chunks if c not in reasoning]
    assert not any("step by step" in str(c) for c in others)
    [done] = [c for c in chunks if c.type == pb.GenerateChunk.CHUNK_TYPE_DONE]
    assert done.content == "Read."
    # Generate's answer, and what the model got back as the conversation, hold none of it.
    assert unary.message.content == "Still here." and "step by step" not in str(unary)
    contents = [str(m.get("content") or "") for m in fake.requests[-1].messages if m["role"] != "system"]
    assert "Read." in contents and not any("step by step" in c for c in contents)


# --- the readers -------------------------------------------------------------------------------


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def test_the_reasoning_alias_is_shown_once_and_never_sent_back() -> None:
    """vLLM 0.11 on, OpenRouter and Ollama stream `reasoning`; servers in between send it beside
    `reasoning_content` (shown once); only DeepSeek's field goes back as provider state."""
    reader = TurnReader("endpoint")
    assert reader.feed(_chunk({"role": "assistant", "content": ""})) == []
    assert reader.feed(_chunk({"reasoning": "Weigh 9.11 "})) == [ReasoningDelta("Weigh 9.11 ")]
    assert reader.feed(_chunk({"reasoning": {"effort": "high"}})) == []  # not text: nothing to show
    assert reader.feed(_chunk({"content": "9.8", "reasoning": "against 9.8."})) == [
        ReasoningDelta("against 9.8."),
        TextDelta("9.8"),
    ]
    assert reader.feed(_chunk({}, "stop")) == []
    assert reader.finish() == [TurnEnd("stop", None, {})]

    both = TurnReader("endpoint")
    events = both.feed(_chunk({"reasoning_content": "Think.", "reasoning": "Think."}))
    events += both.feed(_chunk({"content": "Done.", "reasoning_content": None, "reasoning": None}, "stop"))
    assert events == [ReasoningDelta("Think."), TextDelta("Done.")]
    assert both.finish() == [TurnEnd("stop", None, {"endpoint": {"reasoning_content": "Think."}})]


def test_anthropic_thinking_is_shown_and_redacted_thinking_is_not() -> None:
    reader = MessageReader("claude")
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 5}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "Hm, "},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "notes."},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "c2ln"},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "ZW5j"},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Hello."}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]
    shown = [e for event in events for e in reader.feed(event)]
    assert shown == [ReasoningDelta("Hm, "), ReasoningDelta("notes."), TextDelta("Hello.")]
    [end] = reader.finish()
    assert isinstance(end, TurnEnd)
    kept = end.provider_state["claude"][BLOCKS]
    assert kept[0] == {"type": "thinking", "thinking": "Hm, notes.", "signature": "c2ln"}
    assert kept[1] == {"type": "redacted_thinking", "data": "ZW5j"}
