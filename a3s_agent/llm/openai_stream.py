"""One model turn assembled from `chat.completion.chunk` objects, as real servers stream them.

Tool calls are matched to their fragments by `index`, as OpenAI numbers them, but not every
server does: Ollama 0.20 and sglang put every call on index 0, Ollama up to 0.4.6, Gemini and
Mistral send no index at all (each call whole). So a fragment starts a new call when it carries
an id other than its call's, or when it brings a name and arguments to a call that already has a
name and complete JSON arguments. The name is the first non-empty one: llama-cpp-python repeats
it in every fragment, xAI may send it after the first arguments.

Usage may come as `usage` on its own last chunk or on the finish chunk (keep the last seen: some
servers send a running count on every chunk), in `x_groq.usage` (Groq) or in `choices[0].usage`
(Moonshot/Kimi). Its parts (see `usage_of`): cache reads in `prompt_tokens_details.cached_tokens`
(OpenAI, xAI, Groq, vLLM, OpenRouter), `prompt_cache_hit_tokens` (DeepSeek) or a top-level
`cached_tokens` (Moonshot); cache writes in `prompt_tokens_details.cache_write_tokens`
(OpenRouter); reasoning in `completion_tokens_details.reasoning_tokens`. Gemini leaves its
thoughts out of `completion_tokens` but counts them in `total_tokens`: the difference is output
(reasoning) all the same. What a server wants back with the message (DeepSeek's `reasoning_content`,
Gemini's `extra_content` thought signatures, on the message or on each call) becomes the
events' provider state, keyed by the provider's state key.

The reasoning also passes on as it comes, before the text of the same delta, to be shown: from
`reasoning_content` (DeepSeek, Kimi, sglang, vLLM before 0.11), else from `reasoning` (vLLM 0.11 on,
OpenRouter, Ollama) when the first is absent or empty (servers in between send both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import Unavailable
from ..base.jsontext import model_json
from ..base.models import ProviderState, Usage
from .chunk_template import LoneStrings
from .provider import ProviderEvent, ReasoningDelta, TextDelta, ToolCallReady, TurnEnd
from .provider_errors import is_error_body, mid_reply_failure
from .wire_values import as_model_name, as_object, as_text

_REASONING = "reasoning_content"
_REASONING_ALIAS = "reasoning"  # vLLM 0.11 on, OpenRouter, Ollama: shown, not sent back
_EXTRA = "extra_content"
_TEXT = -1
"""Where a lone string goes (see `_lone_string`) when it is a piece of the text: no call's index."""
_THOUGHT = -2
"""... when it is a piece of the reasoning (`reasoning_content`)."""


@dataclass(slots=True)
class _Call:
    id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)
    extra: Any = None
    sent: bool = False

    def arguments(self) -> str:
        return "".join(self.pieces)

    def complete(self) -> bool:
        """Whether the arguments so far are a whole JSON value (cheaply ruled out while unclosed)."""
        last = next((piece.rstrip() for piece in reversed(self.pieces) if piece.strip()), "")
        if last[-1:] not in ("}", "]"):
            return False
        try:
            model_json(self.arguments())
        except ValueError:
            return False
        return True


class TurnReader:
    """Feed it each chunk of a streamed reply, then `finish`: the turn's events, in order."""

    def __init__(self, state_key: str) -> None:
        self._key = state_key
        self._calls: list[_Call] = []
        self._by_index: dict[int, _Call] = {}
        self._next = 0  # the first call not yet passed on
        self._finish_reason = ""
        self._usage: Usage | None = None
        self._model = ""
        self._reasoning: list[str] | None = None
        self._extra: Any = None
        self._lone = LoneStrings()

    def feed_text(self, text: str) -> list[ProviderEvent]:
        """The events of a chunk as the server wrote it (a JSON object): read without a parse when
        it is the template of the last chunk that brought only a string, with another string."""
        if (lone := self._lone.read(text)) is not None:
            return self._lone_piece(*lone)
        try:
            chunk = model_json(text)  # a model's lone surrogates become U+FFFD
        except ValueError as exc:
            raise Unavailable(f"the LLM provider sent a malformed chunk: {text[:200]!r}") from exc
        events = self.feed(chunk)
        found = _lone_string(chunk)
        if found is not None and found[1] and (found[0] < 0 or found[0] in self._by_index):
            of = found[0]
            self._lone.learn(text, of, found[1], lambda parsed: _string_of(parsed, of))
        return events

    def _lone_piece(self, of: int, piece: str) -> list[ProviderEvent]:
        """What `feed` makes of a lone string chunk: a text or reasoning delta, or a piece of a
        call's arguments."""
        if of == _TEXT:
            return [TextDelta(piece)] if piece else []
        if of == _THOUGHT:
            self._keep_reasoning(piece)
            return [ReasoningDelta(piece)] if piece else []
        call = self._by_index[of]
        if piece and not call.sent:
            call.pieces.append(piece)
        return []

    def feed(self, chunk: Any) -> list[ProviderEvent]:
        """The events a chunk completes: its text at once, tool calls once known to be whole."""
        if not isinstance(chunk, dict):
            return []
        if is_error_body(chunk):
            raise mid_reply_failure(chunk)
        if not self._model:
            self._model = as_model_name(chunk.get("model"))
        usage = chunk.get("usage")
        if usage or "x_groq" in chunk:
            self._take_usage(usage or as_object(chunk.get("x_groq")).get("usage"))
        events: list[ProviderEvent] = []
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return events
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if delta and isinstance(delta, dict):
                calls = delta.get("tool_calls")
                if calls is None or len(delta) > 1:  # an argument fragment alone is the common chunk
                    self._said(delta, events)
                if isinstance(calls, list):
                    for fragment in calls:
                        if isinstance(fragment, dict) and self._take(fragment):
                            events += self._whole_calls()
            usage = choice.get("usage")
            if usage:  # Moonshot's place for it
                self._take_usage(usage)
            reason = choice.get("finish_reason")
            if reason and isinstance(reason, str):
                self._finish_reason = reason
        return events

    def _keep_reasoning(self, piece: str) -> None:
        """A piece of `reasoning_content`, kept to be sent back with the turn (the field even when
        every piece was empty)."""
        if self._reasoning is None:
            self._reasoning = []
        self._reasoning.append(piece)

    def _said(self, delta: dict[str, Any], events: list[ProviderEvent]) -> None:
        """A delta's reasoning and text, and its thought signatures (`extra_content`)."""
        text = delta.get("content")
        if text is None or len(delta) > 1:  # more than the common `{"content": "..."}`
            reasoning = delta.get(_REASONING)
            if isinstance(reasoning, str):
                self._keep_reasoning(reasoning)
            shown = reasoning or delta.get(_REASONING_ALIAS)
            if shown and isinstance(shown, str):
                events.append(ReasoningDelta(shown))
            if delta.get(_EXTRA):
                self._extra = delta[_EXTRA]
        if text and isinstance(text, str):
            events.append(TextDelta(text))

    def finish(self) -> list[ProviderEvent]:
        """The rest of the calls and the TurnEnd; a reply cut off before its finish reason is an error."""
        if not self._finish_reason:
            raise Unavailable("the LLM provider ended its reply without a finish reason (stream broken off)")
        events: list[ProviderEvent] = [self._ready(call) for call in self._calls[self._next :]]
        state: dict[str, Any] = {}
        if self._reasoning is not None:
            state[_REASONING] = "".join(self._reasoning)
        if self._extra is not None:
            state[_EXTRA] = self._extra
        events.append(TurnEnd(self._finish_reason, self._usage, self._keyed(state), self._model))
        return events

    def _take_usage(self, raw: Any) -> None:
        if raw and isinstance(raw, dict):
            self._usage = usage_of(raw)

    def _take(self, fragment: dict[str, Any]) -> bool:
        """Add a tool-call fragment to its call; True when it started a new call."""
        index = fragment.get("index")
        function = fragment.get("function")
        if type(index) is int and len(fragment) == 2 and type(function) is dict and len(function) == 1:
            # The common fragment, `{"index": i, "function": {"arguments": "..."}}`: when call i
            # exists, a piece of its arguments (what the general path below makes of it too).
            arguments = function.get("arguments")
            current = self._by_index.get(index)
            if current is not None and type(arguments) is str:
                if arguments and not current.sent:
                    current.pieces.append(arguments)
                return False
        current = self._by_index.get(index) if isinstance(index, int) else None
        if current is None and not isinstance(index, int) and self._calls:
            current = self._calls[-1]  # no index: the fragment continues the latest call
        call_id = as_text(fragment.get("id"))
        function = as_object(function)
        name = as_text(function.get("name"))
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)  # an object where a JSON string belongs
        started = current is None or _starts_new_call(current, call_id, name, arguments)
        if started:
            current = _Call()
            self._calls.append(current)
            if isinstance(index, int):
                self._by_index[index] = current
        assert current is not None
        if current.sent:
            return started  # a stray fragment of a call already passed on
        current.id = current.id or call_id
        current.name = current.name or name
        if arguments:
            current.pieces.append(arguments)
        if fragment.get(_EXTRA):
            current.extra = fragment[_EXTRA]
        return started

    def _whole_calls(self) -> list[ProviderEvent]:
        """A new call began: the calls before it that are named and whole are passed on, in order."""
        events: list[ProviderEvent] = []
        last = len(self._calls) - 1
        while self._next < last:
            call = self._calls[self._next]
            if not (call.name and call.complete()):
                break
            events.append(self._ready(call))
            self._next += 1
        return events

    def _ready(self, call: _Call) -> ToolCallReady:
        call.sent = True
        state = {_EXTRA: call.extra} if call.extra is not None else {}
        return ToolCallReady(call.id, call.name, call.arguments() or "{}", self._keyed(state))

    def _keyed(self, state: dict[str, Any]) -> ProviderState:
        return {self._key: state} if state else {}


def usage_of(raw: dict[str, Any]) -> Usage:
    """A server's usage object as Usage, its parts read wherever the server puts them."""
    prompt, completion = _count(raw, "prompt_tokens"), _count(raw, "completion_tokens")
    prompt_details = raw.get("prompt_tokens_details")
    prompt_details = prompt_details if isinstance(prompt_details, dict) else {}
    completion_details = raw.get("completion_tokens_details")
    completion_details = completion_details if isinstance(completion_details, dict) else {}
    reasoning = _count(completion_details, "reasoning_tokens")
    unreported = _count(raw, "total_tokens") - prompt - completion  # Gemini's thoughts
    if unreported > 0:
        completion += unreported
        reasoning = reasoning or unreported
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cache_read_tokens=_count(prompt_details, "cached_tokens")
        or _count(raw, "prompt_cache_hit_tokens")
        or _count(raw, "cached_tokens"),
        cache_write_tokens=_count(prompt_details, "cache_write_tokens"),
        reasoning_tokens=reasoning,
    )


def _count(values: dict[str, Any], key: str) -> int:
    """A token count, 0 when absent, null or not a count."""
    value = values.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _lone_string(chunk: Any) -> tuple[int, str] | None:
    """(_TEXT, text) for a chunk that brings a piece of text and nothing else, (_THOUGHT, piece) for
    one that brings a piece of reasoning (alone, or with DeepSeek's `"content": null`), (index,
    piece) for one that brings a piece of call `index`'s arguments; None for any other."""
    if type(chunk) is not dict or chunk.get("usage") or "x_groq" in chunk or is_error_body(chunk):
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choice := choices[0]) is not dict:
        return None
    delta = choice.get("delta")
    if choice.get("usage") or choice.get("finish_reason") or type(delta) is not dict:
        return None
    if len(delta) == 2 and "content" in delta and delta["content"] is None:
        thought = delta.get(_REASONING)
        return (_THOUGHT, thought) if type(thought) is str else None
    if len(delta) != 1:
        return None
    if type(text := delta.get("content")) is str:
        return _TEXT, text
    if type(thought := delta.get(_REASONING)) is str:
        return _THOUGHT, thought
    calls = delta.get("tool_calls")
    if (
        type(calls) is not list
        or len(calls) != 1
        or type(fragment := calls[0]) is not dict
        or len(fragment) != 2
    ):
        return None
    index, function = fragment.get("index"), fragment.get("function")
    if type(index) is not int or index < 0 or type(function) is not dict or len(function) != 1:
        return None
    arguments = function.get("arguments")
    return (index, arguments) if type(arguments) is str else None


def _string_of(chunk: Any, of: int) -> str | None:
    """The lone string of `chunk` when it is one of `of` (a call's index, _TEXT or _THOUGHT)."""
    lone = _lone_string(chunk)
    return lone[1] if lone is not None and lone[0] == of else None


def _starts_new_call(current: _Call, call_id: str, name: str, arguments: str) -> bool:
    if call_id and current.id:
        return call_id != current.id
    return bool(name and arguments and current.name and current.complete())


def whole_reply(completion: Any, state_key: str) -> list[ProviderEvent]:
    """The same events from a whole `chat.completion` object (a server that ignored stream=true)."""
    if is_error_body(completion):
        raise mid_reply_failure(completion, "in a reply with HTTP status 200")
    choices = completion.get("choices") if isinstance(completion, dict) else None
    if not choices or not isinstance(choices, list):
        raise Unavailable(f"the LLM provider answered without choices: {str(completion)[:200]}")
    choice = as_object(choices[0])
    message = as_object(choice.get("message"))
    chunk = {
        "model": completion.get("model"),
        "usage": completion.get("usage") or as_object(completion.get("x_groq")).get("usage"),
        "choices": [
            {
                "delta": {**message, "tool_calls": _numbered(message.get("tool_calls"))},
                "usage": choice.get("usage"),
                "finish_reason": as_text(choice.get("finish_reason")) or "stop",
            }
        ],
    }
    reader = TurnReader(state_key)
    return [*reader.feed(chunk), *reader.finish()]


def _numbered(calls: Any) -> list[Any]:
    """A whole message's calls as fragments, each with its own index."""
    if not isinstance(calls, list):
        return []
    return [{**call, "index": i} if isinstance(call, dict) else call for i, call in enumerate(calls)]
