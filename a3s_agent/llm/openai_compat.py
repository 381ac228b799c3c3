"""Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, DeepSeek, Kimi, OpenRouter...).

Spoken directly over aiohttp: the request is JSON, the streamed reply is server-sent events
(sse.py) of `chat.completion.chunk` objects (openai_stream.py assembles the turn, with each
server's quirks). The `openai` package did the same at several times the CPU per model turn,
which capped how many sessions one process could drive (tools/bench.py, section agent).
Retries, backoff and Retry-After follow the OpenAI client's conventions. Servers that refuse
`stream_options` (Groq, Mistral with 422, xAI) are asked again without it, and the provider
(one per endpoint) remembers not to send it there again.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..base.backoff import Backoff
from ..base.errors import AgentError, FailedPrecondition, InvalidArgument, Unavailable
from ..base.jsontext import valid_text
from ..base.models import LLMConfig
from .messages import with_provider_state
from .openai_stream import TurnReader, whole_reply
from .provider import CompletionRequest, ProviderEvent
from .provider_errors import error_message, is_context_overflow, mid_reply_failure, overflow
from .redact import redact, shown_url, url_secrets
from .sse import server_events

if TYPE_CHECKING:
    import aiohttp

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 3
_RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504}
_MAX_RETRY_AFTER_S = 60.0
_RETRY_INITIAL_S, _RETRY_MAX_S, _RETRY_JITTER = 0.5, 8.0, 0.25  # 0.5 s doubling up to 8 s, 75-100%


class _StreamOptionsRefused(InvalidArgument):
    """The server refused the request for its `stream_options` field."""


class _Retryable(Exception):
    """A failure worth another try; `delay_s` is what the server asked for, if anything."""

    def __init__(self, message: str, delay_s: float | None = None) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class OpenAICompatibleProvider:
    """One endpoint (and key); its connection pool and what it was found to refuse live here."""

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
        self.state_key = f"openai-compatible {self._shown_url}"
        """Whose ProviderState this provider writes and reads back: an OpenAI-compatible server's
        fields (reasoning_content, extra_content) go back to that endpoint only; another server
        may refuse them (Mistral and Groq reject unknown message fields)."""
        self._stream_options = True  # until the endpoint refuses them

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
            try:
                async for event in self._retrying(request):
                    yield event
            except _StreamOptionsRefused:
                self._stream_options = False  # refused before any reply: nothing was yielded
                async for event in self._retrying(request):
                    yield event
        except AgentError as exc:
            exc.args = (redact(str(exc), self._secrets),)
            raise

    async def _retrying(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        with_options = self._stream_options
        body = await _encoded(self._body(request, with_options))
        backoff = Backoff(_RETRY_INITIAL_S, _RETRY_MAX_S, jitter=_RETRY_JITTER)
        for attempt in range(self._max_retries + 1):
            started = False
            try:
                async for event in self._attempt(body, with_options):
                    started = True
                    yield event
                return
            except _Retryable as exc:
                # Once text has reached the caller a retry would repeat it: fail instead.
                if started or attempt == self._max_retries:
                    raise Unavailable(f"{exc} (after {attempt + 1} attempts)") from exc
                await asyncio.sleep(_retry_delay(exc.delay_s, backoff.next_s()))

    async def _attempt(self, body: bytes, with_options: bool) -> AsyncIterator[ProviderEvent]:
        import aiohttp

        try:
            # A big body goes as a file-like object, written a chunk at a time between other work.
            data = io.BytesIO(body) if len(body) > _BIG_BODY_CHARS else body
            async with self._client().post(self._url, data=data, headers=self._headers) as response:
                if response.status >= 400:
                    await _raise_for_status(response, self._shown_url, with_options)
                if response.content_type == "application/json":  # a server that ignored stream=true
                    for event in whole_reply(_json_reply(await response.read()), self.state_key):
                        yield event
                else:
                    async for event in self._read_stream(response):
                        yield event
        except TimeoutError as exc:
            raise _Retryable(
                f"the LLM provider at {self._shown_url} timed out after {self._timeout_s:g} s"
            ) from exc
        except aiohttp.ClientPayloadError as exc:
            raise Unavailable(f"the LLM provider's reply broke off: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise _Retryable(f"cannot reach the LLM provider at {self._shown_url}: {exc}") from exc

    async def _read_stream(self, response: aiohttp.ClientResponse) -> AsyncIterator[ProviderEvent]:
        """Text deltas as they come, each tool call once its arguments are complete, then TurnEnd."""
        reader = TurnReader(self.state_key)
        events = server_events(response.content.iter_any())
        async for event in events:
            if event.error or event.event == "error":  # old llama.cpp's `error:` field, `event: error`
                raise mid_reply_failure(_parsed(event.error or event.data))
            payload = event.data.strip()
            if not payload:  # an empty `data:` heart-beat
                continue
            if payload == "[DONE]":
                break
            try:
                chunk = valid_text(json.loads(payload))  # a model's lone surrogates become U+FFFD
            except ValueError as exc:
                raise Unavailable(f"the LLM provider sent a malformed chunk: {payload[:200]!r}") from exc
            for ready in reader.feed(chunk):
                yield ready
        await events.aclose()
        for ready in reader.finish():
            yield ready

    def _body(self, request: CompletionRequest, with_options: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": with_provider_state(request.messages, self.state_key),
            "stream": True,
        }
        if with_options:
            body["stream_options"] = {"include_usage": True}
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


def _parsed(text: str) -> Any:
    """A JSON error report, or the text when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_reply(raw: bytes) -> Any:
    """A whole JSON reply; invalid UTF-8 is replaced, not fatal, as in streamed replies."""
    try:
        return valid_text(json.loads(raw.decode("utf-8", errors="replace")))
    except ValueError as exc:
        raise Unavailable(f"the LLM provider sent malformed JSON: {exc}") from exc


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


async def _raise_for_status(response: aiohttp.ClientResponse, url: str, sent_stream_options: bool) -> None:
    text = await response.text(errors="replace")
    message = error_message(text) or response.reason or "no message"
    status = response.status
    if is_context_overflow(text):
        raise overflow(f"HTTP {status}", message)
    if sent_stream_options and status in (400, 422) and "stream_options" in text:
        raise _StreamOptionsRefused(f"the LLM provider refused stream_options (HTTP {status}): {message}")
    if status == 401:
        raise FailedPrecondition(f"the LLM provider at {url} rejected the API key (HTTP 401): {message}")
    if status == 403:
        raise FailedPrecondition(f"the LLM provider refused access (HTTP 403): {message}")
    if status in _RETRY_STATUSES and response.headers.get("x-should-retry") != "false":
        raise _Retryable(f"the LLM provider failed (HTTP {status}): {message}", _retry_after(response))
    if status < 500:
        raise InvalidArgument(f"the LLM provider refused the request (HTTP {status}): {message}")
    raise Unavailable(f"the LLM provider failed (HTTP {status}): {message}")
