"""One model turn assembled from the Messages API's streamed events.

`message_start` brings the prompt's usage; each content block has a `content_block_start`, deltas
(`text_delta`, `input_json_delta` for a tool call's input, `thinking_delta` and `signature_delta`)
and a `content_block_stop`; `message_delta` brings the stop reason and the output's usage;
`message_stop` ends the message; `ping` keeps the connection alive. (`error` events are the
provider's to judge: some are worth a retry.) Text and thinking pass on as they come (redacted
thinking shows nothing), a tool call once its block stops; the turn's thinking and redacted_thinking
blocks, signatures and all, become the turn's provider state (see anthropic_request.BLOCKS), to go
back with the message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import Unavailable
from ..base.models import Usage
from .anthropic_request import BLOCKS
from .provider import ProviderEvent, ReasoningDelta, TextDelta, ToolCallReady, TurnEnd
from .wire_values import as_model_name, as_object, as_text

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}

_THINKING = frozenset({"thinking", "redacted_thinking"})
_LAID_OUT = _THINKING | {"text", "tool_use"}  # the blocks a message is rebuilt from


@dataclass(slots=True)
class _Block:
    type: str
    id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)  # text of a tool call's input, or of thinking
    signature: str = ""
    data: str = ""  # a redacted_thinking block's
    done: bool = False

    def kept(self) -> dict[str, Any]:
        """The block as the message's layout keeps it: thinking whole, the rest as placeholders."""
        if self.type == "thinking":
            return {"type": "thinking", "thinking": "".join(self.pieces), "signature": self.signature}
        if self.type == "redacted_thinking":
            return {"type": "redacted_thinking", "data": self.data}
        return {"type": "tool_use", "id": self.id} if self.type == "tool_use" else {"type": "text"}


class MessageReader:
    """Feed it each event of a streamed message, then `finish`: the turn's events, in order."""

    def __init__(self, state_key: str) -> None:
        self._key = state_key
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, Any] = {}
        self._stop_reason = ""
        self._model = ""
        self.stopped = False
        """Whether message_stop came: nothing follows it."""

    def feed(self, event: dict[str, Any]) -> list[ProviderEvent]:
        kind = event.get("type")
        if kind == "content_block_delta":
            return self._delta(self._blocks.get(_index(event, -1)), as_object(event.get("delta")))
        if kind == "content_block_start":
            return self._start(_index(event, len(self._blocks)), as_object(event.get("content_block")))
        if kind == "content_block_stop":
            block = self._blocks.get(_index(event, -1))
            return [self._ready(block)] if block is not None and block.type == "tool_use" else []
        if kind == "message_start":
            message = as_object(event.get("message"))
            self._model = as_model_name(message.get("model"))
            self._take_usage(message.get("usage"))
        elif kind == "message_delta":
            self._take_usage(event.get("usage"))
            self._stop_reason = as_text(as_object(event.get("delta")).get("stop_reason")) or self._stop_reason
        elif kind == "message_stop":
            self.stopped = True
        return []  # ping, and events added to the API later

    def finish(self) -> list[ProviderEvent]:
        """Calls not yet passed on and the TurnEnd; a message cut off before its stop reason is an error."""
        if not self._stop_reason:
            raise Unavailable("the LLM provider ended its reply without a stop reason (stream broken off)")
        blocks = [self._blocks[index] for index in sorted(self._blocks)]
        events: list[ProviderEvent] = [
            self._ready(block) for block in blocks if block.type == "tool_use" and not block.done
        ]
        thought = any(block.type in _THINKING for block in blocks)
        layout = [block.kept() for block in blocks if block.type in _LAID_OUT]
        state = {self._key: {BLOCKS: layout}} if thought else {}
        finish_reason = _FINISH_REASONS.get(self._stop_reason, "stop")
        events.append(TurnEnd(finish_reason, self._totals(), state, self._model))
        return events

    def _start(self, index: int, content: dict[str, Any]) -> list[ProviderEvent]:
        block = self._blocks[index] = _Block(
            type=as_text(content.get("type")),
            id=as_text(content.get("id")),
            name=as_text(content.get("name")),
            signature=as_text(content.get("signature")),
            data=as_text(content.get("data")),
        )
        if block.type == "tool_use" and content.get("input"):
            block.pieces.append(json.dumps(content["input"]))  # a whole input, not streamed
        elif block.type == "thinking" and (thinking := as_text(content.get("thinking"))):
            block.pieces.append(thinking)
            return [ReasoningDelta(thinking)]
        elif block.type == "text" and (text := as_text(content.get("text"))):
            return [TextDelta(text)]
        return []

    def _delta(self, block: _Block | None, delta: dict[str, Any]) -> list[ProviderEvent]:
        kind = delta.get("type")
        if kind == "text_delta":
            return [TextDelta(text)] if (text := as_text(delta.get("text"))) else []
        if block is None:
            return []
        if kind == "input_json_delta":
            block.pieces.append(as_text(delta.get("partial_json")))
        elif kind == "thinking_delta" and (thinking := as_text(delta.get("thinking"))):
            block.pieces.append(thinking)
            return [ReasoningDelta(thinking)]
        elif kind == "signature_delta":
            block.signature += as_text(delta.get("signature"))
        return []

    def _ready(self, block: _Block) -> ToolCallReady:
        block.done = True
        return ToolCallReady(block.id, block.name, "".join(block.pieces) or "{}")

    def _take_usage(self, raw: Any) -> None:
        """Counts from message_start, then message_delta's (cumulative, so the latest of each wins)."""
        if isinstance(raw, dict):
            self._usage.update((name, value) for name, value in raw.items() if value is not None)

    def _totals(self) -> Usage | None:
        """The turn's usage in OpenAI's convention: the prompt is every input token, cached or not."""
        if not self._usage:
            return None
        read = _count(self._usage.get("cache_read_input_tokens"))
        written = _count(self._usage.get("cache_creation_input_tokens"))
        details = self._usage.get("output_tokens_details")
        return Usage(
            prompt_tokens=_count(self._usage.get("input_tokens")) + read + written,
            completion_tokens=_count(self._usage.get("output_tokens")),
            cache_read_tokens=read,
            cache_write_tokens=written,
            reasoning_tokens=_count(details.get("thinking_tokens")) if isinstance(details, dict) else 0,
        )


def _index(event: dict[str, Any], default: int) -> int:
    index = event.get("index", default)
    return index if isinstance(index, int) else -1


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0
