"""Crash repair: every tool call in a history is answered before the history goes to a model.

A server killed while a tool ran leaves the model's assistant turn (its tool calls) stored and the
results missing; providers that check the pairing (OpenAI, Anthropic) refuse such a history with a
400, so the session could never generate again. `answer_interrupted_calls`, run before a
generation's first model call, stores an error result for each call without one (reading
INTERRUPTED, so the model knows the call may have half-run), and moves a result stored after
another writer's messages (ExecuteTool recording into a session while a generation ran) back
next to its call.
"""

from __future__ import annotations

import logging

from ...base.models import Message
from ...tools.registry import ToolOutput
from ..sessions.manager import SessionManager
from .tool_runner import tool_message

INTERRUPTED = "interrupted: the server stopped before this call finished"

log = logging.getLogger(__name__)


def paired(history: list[Message]) -> list[Message] | None:
    """`history` with each assistant turn's tool calls directly followed by one result each, or None
    when it already is. A missing result becomes an INTERRUPTED error result; a result stored
    further on is moved up; everything else keeps its order (the messages are the same objects)."""
    out: list[Message] = []
    moved: set[int] = set()  # indices of results placed next to their call already
    changed = False
    for index, message in enumerate(history):
        if index in moved:
            continue
        out.append(message)
        if message.role != "assistant" or not message.tool_calls:
            continue
        pending = {call.id: call for call in message.tool_calls}
        position = index + 1
        while position < len(history) and history[position].role == "tool" and pending:
            if history[position].tool_call_id not in pending:
                break
            del pending[history[position].tool_call_id]
            out.append(history[position])
            moved.add(position)
            position += 1
        for call in list(pending.values()):
            later = _later_result(history, position, call.id, moved)
            if later is None:
                out.append(tool_message(call, ToolOutput(success=False, error=INTERRUPTED)))
            else:
                out.append(history[later])
                moved.add(later)
            changed = True
    return out if changed else None


def _later_result(history: list[Message], start: int, call_id: str, taken: set[int]) -> int | None:
    """Where the result of `call_id` lies from `start` on, before any later turn making a call of
    the same id (whose result it would be)."""
    for position in range(start, len(history)):
        message = history[position]
        if message.role == "assistant" and any(c.id == call_id for c in message.tool_calls):
            return None
        if message.role == "tool" and message.tool_call_id == call_id and position not in taken:
            return position
    return None


async def answer_interrupted_calls(sessions: SessionManager, session_id: str) -> None:
    """Store the paired form of the session's history, in one transaction, when it is not paired:
    appended results when only the end lacked them, else the whole history rewritten (the old
    one archived, as compaction does)."""
    history = await sessions.history(session_id)
    fixed = paired(history)
    if fixed is None:
        return
    added = len(fixed) - len(history)
    if all(a is b for a, b in zip(fixed, history, strict=False)):
        await sessions.append_messages(session_id, fixed[len(history) :])
    else:
        await sessions.replace_history(session_id, fixed)
    log.warning(
        "session %s: tool results paired with their calls; %d call(s) without one (the server"
        " stopped while they ran) answered as interrupted",
        session_id,
        added,
    )
