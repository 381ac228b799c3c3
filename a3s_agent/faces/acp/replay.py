"""A stored history as the session updates that show it again (`session/load`): the user's
prompts, the agent's answers, its tool calls with their outcomes, and its plan."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from acp.schema import AgentMessageChunk, ToolCallProgress

from ...app.types import Tool
from ...base.models import Message, ToolCall
from .content import text_block, user_chunks
from .describe import ToolContent, shown_output, started
from .outbox import SessionUpdate
from .plan import PLAN_TOOL, plan_update


def replay(history: list[Message], workspace: Path, tools: Mapping[str, Tool]) -> Iterator[SessionUpdate]:
    calls: dict[str, tuple[ToolCall, list[ToolContent]]] = {}
    for message in history:
        if message.role == "user":
            yield from user_chunks(message)
        elif message.role == "assistant":
            if message.content:
                yield AgentMessageChunk(
                    session_update="agent_message_chunk", content=text_block(message.content)
                )
            for call in message.tool_calls:
                if call.name == PLAN_TOOL:
                    calls[call.id] = (call, [])
                    continue
                # Without the file's text now: it is what the edits made of it, not what they changed.
                start = started(call, tools.get(call.name), workspace, current_text=False)
                calls[call.id] = (call, list(start.content or []))
                yield start
        elif message.role == "tool" and message.tool_call_id in calls:
            call, content = calls[message.tool_call_id]
            yield from _outcome(call, content, message)


def _outcome(call: ToolCall, content: list[ToolContent], message: Message) -> Iterator[SessionUpdate]:
    success = message.metadata.get("success", "true") == "true"
    if call.name == PLAN_TOOL:
        plan = plan_update(call.arguments) if success else None
        if plan is not None:
            yield plan
        return
    shown = [*content, *shown_output(message)]
    yield ToolCallProgress(
        session_update="tool_call_update",
        tool_call_id=call.id,
        status="completed" if success else "failed",
        content=shown,
    )
