"""Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, DeepSeek, Kimi, OpenRouter...).

Spoken directly over aiohttp: the request is JSON, the streamed reply is server-sent events
(sse.py) of `chat.completion.chunk` objects (openai_stream.py assembles the turn, with each
server's quirks), read a network read at a time: the text deltas one read brings go on as one
(delta_runs.py). The `openai` package did the same at several times the CPU per model turn,
which capped how many sessions one process could drive (`python -m benchmarks`, section agent).
Retries, backoff and Retry-After follow the OpenAI client's conventions (http.py). Servers that refuse
`stream_options` (Groq, Mistral with 422, xAI) are asked again without it, and the provider
(one per endpoint) remembers not to send it there again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ..base.errors import InvalidArgument, Unavailable
from ..base.jsontext import model_json
from ..base.models import LLMConfig
from .delta_runs import by_read
from .endpoints import OPENAI_BASE_URL
from .http import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, Endpoint, error_text, http_failure, retrying, whole_body
from .json_body import fixed_json
from .messages import on_the_wire, tool_images_after_results
from .openai_stream import TurnReader, whole_reply
from .provider import CompletionRequest, ProviderEvent
from .provider_errors import error_message, is_context_overflow, mid_reply_failure
from .sse import ServerEvent

if TYPE_CHECKING:
    import aiohttp


class _StreamOptionsRefused(InvalidArgument):
    """The server refused the request for its `stream_options` field."""


class OpenAICompatibleProvider:
    """One endpoint (and key); its connection pool and what it was found to refuse live here."""

    def __init__(
        self, llm: LLMConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_retries: int = DEFAULT_RETRIES
    ) -> None:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if llm.api_key:
            headers["Authorization"] = f"Bearer {llm.api_key}"
        url = (llm.base_url or OPENAI_BASE_URL).rstrip("/") + "/chat/completions"
        self._endpoint = Endpoint(url, llm.api_key, headers, timeout_s)
        self._max_retries = max_retries
        self.state_key = f"openai-compatible {self._endpoint.shown}"
        """Whose ProviderState this provider writes and reads back: an OpenAI-compatible server's
        fields (reasoning_content, extra_content) go back to that endpoint only; another server
        may refuse them (Mistral and Groq reject unknown message fields)."""
        self._stream_options = True  # until the endpoint refuses them

    async def close(self) -> None:
        await self._endpoint.close()

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        try:
            async for event in self._with_options(request):
                yield event
        except InvalidArgument:
            if request.response_format is None:
                raise
            # Not every OpenAI-compatible server knows json_schema response formats; the
            # prompt asks for the JSON too, so ask again without it.
            async for event in self._with_options(replace(request, response_format=None)):
                yield event

    async def _with_options(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        try:
            async for event in self._requests(request):
                yield event
        except _StreamOptionsRefused:
            self._stream_options = False  # refused before any reply: nothing was yielded
            async for event in self._requests(request):
                yield event

    def _requests(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        with_options = self._stream_options
        return retrying(
            self._body(request, with_options),
            lambda body: self._attempt(body, with_options, request.trace_headers),
            retries=self._max_retries,
            secrets=self._endpoint.secrets,
        )

    async def _attempt(
        self, body: bytes, with_options: bool, trace_headers: dict[str, str]
    ) -> AsyncIterator[ProviderEvent]:
        async with self._endpoint.post(body, trace_headers) as response:
            if response.status >= 400:
                raise await self._failure(response, with_options)
            if response.content_type == "application/json":  # a server that ignored stream=true
                for event in whole_reply(_json_reply(await whole_body(response)), self.state_key):
                    yield event
            else:
                async for event in self._read_stream(response):
                    yield event

    async def _failure(self, response: aiohttp.ClientResponse, sent_stream_options: bool) -> Exception:
        text = await error_text(response)
        status = response.status
        refused = sent_stream_options and status in (400, 422) and "stream_options" in text
        if refused and not is_context_overflow(text):
            message = error_message(text) or response.reason or "no message"
            return _StreamOptionsRefused(
                f"the LLM provider refused stream_options (HTTP {status}): {message}"
            )
        return http_failure(response, text, self._endpoint.shown)

    async def _read_stream(self, response: aiohttp.ClientResponse) -> AsyncIterator[ProviderEvent]:
        """Text deltas as they come (those of one network read joined), each tool call once its
        arguments are complete, then TurnEnd."""
        reader = TurnReader(self.state_key)
        async for ready in by_read(response, partial(_take, reader)):
            yield ready
        for ready in reader.finish():
            yield ready

    def _body(self, request: CompletionRequest, with_options: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": tool_images_after_results(on_the_wire(request.messages, self.state_key)),
            "stream": True,
        }
        if with_options:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = fixed_json(request.tools)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens:
            body["max_tokens"] = request.max_tokens
        if request.stop:
            body["stop"] = request.stop
        if request.response_format is not None:
            body["response_format"] = request.response_format
        return body


def _take(reader: TurnReader, batch: list[ServerEvent], events: list[ProviderEvent]) -> bool:
    """The chunks of one read fed to `reader`, the events they complete added to `events`; True
    once `[DONE]` came (what follows it is not read)."""
    for event in batch:
        if event.error or event.event == "error":  # old llama.cpp's `error:` field, `event: error`
            raise mid_reply_failure(_parsed(event.error or event.data))
        payload = event.data.strip()
        if not payload:  # an empty `data:` heart-beat
            continue
        if payload == "[DONE]":
            return True
        events += reader.feed_text(payload)
    return False


def _parsed(text: str) -> Any:
    """A JSON error report, or the text when it is not JSON."""
    try:
        return model_json(text)
    except ValueError:
        return text


def _json_reply(raw: bytes) -> Any:
    """A whole JSON reply; invalid UTF-8 is replaced, not fatal, as in streamed replies."""
    try:
        return model_json(raw.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise Unavailable(f"the LLM provider sent malformed JSON: {exc}") from exc
