"""Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, DeepSeek, Kimi, OpenRouter...).

Spoken directly over aiohttp: the request is JSON, the streamed reply is server-sent events of
`chat.completion.chunk` objects. (The `openai` package did the same at about five times the CPU
per model turn, which capped how many sessions one process could drive; see tools/bench.py.)
Retries, backoff and Retry-After follow the OpenAI client's conventions.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..base.backoff import Backoff
from ..base.errors import AgentError, ContextOverflow, FailedPrecondition, InvalidArgument, Unavailable
from ..base.jsontext import valid_text
from ..base.models import LLMConfig, Usage
from .provider import CompletionRequest, ProviderEvent, TextDelta, ToolCallReady, TurnEnd
from .redact import redact, shown_url, url_secrets

if TYPE_CHECKING:
    import aiohttp

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 3
_RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504}
_MAX_RETRY_AFTER_S = 60.0
_RETRY_INITIAL_S, _RETRY_MAX_S, _RETRY_JITTER = 0.5, 8.0, 0.25  # 0.5 s doubling up to 8 s, 75-100%


class _Retryable(Exception):
    """A failure worth another try; `delay_s` is what the server asked for, if anything."""

    def __init__(self, message: str, delay_s: float | None = None) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class OpenAICompatibleProvider:
    def __init__(
        self, llm: LLMConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_retries: int = DEFAULT_RETRIES
    ) -> None:
        self._url = (llm.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
        self._shown_url = shown_url(self._url)
        self._secrets = [llm.api_key, *url_secrets(self._url)]
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if llm.api_key:
            self._headers["Authorization"] = f"Bearer {llm.api_key}"
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # aiohttp is imported on first use: its import costs the server's start-up a quarter second.
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            # No total limit (a long answer may stream for minutes), but silence is bounded.
            timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout_s, sock_read=self._timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        try:
            async for event in self._with_retries(request):
                yield event
        except InvalidArgument:
            if request.response_format is None:
                raise
            # Not every OpenAI-compatible server knows json_schema response formats; the
            # prompt asks for the JSON too, so ask again without it.
            async for event in self._with_retries(replace(request, response_format=None)):
                yield event

    async def _with_retries(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        """Every failure's message passes through here, redacted, on its way to clients, logs and store."""
        try:
            async for event in self._retrying(request):
                yield event
        except AgentError as exc:
            exc.args = (redact(str(exc), self._secrets),)
            raise

    async def _retrying(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        body = await _encoded(_body(request))
        backoff = Backoff(_RETRY_INITIAL_S, _RETRY_MAX_S, jitter=_RETRY_JITTER)
        for attempt in range(self._max_retries + 1):
            started = False
            try:
                async for event in self._attempt(body):
                    started = True
                    yield event
                return
            except _Retryable as exc:
                # Once text has reached the caller a retry would repeat it: fail instead.
                if started or attempt == self._max_retries:
                    raise Unavailable(f"{exc} (after {attempt + 1} attempts)") from exc
                await asyncio.sleep(_retry_delay(exc.delay_s, backoff.next_s()))

    async def _attempt(self, body: bytes) -> AsyncIterator[ProviderEvent]:
        import aiohttp

        try:
            # A big body goes as a file-like object, written a chunk at a time between other work.
            data = io.BytesIO(body) if len(body) > _BIG_BODY_CHARS else body
            async with self._client().post(self._url, data=data, headers=self._headers) as response:
                if response.status >= 400:
                    await _raise_for_status(response, self._shown_url)
                if response.content_type == "application/json":  # a server that ignored stream=true
                    events = _parse_whole(_json_reply(await response.read()))
                else:
                    events = _parse_stream(response)
                async for event in events:
                    yield event
        except TimeoutError as exc:
            raise _Retryable(
                f"the LLM provider at {self._shown_url} timed out after {self._timeout_s:g} s"
            ) from exc
        except aiohttp.ClientPayloadError as exc:
            raise Unavailable(f"the LLM provider's reply broke off: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise _Retryable(f"cannot reach the LLM provider at {self._shown_url}: {exc}") from exc


def _json_reply(raw: bytes) -> Any:
    """A whole JSON reply; invalid UTF-8 is replaced, not fatal, as in streamed replies."""
    try:
        return valid_text(json.loads(raw.decode("utf-8", errors="replace")))
    except ValueError as exc:
        raise Unavailable(f"the LLM provider sent malformed JSON: {exc}") from exc


def _body(request: CompletionRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model,
        "messages": request.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = request.tools
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.max_tokens:
        body["max_tokens"] = request.max_tokens
    if request.stop:
        body["stop"] = request.stop
    if request.response_format is not None:
        body["response_format"] = request.response_format
    return body


_BIG_BODY_CHARS = 256 * 1024
_SLICE_CHARS = 256 * 1024


async def _encoded(body: dict[str, Any]) -> bytes:
    """The request body as bytes. A big one is encoded in a worker thread, long strings a slice at a
    time: one json.dumps call holds the interpreter lock throughout, and on a 50 MB message that
    would stall every other request of the server for a noticeable time."""
    if _content_chars(body["messages"]) < _BIG_BODY_CHARS:
        return json.dumps(body).encode()
    return await asyncio.to_thread(lambda: "".join(_json_pieces(body)).encode())


def _content_chars(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(json.dumps(part)) for part in content)
    return total


def _json_pieces(value: Any) -> Iterator[str]:
    """json.dumps(value), in pieces."""
    if isinstance(value, str) and len(value) > _SLICE_CHARS:
        yield '"'
        for start in range(0, len(value), _SLICE_CHARS):
            yield json.dumps(value[start : start + _SLICE_CHARS])[1:-1]
        yield '"'
    elif isinstance(value, dict):
        yield "{"
        for index, (key, item) in enumerate(value.items()):
            yield f"{', ' if index else ''}{json.dumps(key)}: "
            yield from _json_pieces(item)
        yield "}"
    elif isinstance(value, list):
        yield "["
        for index, item in enumerate(value):
            if index:
                yield ", "
            yield from _json_pieces(item)
        yield "]"
    else:
        yield json.dumps(value)


def _retry_delay(asked_s: float | None, backoff_s: float) -> float:
    """The delay the provider asked for (Retry-After), when sensible, else our own backoff."""
    return asked_s if asked_s is not None and 0 < asked_s <= _MAX_RETRY_AFTER_S else backoff_s


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = response.headers.get(header)
        if value:
            try:
                return float(value) * scale
            except ValueError:
                return None
    return None


async def _raise_for_status(response: aiohttp.ClientResponse, url: str) -> None:
    text = await response.text(errors="replace")
    message = _error_message(text) or response.reason or "no message"
    status = response.status
    if is_context_overflow(text):
        raise _overflow(f"HTTP {status}", message)
    if status == 401:
        raise FailedPrecondition(f"the LLM provider at {url} rejected the API key (HTTP 401): {message}")
    if status == 403:
        raise FailedPrecondition(f"the LLM provider refused access (HTTP 403): {message}")
    if status in _RETRY_STATUSES and response.headers.get("x-should-retry") != "false":
        raise _Retryable(f"the LLM provider failed (HTTP {status}): {message}", _retry_after(response))
    if status < 500:
        raise InvalidArgument(f"the LLM provider refused the request (HTTP {status}): {message}")
    raise Unavailable(f"the LLM provider failed (HTTP {status}): {message}")


# How providers say a prompt is longer than the model's window: OpenAI (the code and its message),
# Anthropic, vLLM, llama.cpp (its message and its error type).
_OVERFLOW = re.compile(
    r"context_length_exceeded|maximum context length|prompt is too long|longer than the model's context"
    r"|longer than the maximum model length|exceeds the available context size|context size exceeded"
    r"|exceed_context_size_error",
    re.IGNORECASE,
)


def is_context_overflow(error_text: str) -> bool:
    """Whether a provider's error body (JSON or text) says the prompt does not fit the window."""
    return bool(_OVERFLOW.search(error_text[:10_000]))


def _overflow(where: str, message: str) -> ContextOverflow:
    return ContextOverflow(
        f"the prompt is longer than the model's context window (the LLM provider refused it, {where}): {message}"
    )


def _error_message(text: str) -> str:
    """The provider's own message from an OpenAI-style error body."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(error)[:500]


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The data of each server-sent event (multi-line data joined), until [DONE]."""
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            payload = "\n".join(data)
            data = []
            if payload == "[DONE]":
                return
            yield payload
    if data and data != ["[DONE]"]:
        yield "\n".join(data)


async def _parse_stream(response: aiohttp.ClientResponse) -> AsyncIterator[ProviderEvent]:
    """Text deltas as they come, each tool call once its arguments are complete, then TurnEnd."""
    pending: dict[int, dict[str, str]] = {}  # tool calls by index, arguments still arriving
    emitted: set[int] = set()
    finish_reason = ""
    usage: Usage | None = None
    async for payload in _events(response):
        try:
            chunk = valid_text(json.loads(payload))  # a model's lone surrogates become U+FFFD
        except ValueError as exc:
            raise Unavailable(f"the LLM provider sent a malformed chunk: {payload[:200]!r}") from exc
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            if is_context_overflow(payload):
                raise _overflow("mid-reply", _error_message(payload))
            raise Unavailable(f"the LLM provider failed mid-reply: {_error_message(payload)}")
        if chunk.get("usage"):
            usage = Usage(
                chunk["usage"].get("prompt_tokens") or 0, chunk["usage"].get("completion_tokens") or 0
            )
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                yield TextDelta(delta["content"])
            for call in delta.get("tool_calls") or ():
                index = call.get("index", 0)
                if index in emitted:
                    continue
                if index not in pending:
                    # A new call starts: earlier ones whose arguments form complete JSON are done.
                    for ready in _complete(pending, emitted):
                        yield ready
                    pending[index] = {"id": "", "name": "", "arguments": ""}
                entry = pending[index]
                entry["id"] = call.get("id") or entry["id"]
                function = call.get("function") or {}
                entry["name"] += function.get("name") or ""
                entry["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                finish_reason = choice["finish_reason"]
    if not finish_reason:
        raise Unavailable("the LLM provider ended its reply without a finish reason (stream broken off)")
    for index in sorted(pending):
        entry = pending[index]
        yield ToolCallReady(entry["id"], entry["name"], entry["arguments"] or "{}")
    yield TurnEnd(finish_reason, usage)


async def _parse_whole(completion: Any) -> AsyncIterator[ProviderEvent]:
    """The same events from a non-streamed `chat.completion` object."""
    choices = completion.get("choices") if isinstance(completion, dict) else None
    if not choices:
        raise Unavailable(f"the LLM provider answered without choices: {str(completion)[:200]}")
    message = choices[0].get("message") or {}
    if message.get("content"):
        yield TextDelta(message["content"])
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        yield ToolCallReady(call.get("id", ""), function.get("name", ""), function.get("arguments") or "{}")
    usage = completion.get("usage") or {}
    yield TurnEnd(
        choices[0].get("finish_reason") or "stop",
        Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0) if usage else None,
    )


def _complete(pending: dict[int, dict[str, str]], emitted: set[int]) -> list[ToolCallReady]:
    """Remove and return the pending calls whose arguments already parse as JSON.

    Parallel calls may arrive interleaved by index, so a new index alone proves nothing."""
    ready = []
    for index in sorted(pending):
        entry = pending[index]
        try:
            json.loads(entry["arguments"])  # empty means not started yet: not complete
        except ValueError:
            continue
        ready.append(ToolCallReady(entry["id"], entry["name"], entry["arguments"]))
        emitted.add(index)
        del pending[index]
    return ready
