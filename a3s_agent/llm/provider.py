"""The provider interface: stream one model turn given messages, tool schemas and options."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..base.models import ProviderState, Usage


@dataclass
class CompletionRequest:
    """One model call. `messages` and `tools` are in the Chat Completions JSON shape."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    temperature: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    response_format: dict[str, Any] | None = None
    session_id: str = ""
    workspace: str = ""
    trace_headers: dict[str, str] = field(default_factory=dict)
    """The W3C trace context the request carries (base/telemetry.py's `headers`); {} when off."""


@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    """A piece of the model's reasoning (thinking) as it streams: to show, never part of the answer."""

    text: str


@dataclass
class ToolCallReady:
    """A tool call whose id, name and complete JSON arguments are known."""

    id: str
    name: str
    arguments: str
    provider_state: ProviderState = field(default_factory=dict)
    """Fields of the call to send back to the same provider (Gemini's thought signature)."""


@dataclass
class TurnEnd:
    """The model's turn is over. finish_reason: stop | length | tool_calls | content_filter."""

    finish_reason: str
    usage: Usage | None = None
    provider_state: ProviderState = field(default_factory=dict)
    """Fields of the assistant message to send back to the same provider (DeepSeek's reasoning)."""
    model: str = ""
    """The model that answered, as the server names it (a dated snapshot of the one asked for); "" when unsaid."""


ProviderEvent = TextDelta | ReasoningDelta | ToolCallReady | TurnEnd


class Provider(Protocol):
    def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        """Yield text and reasoning deltas and tool calls as they arrive, then exactly one TurnEnd.

        Raises core errors: Unavailable (unreachable, failing after retries, timed out),
        FailedPrecondition (the key was rejected), InvalidArgument (the request was refused)."""
        ...

    async def close(self) -> None:
        """Release connections."""
