"""Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, DeepSeek, Kimi, OpenRouter...)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import openai

from ..core.errors import FailedPrecondition, InvalidArgument, Unavailable
from ..core.models import LLMConfig, Usage
from .provider import CompletionRequest, ProviderEvent, TextDelta, ToolCallReady, TurnEnd

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 3
# Local servers (Ollama, vLLM) take any key, but the client insists on one.
_PLACEHOLDER_KEY = "not-needed"


class OpenAIProvider:
    def __init__(
        self, llm: LLMConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_retries: int = DEFAULT_RETRIES
    ) -> None:
        # The client retries 429, 5xx and connection errors itself, with backoff and Retry-After.
        self._client = openai.AsyncOpenAI(
            api_key=llm.api_key or _PLACEHOLDER_KEY,
            base_url=llm.base_url or None,
            timeout=timeout_s,
            max_retries=max_retries,
        )
        self._label = llm.base_url or "api.openai.com"

    async def close(self) -> None:
        await self._client.close()

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        try:
            try:
                async for event in self._stream(request):
                    yield event
            except openai.BadRequestError:
                if request.response_format is None:
                    raise
                # Not every OpenAI-compatible server knows json_schema response formats; the
                # prompt asks for the JSON too, so ask again without it.
                async for event in self._stream(replace(request, response_format=None)):
                    yield event
        except openai.AuthenticationError as exc:
            raise FailedPrecondition(
                f"the LLM provider at {self._label} rejected the API key (HTTP 401): {_message(exc)}"
            ) from exc
        except openai.PermissionDeniedError as exc:
            raise FailedPrecondition(f"the LLM provider refused access (HTTP 403): {_message(exc)}") from exc
        except (openai.BadRequestError, openai.NotFoundError, openai.UnprocessableEntityError) as exc:
            raise InvalidArgument(f"the LLM provider refused the request: {_message(exc)}") from exc
        except openai.APITimeoutError as exc:
            raise Unavailable(f"the LLM provider at {self._label} timed out") from exc
        except openai.APIConnectionError as exc:
            raise Unavailable(f"cannot reach the LLM provider at {self._label}: {exc}") from exc
        except openai.APIStatusError as exc:
            raise Unavailable(
                f"the LLM provider failed (HTTP {exc.status_code}) after retries: {_message(exc)}"
            ) from exc
        except openai.APIError as exc:
            raise Unavailable(f"the LLM provider failed: {_message(exc)}") from exc

    async def _stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        stream = await self._client.chat.completions.create(**_arguments(request))
        pending: dict[int, dict[str, str]] = {}  # tool calls by index, arguments still arriving
        emitted: set[int] = set()
        finish_reason = ""
        usage: Usage | None = None
        async with stream:
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = Usage(chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0)
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta.content:
                        yield TextDelta(delta.content)
                    for call in delta.tool_calls or []:
                        if call.index in emitted:
                            continue
                        if call.index not in pending:
                            # A new call starts: earlier ones whose arguments form complete JSON are done.
                            for ready in _complete(pending, emitted):
                                yield ready
                            pending[call.index] = {"id": "", "name": "", "arguments": ""}
                        entry = pending[call.index]
                        entry["id"] = call.id or entry["id"]
                        if call.function is not None:
                            entry["name"] += call.function.name or ""
                            entry["arguments"] += call.function.arguments or ""
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
        if not finish_reason:
            raise Unavailable("the LLM provider ended its reply without a finish reason (stream broken off)")
        for index in sorted(pending):
            entry = pending[index]
            yield ToolCallReady(entry["id"], entry["name"], entry["arguments"] or "{}")
        yield TurnEnd(finish_reason, usage)


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


def _arguments(request: CompletionRequest) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "model": request.model,
        "messages": request.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        arguments["tools"] = request.tools
    if request.temperature is not None:
        arguments["temperature"] = request.temperature
    if request.max_tokens:
        arguments["max_tokens"] = request.max_tokens
    if request.stop:
        arguments["stop"] = request.stop
    if request.response_format is not None:
        arguments["response_format"] = request.response_format
    return arguments


def _message(exc: openai.APIError) -> str:
    """The provider's own error message, without echoing any key."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return exc.message
