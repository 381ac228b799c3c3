"""What the log records of the model and the tools a session used, read back for tool metrics and
cost summaries (app/observability.py): the log is durable and shared by every replica.

A generation's model use is in the data of the event that ends it (`spending_data`):
GENERATION_COMPLETED, or the ERROR of one that failed, or the WARNING of one cancelled by a
client. A tool call the model made is in TOOL_COMPLETED's (core/loop/tool_gate.py): the name the model
called it by, whether it succeeded, how long it took."""

from __future__ import annotations

from dataclasses import dataclass

from ...base.models import Usage
from ..store.events import EVENT, EventType
from ..store.protocol import LogEntry


@dataclass(frozen=True)
class Spending:
    """The model calls of one generation and their tokens."""

    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    timestamp: int  # ms since the epoch, when the generation ended


@dataclass(frozen=True)
class ToolUse:
    name: str
    success: bool
    duration_ms: float
    started: int  # ms since the epoch


def spending_data(model: str, calls: int, usage: Usage) -> dict[str, object]:
    """The keys a generation's last event carries for cost summaries."""
    return {"model": model, "model_calls": calls, **usage.counts()}


def spending_of(entry: LogEntry) -> Spending | None:
    """What the entry says a generation spent, if it is a generation's last event."""
    if entry.kind != EVENT:
        return None
    kind, data = entry.body["type"], entry.body["data"]
    if kind == EventType.GENERATION_COMPLETED:
        calls = data.get("model_calls", data.get("turns", "0"))  # turns: a log written before model_calls
    elif kind in (EventType.ERROR, EventType.WARNING) and "model_calls" in data:
        calls = data["model_calls"]
    else:
        return None
    if int(calls) == 0:
        return None
    return Spending(
        model=data.get("model", ""),
        calls=int(calls),
        prompt_tokens=int(data.get("prompt_tokens", 0)),
        completion_tokens=int(data.get("completion_tokens", 0)),
        timestamp=entry.timestamp,
    )


def tool_use_of(entry: LogEntry) -> ToolUse | None:
    """The finished tool call the entry records, if it is a TOOL_COMPLETED event."""
    if entry.kind != EVENT or entry.body["type"] != EventType.TOOL_COMPLETED:
        return None
    data = entry.body["data"]
    duration = float(data.get("duration_ms", 0))
    return ToolUse(
        name=data.get("tool_name", ""),
        success=data.get("success") == "true",
        duration_ms=duration,
        started=entry.timestamp - round(duration),
    )
