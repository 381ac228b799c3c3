"""Anthropic's Messages API (`provider: "anthropic"` or `"claude"`), spoken directly over aiohttp.

The request is built by anthropic_request.py, the streamed reply read by anthropic_stream.py, a
network read at a time (the text deltas one read brings go on as one, delta_runs.py). Keys
go in `x-api-key`, the API version in `anthropic-version`. Overloaded (529), rate-limited (429),
failing (5xx) and timed-out requests are retried as the OpenAI-compatible provider's are (http.py:
backoff, `retry-after`, the proxy HTTPS_PROXY / HTTP_PROXY name); so is an `overloaded_error` (or
`api_error`) event that arrives before any of the reply was passed on. A prompt too long for the
window is ContextOverflow, a rejected key FailedPrecondition, as from any provider; every message
is redacted of the key.

Why not the `anthropic` package: it streams the same turn at about four times the CPU
(`python -m benchmarks`, section agent), and brings nothing this needs that the wire format does not give.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from ..base.errors import Unavailable
from ..base.jsontext import model_json
from ..base.models import LLMConfig
from .anthropic_request import request_body
from .anthropic_stream import MessageReader
from .delta_runs import by_read
from .endpoints import ANTHROPIC_BASE_URL
from .http import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    RETRY_STATUSES,
    Endpoint,
    Retryable,
    error_text,
    http_failure,
    retrying,
)
from .provider import CompletionRequest, ProviderEvent
from .provider_errors import message_of, mid_reply_failure
from .sse import ServerEvent

ANTHROPIC_VERSION = "2023-06-01"
_RETRY_STATUSES = RETRY_STATUSES | {529}  # 529: overloaded
_RETRY_EVENTS = {"overloaded_error", "api_error", "rate_limit_error"}


def messages_url(base_url: str) -> str:
    """The Messages endpoint under a base URL given with or without its `/v1` (A3S Code and Box
    configs give `https://api.anthropic.com`)."""
    base = (base_url or ANTHROPIC_BASE_URL).rstrip("/")
    return f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"


class AnthropicProvider:
    """One endpoint and key, with its connection pool; `thinking` turns extended thinking on."""

    def __init__(
        self,
        llm: LLMConfig,
        *,
        thinking: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_RETRIES,
    ) -> None:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "anthropic-version": ANTHROPIC_VERSION,
        }
        if llm.api_key:
            headers["x-api-key"] = llm.api_key
        self._endpoint = Endpoint(messages_url(llm.base_url), llm.api_key, headers, timeout_s)
        self._thinking = thinking
        self._max_retries = max_retries
        self.state_key = f"anthropic {self._endpoint.shown}"
        """Whose ProviderState this provider writes and reads back: the signed thinking of a turn."""

    async def close(self) -> None:
        await self._endpoint.close()

    def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        """The turn's events, with retries; every failure's message is redacted on its way out.
        `response_format` is not sent: the Messages API has none, and the prompt asks for the JSON,
        which GenerateStructured validates (and has repaired)."""
        return retrying(
            request_body(request, self.state_key, thinking=self._thinking),
            partial(self._attempt, trace_headers=request.trace_headers),
            retries=self._max_retries,
            secrets=self._endpoint.secrets,
        )

    async def _attempt(self, body: bytes, trace_headers: dict[str, str]) -> AsyncIterator[ProviderEvent]:
        """One request: text as it comes, each tool call once its block stops, then TurnEnd."""
        reader = MessageReader(self.state_key)
        async with self._endpoint.post(body, trace_headers) as response:
            if response.status >= 400:
                text = await error_text(response)
                raise http_failure(response, text, self._endpoint.shown, _RETRY_STATUSES)
            async for ready in by_read(response, partial(_take, reader)):
                yield ready
        for ready in reader.finish():
            yield ready


def _take(reader: MessageReader, batch: list[ServerEvent], events: list[ProviderEvent]) -> bool:
    """The events of one read fed to `reader` up to message_stop, what they complete added to
    `events`; True once message_stop came."""
    for event in batch:
        events += reader.feed(_parsed(event))
        if reader.stopped:
            return True
    return False


def _parsed(event: ServerEvent) -> dict[str, Any]:
    """An event's JSON object ({} for an empty one); an `error` event raised as what it reports."""
    if not event.data.strip():
        return {}
    try:
        data = model_json(event.data)  # a model's lone surrogates become U+FFFD
    except ValueError as exc:
        raise Unavailable(f"the LLM provider sent a malformed event: {event.data[:200]!r}") from exc
    if not isinstance(data, dict):
        return {}
    if event.event == "error" or data.get("type") == "error":
        raise _stream_failure(data)
    return data


def _stream_failure(data: dict[str, Any]) -> Exception:
    """An `error` event: overloaded and the like are worth another try (when nothing was passed on)."""
    error = data.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    if kind in _RETRY_EVENTS:
        return Retryable(f"the LLM provider failed mid-reply ({kind}): {message_of(data)}")
    return mid_reply_failure(data)
