"""What a generation's metrics record (base/metrics.py), in the OpenTelemetry GenAI conventions
where they name one: tokens and duration per model request, the cost of its tokens, the duration of
a generation and how it ended, the duration and outcome of each tool call, compactions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from ...base import metrics
from ...base.models import LLMConfig, Usage
from ...llm.provider import ProviderEvent, TurnEnd

OTHER_TOOL = "_OTHER"
"""The tool name of a call of a tool the request does not offer: the model made the name up, and a
metric's labels must not grow with what it makes up."""


def _model(llm: LLMConfig, operation: str) -> dict[str, str]:
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": llm.provider or "openai",
        "gen_ai.request.model": llm.model,
    }


async def measured(events: AsyncIterator[ProviderEvent], llm: LLMConfig) -> AsyncIterator[ProviderEvent]:
    """A model request's events, its tokens, cost and duration recorded (only when metrics are on:
    see `of`)."""
    started = time.perf_counter()
    attributes = _model(llm, "chat")
    error = ""
    try:
        async for event in events:
            if isinstance(event, TurnEnd) and event.usage is not None:
                _tokens(attributes, event.usage)
            yield event
    except BaseException as exc:
        error = type(exc).__qualname__
        raise
    finally:
        ended = {**attributes, "error.type": error} if error else attributes
        metrics.record(metrics.OPERATION_DURATION, time.perf_counter() - started, ended)


def of(events: AsyncIterator[ProviderEvent], llm: LLMConfig) -> AsyncIterator[ProviderEvent]:
    """`events` measured when metrics are on, else as they are."""
    return measured(events, llm) if metrics.enabled() else events


def _tokens(attributes: dict[str, str], usage: Usage) -> None:
    for kind, count in (("input", usage.prompt_tokens), ("output", usage.completion_tokens)):
        metrics.record(metrics.TOKEN_USAGE, count, {**attributes, "gen_ai.token.type": kind})
    metrics.spend(attributes, usage.prompt_tokens, usage.completion_tokens)


def generation_ended(llm: LLMConfig, seconds: float, finish_reason: str, error: str) -> None:
    """A generation's end: its duration (an `invoke_agent` operation) and how it ended."""
    if not metrics.enabled():
        return
    attributes = _model(llm, "invoke_agent")
    if error:
        attributes["error.type"] = error
    metrics.record(metrics.OPERATION_DURATION, seconds, attributes)
    metrics.add(metrics.GENERATIONS, 1, {"gen_ai.response.finish_reason": finish_reason or "error"})


def tool_call(name: str | None, success: bool, seconds: float) -> None:
    """A tool call's end; `name` None for a tool the request does not offer."""
    if not metrics.enabled():
        return
    attributes = {
        "gen_ai.tool.name": name or OTHER_TOOL,
        "a3s.tool.outcome": "success" if success else "error",
    }
    metrics.record(metrics.TOOL_DURATION, seconds, attributes)


def compaction(requested: bool, overflowed: bool, summarized_by: str) -> None:
    """A compaction done: asked for by a client (`request`), after the provider refused the prompt
    (`overflow`) or before a model call past the threshold (`threshold`)."""
    if not metrics.enabled():
        return
    trigger = "request" if requested else "overflow" if overflowed else "threshold"
    attributes = {"a3s.compaction.trigger": trigger, "a3s.compaction.summarized_by": summarized_by}
    metrics.add(metrics.COMPACTIONS, 1, attributes)
