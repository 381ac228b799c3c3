"""A generation's events as log entries (kind "chunk"), so that a client that lost its stream can
resume it from the last seq it saw: each AgentEvent to JSON and back, and how a run ended when it
did not end with a DoneEvent (the domain error, by kind and message)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ...base import errors
from ...base.models import Attachment, Message, ToolCall, Usage
from ...tools.registry import ToolOutput
from ..store.events import CHUNK, now_ms
from ..store.protocol import LogEntry
from .agent import (
    AgentEvent,
    DoneEvent,
    Generation,
    NoticeEvent,
    TextEvent,
    ThinkingEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from .budget import BudgetSpent


def chunk_entry(session_id: str, run_id: str, event: AgentEvent) -> LogEntry:
    return LogEntry(session_id, CHUNK, {"run": run_id, "chunk": _encode(event)}, now_ms())


def failure_entry(session_id: str, run_id: str, error: errors.AgentError) -> LogEntry:
    """How a run ended without a result: the error its stream raises, for whoever resumes it."""
    failed = {"kind": type(error).__name__, "message": str(error)}
    return LogEntry(session_id, CHUNK, {"run": run_id, "failed": failed}, now_ms())


def entry_chunk(entry: LogEntry) -> AgentEvent:
    """The event a chunk entry records; raises the run's error for the entry that ended it."""
    body = entry.body
    if "failed" in body:
        kind = getattr(errors, body["failed"]["kind"], errors.AgentError)
        if not (isinstance(kind, type) and issubclass(kind, errors.AgentError)):
            kind = errors.AgentError
        raise kind(body["failed"]["message"])
    return _decode(body["chunk"])


def _message(message: Message) -> dict[str, Any]:
    return {"role": message.role, "content": message.content, "data": message.to_json()}


def _output(output: ToolOutput) -> dict[str, Any]:
    return {
        "success": output.success,
        "output": output.output,
        "error": output.error,
        "metadata": output.metadata,
        "attachments": [a.to_json() for a in output.attachments],
    }


def _encode(event: AgentEvent) -> dict[str, Any]:
    match event:
        case TextEvent(text):
            return {"text": text}
        case ThinkingEvent(text):
            return {"thinking": text}
        case ToolCallEvent(call):
            return {"tool_call": call.to_json()}
        case ToolResultEvent(call, result):
            return {"tool_result": {"call": call.to_json(), "output": _output(result)}}
        case TurnEvent(turn, usage, finish_reason):
            return {"turn": {"turn": turn, "usage": usage.counts(), "finish_reason": finish_reason}}
        case NoticeEvent(data):
            return {"notice": data}
        case DoneEvent(generation):
            g = generation
            return {
                "done": {
                    "message": _message(g.message),
                    "tool_calls": [{"call": c.to_json(), "output": _output(o)} for c, o in g.tool_calls],
                    "usage": g.usage.counts(),
                    "finish_reason": g.finish_reason,
                    "turns": g.turns,
                    "model": g.model,
                    "duration_ms": g.duration_ms,
                    "intermediate": [_message(m) for m in g.intermediate],
                    "budget_spent": None if g.budget_spent is None else asdict(g.budget_spent),
                }
            }
    raise TypeError(f"not a generation event: {event!r}")


def _to_message(data: dict[str, Any]) -> Message:
    return Message.from_json(data["role"], data["content"], data["data"])


def _to_output(data: dict[str, Any]) -> ToolOutput:
    attachments = [Attachment.from_json(a) for a in data["attachments"]]
    return ToolOutput(data["success"], data["output"], data["error"], data["metadata"], attachments)


def _decode(data: dict[str, Any]) -> AgentEvent:
    if "text" in data:
        return TextEvent(data["text"])
    if "thinking" in data:
        return ThinkingEvent(data["thinking"])
    if "tool_call" in data:
        return ToolCallEvent(ToolCall(**data["tool_call"]))
    if "tool_result" in data:
        result = data["tool_result"]
        return ToolResultEvent(ToolCall(**result["call"]), _to_output(result["output"]))
    if "turn" in data:
        turn = data["turn"]
        return TurnEvent(turn["turn"], Usage(**turn["usage"]), turn["finish_reason"])
    if "notice" in data:
        return NoticeEvent(data["notice"])
    done = data["done"]
    spent = done["budget_spent"]
    return DoneEvent(
        Generation(
            message=_to_message(done["message"]),
            tool_calls=[(ToolCall(**t["call"]), _to_output(t["output"])) for t in done["tool_calls"]],
            usage=Usage(**done["usage"]),
            finish_reason=done["finish_reason"],
            turns=done["turns"],
            model=done["model"],
            duration_ms=done["duration_ms"],
            intermediate=[_to_message(m) for m in done["intermediate"]],
            budget_spent=None if spent is None else BudgetSpent(**spent),
        )
    )
