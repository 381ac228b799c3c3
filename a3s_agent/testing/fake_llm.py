"""A scripted, OpenAI-compatible Chat Completions server for tests and benchmarks.

It speaks the real wire format (JSON and ``text/event-stream``) on 127.0.0.1 so the real
``openai`` client can talk to it. Each ``POST /v1/chat/completions`` consumes the next scripted
turn; every request is recorded.

Async use (pytest)::

    async with FakeLLM(tool_call("read_file", {"path": "a.txt"}), text("done")) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")
        ...
        assert fake.requests[1].messages[-1]["role"] == "tool"

Sync use (server on its own loop in a background thread)::

    with FakeLLM(fallback=text("ok")) as fake:
        ...

Subprocess use (benchmarks)::

    python -m a3s_agent.testing.fake_llm --port 0 --delay-ms 200 --tool-rounds 2
    # prints "FAKE_LLM_READY http://127.0.0.1:<port>/v1" once listening

Dialects: ``FakeLLM(dialect="ollama-index0")`` (``--dialect`` on the command line) streams the
same turns the way one real server does, quirks included, and refuses what that server refuses
(see :data:`DIALECTS`). ``"openai"``, the default, is the reference behaviour.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import secrets
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = [
    "DIALECTS",
    "Dialect",
    "Error",
    "FakeLLM",
    "Hang",
    "Raw",
    "RecordedRequest",
    "Reply",
    "ToolCall",
    "Turn",
    "TurnLike",
    "broken_stream",
    "call",
    "delayed",
    "error",
    "hang",
    "text",
    "tool_call",
    "tool_calls",
    "tool_loop",
    "turn_from_json",
]

READY_PREFIX = "FAKE_LLM_READY"


@dataclass(frozen=True)
class ToolCall:
    """One function call in an assistant reply; raw-string ``arguments`` are sent verbatim."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        """The ``arguments`` string as it goes on the wire."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """A successful completion: text, tool calls, or both.

    ``finish_reason`` defaults to ``tool_calls`` when there are tool calls, else ``stop``.
    ``delay`` waits before the response starts; ``chunk_delay`` waits between streamed chunks.
    ``break_after`` cuts the connection after that many SSE events (or half the JSON body
    when not streaming), without ``[DONE]``.
    """

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    break_after: int | None = None


@dataclass(frozen=True)
class Error:
    """An HTTP error with an OpenAI-style ``{"error": {...}}`` body (in the dialect's shape).

    ``in_stream`` reports it inside a streamed reply instead, after HTTP 200 and a first chunk,
    as servers do when generation fails once the stream has begun."""

    status: int
    message: str
    type: str
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    in_stream: bool = False


@dataclass(frozen=True)
class Hang:
    """Send nothing for ``seconds`` (cut short when the server stops), then answer 504."""

    seconds: float = 3600.0


@dataclass(frozen=True)
class Raw:
    """These exact bytes as the response body, whatever they are (invalid UTF-8, broken framing)."""

    body: bytes
    content_type: str = "text/event-stream"
    status: int = 200
    delay: float = 0.0


Turn = Reply | Error | Hang | Raw | Callable[[dict[str, Any]], "TurnLike"]
"""A scripted turn; a callable gets the parsed request body and returns the turn to play."""
TurnLike = Turn | str
"""A turn, or a plain string meaning ``text(string)``."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request received on the completions endpoint."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names are lower-case."""
    body: dict[str, Any]
    """The parsed JSON body (``{}`` when it was not a JSON object)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's ``messages``."""
        return self.body.get("messages") or []

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The request's ``tools``, if any."""
        return self.body.get("tools")

    @property
    def model(self) -> str | None:
        """The requested model."""
        return self.body.get("model")

    @property
    def stream(self) -> bool:
        """Whether a streamed response was asked for."""
        return bool(self.body.get("stream"))

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header, e.g. ``"Bearer sk-test"``."""
        return self.headers.get("authorization")


# --- turn helpers -------------------------------------------------------------------------------


def text(content: str, *, finish_reason: str = "stop", delay: float = 0.0) -> Reply:
    """A plain text reply."""
    return Reply(content=content, finish_reason=finish_reason, delay=delay)


def call(name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None) -> ToolCall:
    """One tool call for :func:`tool_calls`; a string ``arguments`` is sent as-is (may be malformed)."""
    return ToolCall(name, {} if arguments is None else arguments, id)


def tool_call(
    name: str,
    arguments: Mapping[str, Any] | str | None = None,
    *,
    id: str | None = None,
    content: str | None = None,
    finish_reason: str | None = None,
    delay: float = 0.0,
) -> Reply:
    """A reply with a single tool call (optionally with text before it)."""
    return tool_calls(
        [call(name, arguments, id=id)], content=content, finish_reason=finish_reason, delay=delay
    )


def tool_calls(
    calls: Iterable[ToolCall | tuple[str, Mapping[str, Any] | str]],
    *,
    content: str | None = None,
    finish_reason: str | None = None,
    delay: float = 0.0,
) -> Reply:
    """A reply with several (parallel) tool calls, given as :class:`ToolCall` or ``(name, arguments)``."""
    parsed = tuple(c if isinstance(c, ToolCall) else call(*c) for c in calls)
    return Reply(content=content, tool_calls=parsed, finish_reason=finish_reason, delay=delay)


_ERROR_DEFAULTS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to access this resource.", "invalid_request_error", None),
    404: (
        "The model does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    429: ("Rate limit reached for requests.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def error(
    status: int,
    message: str | None = None,
    *,
    type: str | None = None,
    code: str | None = None,
    retry_after: float | None = None,
    retry_after_ms: float | None = None,
    should_retry: bool | None = None,
    headers: Mapping[str, str] | None = None,
    delay: float = 0.0,
    in_stream: bool = False,
) -> Error:
    """An HTTP error turn with realistic defaults per status (``in_stream``: see :class:`Error`).

    ``retry_after`` sets ``Retry-After`` (seconds, floats allowed), ``retry_after_ms`` sets
    ``retry-after-ms``, ``should_retry`` sets ``x-should-retry``. Note the openai client ignores
    a retry delay of 0 and falls back to its own backoff (~0.4-0.5 s); use e.g. 0.01 in tests.
    """
    default_message, default_type, default_code = _ERROR_DEFAULTS.get(
        status, (f"HTTP {status}", "server_error" if status >= 500 else "invalid_request_error", None)
    )
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["Retry-After"] = f"{retry_after:g}"
    if retry_after_ms is not None:
        all_headers["retry-after-ms"] = f"{retry_after_ms:g}"
    if should_retry is not None:
        all_headers["x-should-retry"] = "true" if should_retry else "false"
    return Error(
        status,
        message or default_message,
        type or default_type,
        code if code is not None else default_code,
        all_headers,
        delay,
        in_stream,
    )


def hang(seconds: float = 3600.0) -> Hang:
    """A turn that never answers within any sane client timeout."""
    return Hang(seconds)


def broken_stream(
    reply: Reply | str = "This answer is cut off in the mid", *, after_chunks: int = 3
) -> Reply:
    """``reply`` with the connection dropped after ``after_chunks`` SSE events, before ``[DONE]``."""
    return replace(text(reply) if isinstance(reply, str) else reply, break_after=after_chunks)


def delayed(turn: Reply | Error | str, seconds: float) -> Reply | Error:
    """``turn`` answered only after ``seconds``."""
    return replace(text(turn) if isinstance(turn, str) else turn, delay=seconds)


def tool_loop(
    rounds: int = 2,
    name: str = "read_file",
    arguments: Mapping[str, Any] | str | None = None,
    final: str = "Done.",
) -> Callable[[dict[str, Any]], Reply]:
    """A stateless turn: ``rounds`` tool calls, then ``final`` text, per user prompt.

    The round is the number of ``tool`` messages after the last ``user`` message, so it works
    for any number of concurrent conversations without a shared script.
    """
    args = {"path": "README.md"} if arguments is None else arguments

    def play(body: dict[str, Any]) -> Reply:
        done = 0
        for message in reversed(body.get("messages") or []):
            role = message.get("role") if isinstance(message, dict) else None
            if role == "user":
                break
            done += role == "tool"
        return text(final) if done >= rounds else tool_call(name, args)

    return play


def turn_from_json(spec: Any) -> Reply | Error | Hang:
    """Build a turn from JSON (for ``--turns-file``).

    Forms: ``"text"``; ``{"content": str, "tool_calls": [{"name", "arguments", "id"}],
    "finish_reason": str, "delay": float, "break_after": int}``; ``{"error": status, "message",
    "type", "code", "retry_after", "retry_after_ms", "in_stream"}``; ``{"hang": seconds}``.
    """
    if isinstance(spec, str):
        return text(spec)
    if "error" in spec:
        return error(
            int(spec["error"]),
            spec.get("message"),
            type=spec.get("type"),
            code=spec.get("code"),
            retry_after=spec.get("retry_after"),
            retry_after_ms=spec.get("retry_after_ms"),
            delay=spec.get("delay", 0.0),
            in_stream=bool(spec.get("in_stream")),
        )
    if "hang" in spec:
        return hang(float(spec["hang"]))
    return Reply(
        content=spec.get("content"),
        tool_calls=tuple(
            call(c["name"], c.get("arguments"), id=c.get("id")) for c in spec.get("tool_calls", ())
        ),
        finish_reason=spec.get("finish_reason"),
        delay=spec.get("delay", 0.0),
        break_after=spec.get("break_after"),
    )


# --- wire format --------------------------------------------------------------------------------


_dumps = json.JSONEncoder(separators=(",", ":")).encode
"""Compact JSON, with the encoder built once (``json.dumps`` with options builds one per call)."""


def _chars(value: Any) -> int:
    """Characters of text in a message ``content`` (string or list of parts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(p.get("text") or "") for p in value if isinstance(p, dict))
    return 0


def _usage(
    body: dict[str, Any], reply: Reply, details: str = "", reasoning: str | None = None
) -> dict[str, int]:
    """What a client should bill for a reply, in the server's own terms (see Usage): deterministic
    counts, characters // 4 and at least 1. Where the dialect reports parts (``details``), a
    follow-up request (one with an assistant message) read half its prompt from the cache (OpenAI:
    only from 1,024 prompt tokens on, in steps of 128, as it caches); the model "thought" (its
    streamed reasoning, else half the visible output; not ``openai``'s, a model that reports 0),
    which counts in the completion; OpenRouter also wrote a quarter of every prompt to the cache."""
    prompt = 0
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            prompt += _chars(message.get("content"))
            for tc in message.get("tool_calls") or ():
                fn = (tc.get("function") or {}) if isinstance(tc, dict) else {}
                prompt += len(fn.get("name") or "") + len(fn.get("arguments") or "")
    completion = len(reply.content or "") + sum(
        len(c.name) + len(c.arguments_json()) for c in reply.tool_calls
    )
    prompt_tokens, completion_tokens = max(1, prompt // 4), max(1, completion // 4)
    thoughts = cache_read = cache_write = 0
    if details in ("openrouter", "gemini", "deepseek"):
        thoughts = max(1, len(reasoning) // 4) if reasoning else max(1, completion_tokens // 2)
    follow_up = any(isinstance(m, dict) and m.get("role") == "assistant" for m in body.get("messages") or ())
    if details in ("openrouter", "deepseek", "moonshot") and follow_up:
        cache_read = prompt_tokens // 2
    elif details == "openai" and follow_up and prompt_tokens >= 1024:
        cache_read = prompt_tokens // 2 // 128 * 128
    if details == "openrouter":
        cache_write = prompt_tokens // 4
    completion_tokens += thoughts
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "cache_read_tokens": cache_read,
        "cache_write_tokens": cache_write,
        "reasoning_tokens": thoughts,
    }


def _wire_usage(usage: dict[str, int], details: str) -> dict[str, Any]:
    """``usage`` (from :func:`_usage`) as the dialect's server sends it."""
    wire: dict[str, Any] = {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"],
    }
    cached, written, reasoning = (
        usage["cache_read_tokens"],
        usage["cache_write_tokens"],
        usage["reasoning_tokens"],
    )
    if details == "openai":
        wire["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        wire["completion_tokens_details"] = {
            "reasoning_tokens": reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
    elif details == "openrouter":
        wire["prompt_tokens_details"] = {
            "cached_tokens": cached,
            "cache_write_tokens": written,
            "audio_tokens": 0,
        }
        wire["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        wire["cost"] = 0.0001
    elif details == "deepseek":
        wire["prompt_cache_hit_tokens"] = cached
        wire["prompt_cache_miss_tokens"] = usage["prompt_tokens"] - cached
        wire["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    elif details == "moonshot":
        wire["cached_tokens"] = cached
    elif details == "gemini":  # thoughts only in the total
        wire["completion_tokens"] -= reasoning
    return wire


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _message_problem(messages: list[Any]) -> str | None:
    """What the real API would reject in ``messages`` (roles, tool-call pairing), or None."""
    pending: set[Any] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            return f"Invalid value for 'messages[{i}].role': {role!r}."
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return (
                    f"Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    f"message with 'tool_calls' (messages[{i}].tool_call_id={message.get('tool_call_id')!r})."
                )
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            break
        if role == "assistant":
            pending = {tc.get("id") for tc in message.get("tool_calls") or () if isinstance(tc, dict)}
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {sorted(map(str, pending))}"
        )
    return None


_IMAGE_MAGIC = {"png": b"\x89PNG", "jpeg": b"\xff\xd8\xff", "gif": b"GIF8", "webp": b"RIFF"}


def _image_problem(messages: list[Any], vision: bool) -> str | None:
    """What OpenAI refuses in ``image_url`` parts: one in a message that is not the user's, any for a
    model without vision, a data URL that is not base64 of a PNG, JPEG, GIF or WebP."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            if message.get("role") != "user":
                return (
                    f"Invalid 'messages[{i}]'. Image URLs are only allowed for messages with role 'user', but"
                    f" this message with role '{message.get('role')}' contains an image URL."
                )
            if not vision:
                return "Invalid content type. image_url is only supported by certain models."
            url = str((part.get("image_url") or {}).get("url", ""))
            kind, _, data = url.removeprefix("data:image/").partition(";base64,")
            try:
                decoded = base64.b64decode(data, validate=True) if url.startswith("data:image/") else b""
            except ValueError:
                decoded = b""
            if not decoded.startswith(_IMAGE_MAGIC.get(kind, b"-")):
                return (
                    "You uploaded an unsupported image. Please make sure your image has of one the following"
                    " formats: ['png', 'jpeg', 'gif', 'webp']."
                )
    return None


def _order_problem(messages: list[Any], dialect: Dialect) -> str | None:
    """Mistral's refusal of a user message right after a tool message."""
    roles = [message.get("role") if isinstance(message, dict) else None for message in messages]
    if dialect.refuses_user_after_tool and ("tool", "user") in itertools.pairwise(roles):
        return "Unexpected role 'user' after role 'tool'"
    return None


def _pieces(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


# --- dialects -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """How one real server streams and what it refuses, as far as a client can tell."""

    calls: str = "indexed"
    """How tool calls stream. ``indexed`` (OpenAI): a head with id and name, then argument pieces,
    each fragment with its call's index. ``index0-split`` (sglang): the same with every call on
    index 0. ``index0`` (Ollama 0.20): each call whole in its own chunk, all on index 0, distinct
    ids. ``noindex`` (Ollama <= 0.4.6, Gemini, Mistral): every call whole in one chunk, no index.
    ``repeat-name`` (llama-cpp-python): id and name repeated in every fragment. ``late-name`` (xAI):
    the first fragment has the id and arguments, the name comes in the second."""
    usage: str = "chunk"
    """Where usage goes. ``chunk``: a last chunk of its own, when ``stream_options`` asks for it.
    ``finish``: on the finish chunk, always. ``every``: a running count on every chunk.
    ``x_groq``: in ``x_groq.usage`` of the finish chunk. ``choice``: in ``choices[0].usage``."""
    eol: str = "\n"
    """The line ending of the event stream (bare CR and CRLF are legal SSE too)."""
    heartbeats: bool = False
    """An empty ``data:`` event and a ``: keep-alive`` comment before every event."""
    done: str = "[DONE]"
    """The data of the last event (``"[DONE] "`` with trailing whitespace, as some servers send)."""
    errors: str = "openai"
    """The shape of errors. ``openai``: ``{"error": {...}}``. ``vllm``: ``{"object": "error", "message":
    ...}``, over HTTP and in the stream. ``gemini``: a list holding one ``{"error": {...}}`` (HTTP).
    ``mistral``: ``{"object": "error", "message": ...}`` (HTTP). ``llamacpp-field``: in the stream,
    a non-standard ``error:`` SSE field then ``data: [DONE]``. ``http-200``: error bodies with
    status 200."""
    refuses_stream_options: int = 0
    """The HTTP status with which a request carrying ``stream_options`` is refused (0: accepted)."""
    reasoning: bool = False
    """DeepSeek thinking mode: ``reasoning_content`` streams before the answer, and a request whose
    assistant tool-call messages lack it (as streamed) is refused with 400."""
    signatures: bool = False
    """Gemini 3: the first call of a reply carries ``extra_content.google.thought_signature`` (and a
    text reply its first delta), and a request whose calls lack their signature is refused."""
    azure: bool = False
    """Azure OpenAI: an empty first chunk with ``prompt_filter_results``, ``content_filter_results``
    on every choice, and a filter annotation chunk without a delta before the finish."""
    usage_details: str = ""
    """How usage reports its parts (see :func:`_usage`). ``openai`` (OpenAI, Azure, xAI, vLLM):
    ``prompt_tokens_details.cached_tokens`` and ``completion_tokens_details.reasoning_tokens``.
    ``openrouter``: the same, with ``prompt_tokens_details.cache_write_tokens``. ``deepseek``:
    ``prompt_cache_hit_tokens``/``prompt_cache_miss_tokens`` and the reasoning details.
    ``moonshot``: a top-level ``cached_tokens``. ``gemini``: thoughts left out of
    ``completion_tokens`` but counted in ``total_tokens``. ``""``: no parts."""
    refuses_user_after_tool: bool = False
    """Mistral: a user message right after a tool message is refused (an assistant message must come
    between)."""
    whole_json: bool = False
    """Answers ``stream: true`` with one whole ``chat.completion`` JSON object."""
    obfuscation: bool = False
    """api.openai.com since 2025: every chunk of a reply carries ``obfuscation``, random characters
    of a random length (a mitigation of size side channels), so no two chunks are alike but for
    their text."""

    def message_fields(self) -> frozenset[str]:
        """The fields an assistant message may carry here (strict servers refuse any other)."""
        extra = {"reasoning_content"} if self.reasoning else set()
        extra |= {"extra_content"} if self.signatures else set()
        return _MESSAGE_FIELDS | extra

    def call_fields(self) -> frozenset[str]:
        return _CALL_FIELDS | ({"extra_content"} if self.signatures else set())


_MESSAGE_FIELDS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "function_call"}
)
_CALL_FIELDS = frozenset({"id", "type", "function", "index"})

DIALECTS: dict[str, Dialect] = {
    "openai": Dialect(usage_details="openai"),
    "openai-obfuscation": Dialect(usage_details="openai", obfuscation=True),
    "ollama-index0": Dialect(calls="index0"),
    "ollama-noindex": Dialect(calls="noindex"),
    "sglang-index0": Dialect(calls="index0-split"),
    "gemini": Dialect(calls="noindex", usage="finish", errors="gemini", usage_details="gemini"),
    "gemini3-signature": Dialect(
        calls="noindex", usage="finish", errors="gemini", signatures=True, usage_details="gemini"
    ),
    "mistral": Dialect(calls="noindex", usage="finish", errors="mistral", refuses_user_after_tool=True),
    "mistral-422": Dialect(
        calls="noindex",
        usage="finish",
        errors="mistral",
        refuses_stream_options=422,
        refuses_user_after_tool=True,
    ),
    "llamacpp-repeat-name": Dialect(calls="repeat-name"),
    "xai-late-name": Dialect(calls="late-name", usage_details="openai"),
    "deepseek-reasoning": Dialect(reasoning=True, usage_details="deepseek"),
    "groq": Dialect(usage="x_groq", refuses_stream_options=400),
    "moonshot-usage": Dialect(usage="choice", usage_details="moonshot"),
    "openrouter": Dialect(usage="chunk", usage_details="openrouter"),
    "usage-every-chunk": Dialect(usage="every"),
    "usage-on-finish": Dialect(usage="finish"),
    "heartbeats": Dialect(heartbeats=True),
    "done-whitespace": Dialect(done="[DONE] "),
    "bare-cr": Dialect(eol="\r"),
    "crlf": Dialect(eol="\r\n"),
    "vllm-error": Dialect(errors="vllm"),
    "llamacpp-error-field": Dialect(errors="llamacpp-field"),
    "azure": Dialect(azure=True, usage_details="openai"),
    "json-reply": Dialect(whole_json=True, usage_details="openai"),
    "error-200": Dialect(errors="http-200"),
}
"""Every dialect by name: one per quirk of a real server's stream (see :class:`Dialect`)."""


def _field_problem(messages: list[Any], dialect: Dialect) -> str | None:
    """A field of an assistant message or call that this (strict) server does not know, or None."""
    message_fields, call_fields = dialect.message_fields(), dialect.call_fields()
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        unknown = sorted(set(message) - message_fields)
        for j, tc in enumerate(message.get("tool_calls") or ()):
            unknown += (
                [f"tool_calls[{j}].{name}" for name in sorted(set(tc) - call_fields)]
                if isinstance(tc, dict)
                else []
            )
        if unknown:
            return f"messages[{i}]: Extra inputs are not permitted: {', '.join(unknown)}"
    return None


def _assistant_calls(messages: list[Any]) -> Iterator[tuple[int, dict[str, Any], list[dict[str, Any]]]]:
    """(index, message, its calls) of each assistant message that made calls."""
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            calls = [tc for tc in message.get("tool_calls") or () if isinstance(tc, dict)]
            if calls:
                yield i, message, calls


def _missing_reasoning(messages: list[Any], streamed: dict[str, str]) -> str | None:
    """DeepSeek's refusal of a tool-call message without the reasoning_content it streamed."""
    for i, message, calls in _assistant_calls(messages):
        wanted = streamed.get(calls[0].get("id", ""))
        if "reasoning_content" not in message or (
            wanted is not None and message["reasoning_content"] != wanted
        ):
            return (
                f"Missing `reasoning_content` field in the assistant message at message index {i}. For more"
                " information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls"
            )
    return None


def _missing_signature(messages: list[Any], given: dict[str, str]) -> str | None:
    """Gemini 3's refusal of a call sent back without the thought signature it came with."""
    for i, _, calls in _assistant_calls(messages):
        for tc in calls:
            signature = ((tc.get("extra_content") or {}).get("google") or {}).get("thought_signature")
            if tc.get("id") in given and signature != given[tc["id"]]:
                name = (tc.get("function") or {}).get("name")
                return (
                    "Function call is missing a thought_signature in functionCall parts. This is required for"
                    " tools to work correctly, and missing thought_signature may lead to degraded model"
                    f" performance. Additional data, function call `default_api:{name}` , position {i}. please"
                    " refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
                )
    return None


def _mistral_extra_forbidden(name: str, body: dict[str, Any]) -> dict[str, Any]:
    """Mistral's 422 for a request field it does not know: pydantic's report as the message."""
    detail = [
        {
            "type": "extra_forbidden",
            "loc": ["body", name],
            "msg": "Extra inputs are not permitted",
            "input": body[name],
        }
    ]
    return {
        "object": "error",
        "message": {"detail": detail},
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


_AZURE_FILTER = {
    category: {"filtered": False, "severity": "safe"}
    for category in ("hate", "self_harm", "sexual", "violence")
}


_GEMINI_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass(frozen=True)
class _Issued:
    """A reply's call ids and what its dialect sends beside them."""

    ids: list[str]
    reasoning: str | None
    signature: str | None

    def extra(self) -> dict[str, Any]:
        """Gemini's ``extra_content`` carrying the signature (nothing when there is none)."""
        if self.signature is None:
            return {}
        return {"extra_content": {"google": {"thought_signature": self.signature}}}


class FakeLLM:
    """The fake server. Script turns with :meth:`script`, read :attr:`requests` afterwards.

    ``fallback`` is played once the script is exhausted; without one such a request gets a 500
    "script exhausted" error marked ``x-should-retry: false`` so the test fails loudly and fast.
    ``api_key``, if set, is enforced (401 otherwise). ``delay`` is added before every answer.
    Streams split text into ``text_chunk``-character deltas and tool-call arguments into
    ``args_chunk``-character deltas, round-robin across parallel calls when ``interleave``.
    ``strict`` rejects with 400, like the real API, messages with an unknown role, ``tool``
    messages not answering the preceding assistant ``tool_calls``, unanswered tool calls, or
    assistant messages and calls with fields the server does not know, and images as OpenAI does
    (in user messages only, as PNG, JPEG, GIF or WebP data, and none when ``vision`` is false: a
    model without vision). ``dialect`` names the
    server whose stream is reproduced (:data:`DIALECTS`). Rejected requests (401/400, and the
    dialect's refusals) are recorded but consume no turn.
    """

    def __init__(
        self,
        *turns: TurnLike,
        fallback: TurnLike | None = None,
        api_key: str | None = None,
        delay: float = 0.0,
        models: Iterable[str] = ("fake-model",),
        text_chunk: int = 8,
        args_chunk: int = 3,
        interleave: bool = True,
        strict: bool = True,
        vision: bool = True,
        dialect: str = "openai",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}")
        self._turns: deque[TurnLike] = deque(turns)
        self.fallback = fallback
        self.api_key = api_key
        self.delay = delay
        self.models = tuple(models)
        self.text_chunk = text_chunk
        self.args_chunk = args_chunk
        self.interleave = interleave
        self.strict = strict
        self.vision = vision
        self.dialect_name = dialect
        self.dialect = DIALECTS[dialect]
        self.host = host
        self.port = port
        self.answering_model = ""
        """The model replies name, as a server names a dated snapshot of the one asked; the request's when ""."""
        self.requests: list[RecordedRequest] = []
        """Every request to the completions endpoint, in arrival order."""
        self.errors: list[Exception] = []
        """Exceptions raised by callable turns (each also answered with a 500)."""
        self.usages: list[dict[str, int]] = []
        """The usage of each reply played, in order, as a client should bill it: the three counts
        and the parts (``cache_read_tokens``, ``cache_write_tokens``, ``reasoning_tokens``),
        whatever the dialect's wire shape (see :func:`_usage`)."""
        self._reasoning: dict[str, str] = {}  # reasoning_content streamed with each call id
        self._signatures: dict[str, str] = {}  # thought signature given with a call id
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- scripting ----------------------------------------------------------------------------

    def script(self, *turns: TurnLike) -> FakeLLM:
        """Append turns to the script; each completions request plays the next one."""
        self._turns.extend(turns)
        return self

    @property
    def remaining(self) -> int:
        """Scripted turns not played yet."""
        return len(self._turns)

    def reset(self) -> None:
        """Forget the remaining script, the recorded requests, errors and usages."""
        self._turns.clear()
        self.requests.clear()
        self.errors.clear()
        self.usages.clear()

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, for ``openai.AsyncOpenAI(base_url=...)``."""
        if self._runner is None:
            raise RuntimeError("FakeLLM is not started")
        return f"http://{self.host}:{self.port}/v1"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> FakeLLM:
        """Listen on ``host:port`` (port 0 picks a free one, readable from :attr:`port`)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._completions)
            app.router.add_get(f"{prefix}/models", self._list_models)
        self._closing = asyncio.Event()
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=4096)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        """Stop listening; pending hangs and delays end at once."""
        if self._runner is None:
            return
        assert self._closing is not None
        self._closing.set()
        await self._runner.cleanup()
        self._runner = None

    async def __aenter__(self) -> FakeLLM:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> FakeLLM:
        """Run the server on its own event loop in a daemon thread (for sync callers)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fake-llm", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=10)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        self._loop, self._thread = loop, thread
        return self

    def stop_in_thread(self) -> None:
        """Stop a server started with :meth:`start_in_thread` and join its thread."""
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop_in_thread()

    # -- handlers -----------------------------------------------------------------------------

    async def _list_models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake-llm"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append(
            RecordedRequest(
                request.method,
                request.path,
                {k.lower(): v for k, v in request.headers.items()},
                body if isinstance(body, dict) else {},
            )
        )
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._error_response(error(401))
        if not isinstance(body, dict):
            return self._error_response(error(400, "We could not parse the JSON body of your request."))
        if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
            return self._error_response(error(400, "'model' (string) and 'messages' (array) are required."))
        problem = (
            (
                _message_problem(body["messages"])
                or _field_problem(body["messages"], self.dialect)
                or _image_problem(body["messages"], self.vision)
                or _order_problem(body["messages"], self.dialect)
            )
            if self.strict
            else None
        )
        if problem:
            return self._error_response(error(400, problem))
        refusal = self._dialect_refusal(body)
        if refusal is not None:
            return refusal

        turn = self._next_turn(body)
        if isinstance(turn, Hang):
            await self._wait(turn.seconds)
            return self._error_response(error(504, "fake LLM hang elapsed", should_retry=False))
        await self._wait(self.delay + turn.delay)
        if isinstance(turn, Error):
            if turn.in_stream and body.get("stream"):
                return await self._stream_error(request, body, turn)
            return self._error_response(turn)
        if isinstance(turn, Raw):
            return web.Response(
                status=turn.status, body=turn.body, headers={"Content-Type": turn.content_type}
            )
        if body.get("stream") and not self.dialect.whole_json:
            return await self._stream(request, body, turn)
        return await self._complete(request, body, turn)

    def _next_turn(self, body: dict[str, Any]) -> Reply | Error | Hang | Raw:
        """Pop the next turn (or the fallback) and resolve callables and strings."""
        if self._turns:
            turn: TurnLike = self._turns.popleft()
        elif self.fallback is not None:
            turn = self.fallback
        else:
            n = len(self.requests)
            return error(
                500,
                f"fake LLM script exhausted: request #{n} arrived but no turn is left and no fallback is set",
                code="script_exhausted",
                should_retry=False,
            )
        try:
            while callable(turn):
                turn = turn(body)
        except Exception as exc:
            self.errors.append(exc)
            return error(
                500, f"fake LLM turn callable raised {exc!r}", code="turn_failed", should_retry=False
            )
        return text(turn) if isinstance(turn, str) else turn

    async def _wait(self, seconds: float) -> None:
        """Sleep, but wake up when the server stops."""
        if seconds <= 0:
            return
        assert self._closing is not None
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            pass

    def _error_response(self, err: Error) -> web.Response:
        shape = self.dialect.errors
        payload: Any
        if shape == "vllm":
            payload = self._vllm_error(err)
        elif shape == "mistral":
            payload = {
                "object": "error",
                "message": err.message,
                "type": err.type,
                "param": None,
                "code": None,
            }
        elif shape == "gemini":
            payload = [
                {
                    "error": {
                        "code": err.status,
                        "message": err.message,
                        "status": _GEMINI_STATUS.get(err.status, "UNKNOWN"),
                    }
                }
            ]
        else:
            payload = {"error": {"message": err.message, "type": err.type, "param": None, "code": err.code}}
        return web.Response(
            status=200 if shape == "http-200" else err.status,
            text=_dumps(payload),
            content_type="application/json",
            headers={"x-request-id": f"req_{next(self._ids)}", **err.headers},
        )

    @staticmethod
    def _vllm_error(err: Error) -> dict[str, Any]:
        return {
            "object": "error",
            "message": err.message,
            "type": "BadRequestError",
            "param": None,
            "code": err.status,
        }

    def _dialect_refusal(self, body: dict[str, Any]) -> web.Response | None:
        """What this server refuses in a request a strict OpenAI server would take, as it says so."""
        dialect = self.dialect
        if dialect.refuses_stream_options == 422 and "stream_options" in body:
            return web.json_response(
                _mistral_extra_forbidden("stream_options", body), status=422, dumps=_dumps
            )
        if dialect.refuses_stream_options and "stream_options" in body:
            return self._error_response(
                error(400, "property 'stream_options' is unsupported, did you mean 'stream'?")
            )
        messages = body["messages"]
        problem = (dialect.reasoning and _missing_reasoning(messages, self._reasoning)) or (
            dialect.signatures and _missing_signature(messages, self._signatures)
        )
        return self._error_response(error(400, problem)) if problem else None

    def _tool_call_id(self, number: int, index: int, tc: ToolCall) -> str:
        return tc.id or f"call_{number}_{index}"

    def _issue(self, number: int, reply: Reply) -> _Issued:
        """The reply's call ids, and what the dialect streams beside it (reasoning, signatures),
        remembered so that a later request can be checked for it."""
        ids = [self._tool_call_id(number, i, tc) for i, tc in enumerate(reply.tool_calls)]
        reasoning = (
            f"The user wants reply {number}; I will work it out step by step."
            if self.dialect.reasoning
            else None
        )
        signature = f"sig-{number}-" + "Q" * 24 if self.dialect.signatures else None
        for call_id in ids:
            if reasoning is not None:
                self._reasoning[call_id] = reasoning
        if signature is not None and ids:
            self._signatures[ids[0]] = signature  # Gemini signs the first call of parallel ones
        return _Issued(ids, reasoning, signature)

    async def _complete(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        number = next(self._ids)
        issued = self._issue(number, reply)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        if issued.reasoning is not None:
            message["reasoning_content"] = issued.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": issued.ids[i],
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments_json()},
                    **(issued.extra() if i == 0 else {}),
                }
                for i, tc in enumerate(reply.tool_calls)
            ]
        usage = _usage(body, reply, self.dialect.usage_details, issued.reasoning)
        self.usages.append(usage)
        wire_usage = _wire_usage(usage, self.dialect.usage_details)
        payload = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self._answering(body),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"),
                }
            ],
            "usage": wire_usage,
        }
        data = _dumps(payload).encode()
        if reply.break_after is None:
            return web.Response(body=data, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        return self._cut(request, response)

    def _answering(self, body: dict[str, Any]) -> str:
        return self.answering_model or str(body["model"])

    def _chunks(self, body: dict[str, Any], reply: Reply, number: int) -> list[str]:
        """All SSE ``data:`` payloads of a streamed reply, in order, including ``[DONE]``."""
        dialect = self.dialect
        issued = self._issue(number, reply)
        billed = _usage(body, reply, dialect.usage_details, issued.reasoning)
        self.usages.append(billed)
        usage = _wire_usage(billed, dialect.usage_details)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self._answering(body),
        }
        null_usage = include_usage and dialect.usage == "chunk"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            if dialect.azure:
                choice["content_filter_results"] = _AZURE_FILTER
            padded = (
                {"obfuscation": secrets.token_urlsafe(secrets.randbelow(12))} if dialect.obfuscation else {}
            )
            return {**base, "choices": [choice], **({"usage": None} if null_usage else {}), **padded}

        out = [chunk({"role": "assistant", "content": "", "refusal": None})]
        if issued.reasoning is not None:
            pieces = _pieces(issued.reasoning, self.text_chunk)
            out += [chunk({"content": None, "reasoning_content": piece}) for piece in pieces]
        if reply.content:
            for i, piece in enumerate(_pieces(reply.content, self.text_chunk)):
                delta: dict[str, Any] = {"content": piece}
                if issued.reasoning is not None:
                    delta["reasoning_content"] = None
                if i == 0 and issued.signature is not None and not reply.tool_calls:
                    delta.update(issued.extra())  # Gemini signs a text reply on its first delta
                out.append(chunk(delta))
        out += [chunk({"tool_calls": fragments}) for fragments in self._call_deltas(reply, issued)]
        if dialect.azure:
            annotation = {
                "index": 0,
                "finish_reason": None,
                "content_filter_results": _AZURE_FILTER,
                "content_filter_offsets": {"check_offset": 0, "start_offset": 0, "end_offset": 40},
            }
            out.append(
                {"id": "", "object": "", "created": 0, "model": "", "choices": [annotation], "usage": None}
            )
        finish = chunk({}, reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"))
        out.append(finish)
        if dialect.usage == "finish":
            finish["usage"] = usage
        elif dialect.usage == "x_groq":
            finish["x_groq"] = {
                "id": f"req_{number}",
                "usage": {"queue_time": 0.01, **usage, "total_time": 0.02},
            }
        elif dialect.usage == "choice":
            finish["choices"][0]["usage"] = usage
        elif dialect.usage == "every":
            for i, item in enumerate(out, 1):  # a running count; the finish chunk has the whole
                done = usage["completion_tokens"] * i // len(out)
                item["usage"] = {
                    **usage,
                    "completion_tokens": done,
                    "total_tokens": usage["prompt_tokens"] + done,
                }
        elif include_usage:
            out.append({**base, "choices": [], "usage": usage})
        if dialect.azure:
            prompt_filter = [{"prompt_index": 0, "content_filter_results": _AZURE_FILTER}]
            out.insert(
                0,
                {
                    "choices": [],
                    "created": 0,
                    "id": "",
                    "model": "",
                    "object": "",
                    "prompt_filter_results": prompt_filter,
                },
            )
        return [*map(_dumps, out), dialect.done]

    def _call_deltas(self, reply: Reply, issued: _Issued) -> list[list[dict[str, Any]]]:
        """The ``tool_calls`` list of each chunk that carries calls, as the dialect streams them."""
        style = self.dialect.calls
        whole = [
            {
                "id": issued.ids[i],
                "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments_json()},
                **(issued.extra() if i == 0 else {}),
            }
            for i, tc in enumerate(reply.tool_calls)
        ]
        if not whole:
            return []
        if style == "noindex":
            return [whole]
        if style == "index0":
            return [[{**call, "index": 0}] for call in whole]
        per_call: list[list[dict[str, Any]]] = []
        for i, tc in enumerate(reply.tool_calls):
            index = 0 if style == "index0-split" else i
            pieces = _pieces(tc.arguments_json(), self.args_chunk)
            head = {
                "index": index,
                "id": issued.ids[i],
                "type": "function",
                **(issued.extra() if i == 0 else {}),
            }
            if style == "repeat-name":
                fragments = [{**head, "function": {"name": tc.name, "arguments": piece}} for piece in pieces]
            elif style == "late-name":
                fragments = [
                    {**head, "function": {"arguments": pieces[0]}},
                    {"index": index, "function": {"name": tc.name, "arguments": "".join(pieces[1:2])}},
                ]
                fragments += [{"index": index, "function": {"arguments": piece}} for piece in pieces[2:]]
            else:
                fragments = [{**head, "function": {"name": tc.name, "arguments": ""}}]
                fragments += [{"index": index, "function": {"arguments": p}} for p in pieces if p]
            per_call.append(fragments)
        if self.interleave and style == "indexed":
            ordered = [d for group in itertools.zip_longest(*per_call) for d in group if d is not None]
        else:
            ordered = [d for deltas in per_call for d in deltas]
        return [[d] for d in ordered]

    def _frame(self, payloads: list[str]) -> list[bytes]:
        """Each payload as an SSE event, with the dialect's line endings and heart-beats."""
        eol = self.dialect.eol
        beat = f"data:{eol}{eol}: keep-alive{eol}{eol}" if self.dialect.heartbeats else ""
        return [f"{beat}data: {data}{eol}{eol}".encode() for data in payloads]

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        events = self._frame(self._chunks(body, reply, next(self._ids)))
        if reply.break_after is not None:
            events = events[: reply.break_after]
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            if reply.chunk_delay > 0:
                for event in events:
                    await response.write(event)
                    await self._wait(reply.chunk_delay)
            else:
                await response.write(b"".join(events))
        except ConnectionError:
            return response
        if reply.break_after is not None:
            return self._cut(request, response)
        await response.write_eof()
        return response

    async def _stream_error(
        self, request: web.Request, body: dict[str, Any], err: Error
    ) -> web.StreamResponse:
        """HTTP 200, a first chunk, then the failure as this server reports one mid-stream."""
        number = next(self._ids)
        first = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self._answering(body),
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
        eol = self.dialect.eol
        if self.dialect.errors == "llamacpp-field":
            failure = {"code": err.status, "message": err.message, "type": err.type}
            tail = f"error: {_dumps(failure)}{eol}{eol}data: [DONE]{eol}{eol}".encode()
        else:
            shaped = (
                self._vllm_error(err)
                if self.dialect.errors == "vllm"
                else {"error": {"message": err.message, "type": err.type, "param": None, "code": err.code}}
            )
            tail = b"".join(self._frame([_dumps(shaped), self.dialect.done]))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(b"".join(self._frame([_dumps(first)])) + tail)
        await response.write_eof()
        return response

    @staticmethod
    def _cut(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        """Drop the connection mid-body, so the client sees an incomplete message."""
        assert request.transport is not None
        request.transport.close()
        return response


# --- command line -------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A scripted, OpenAI-compatible Chat Completions server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (see the READY line)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="delay before every answer")
    parser.add_argument("--text", default="Done.", help="the (final) text answer")
    parser.add_argument(
        "--tool-rounds", type=int, default=0, help="tool calls per user prompt before the final text"
    )
    parser.add_argument("--tool-name", default="read_file")
    parser.add_argument(
        "--tool-args", default='{"path": "README.md"}', help="JSON arguments of the tool call"
    )
    parser.add_argument("--turns-file", type=Path, help="JSON list of turns played before the default answer")
    parser.add_argument("--api-key", help="require this bearer token")
    parser.add_argument(
        "--dialect",
        default="openai",
        choices=sorted(DIALECTS),
        help="the real server whose stream to reproduce",
    )
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    fallback: TurnLike = (
        tool_loop(args.tool_rounds, args.tool_name, json.loads(args.tool_args), args.text)
        if args.tool_rounds > 0
        else text(args.text)
    )
    turns = [turn_from_json(t) for t in json.loads(args.turns_file.read_text())] if args.turns_file else []
    fake = FakeLLM(
        *turns,
        fallback=fallback,
        api_key=args.api_key,
        delay=args.delay_ms / 1000,
        dialect=args.dialect,
        host=args.host,
        port=args.port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with fake:
        print(f"{READY_PREFIX} {fake.base_url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGINT/SIGTERM, printing ``FAKE_LLM_READY <base_url>`` once listening."""
    asyncio.run(_serve(_parse_args(argv)))


if __name__ == "__main__":
    main()
