"""What a generation's trace records (base/telemetry.py), in the OpenTelemetry GenAI semantic
conventions: an `invoke_agent` span per generation, a `chat` span per model request under it, an
`execute_tool` span per tool call (tool_gate.py). No content: prompts, completions, tool arguments
and outputs are recorded only when the operator opts in (span_content.py)."""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from ...base import telemetry
from ...base.models import LLMConfig, ToolCall, Usage
from ...tools.registry import ToolOutput
from ..store.session import Session
from .context import Compaction

if TYPE_CHECKING:
    from opentelemetry.trace import Span

AGENT_NAME = "a3s-agent"
"""The agent's name on a session that is not a subagent's (whose name is its agent's)."""


def _common(session: Session, llm: LLMConfig, operation: str) -> dict[str, str]:
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": llm.provider or "openai",
        "gen_ai.request.model": llm.model,
        "gen_ai.conversation.id": session.id,
    }


def agent_span(session: Session, llm: LLMConfig) -> Span | None:
    """The `invoke_agent` span of a generation, under the current span (a request's, or the `task`
    tool call's that started a subagent)."""
    if not telemetry.enabled():
        return None
    name = session.parent.agent if session.parent is not None else AGENT_NAME
    attributes = {**_common(session, llm, "invoke_agent"), "gen_ai.agent.name": name}
    return telemetry.start(f"invoke_agent {name}", attributes)


def chat_span(parent: Span | None, session: Session, llm: LLMConfig) -> Span | None:
    """The `chat` span of one model request (a client span: it carries its trace context out)."""
    if parent is None:
        return None
    return telemetry.start(f"chat {llm.model}", _common(session, llm, "chat"), kind="client", parent=parent)


def outcome(finish_reason: str, usage: Usage, model: str = "") -> dict[str, str | int | list[str]]:
    """A model request's or a generation's end: finish reason, the response's model, its tokens."""
    attributes: dict[str, str | int | list[str]] = {
        "gen_ai.response.finish_reasons": [finish_reason],
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }
    if model:
        attributes["gen_ai.response.model"] = model
    for name, count in (
        ("gen_ai.usage.cache_read.input_tokens", usage.cache_read_tokens),
        ("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens),
        ("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens),
    ):
        if count:
            attributes[name] = count
    return attributes


def tool_span(session: Session, call: ToolCall) -> AbstractContextManager[Span | None]:
    """The `execute_tool` span of a call, current in the call's task (whose context is its
    generation's: see Agent), so what the gate decides is noted on it and a subagent's
    `invoke_agent` span is under it."""
    if not telemetry.enabled():
        return nullcontext()
    return telemetry.span(f"execute_tool {call.name}", _tool_attributes(session, call))


async def compacted(
    parent: Span | None, session: Session, trigger: str, compacting: Awaitable[Compaction]
) -> Compaction:
    """`compacting` (a compaction of the session's context), in a `compact_context` span under
    `parent` (else the current span): `threshold` (before a model call), `overflow` (after the
    provider refused the prompt as too long) or `requested` (a client's CompactContext)."""
    if not telemetry.enabled():
        return await compacting
    attributes = {"a3s.compaction.trigger": trigger, "gen_ai.conversation.id": session.id}
    span = telemetry.start("compact_context", attributes, parent=parent)
    error: str | None = None
    result: Compaction | None = None
    try:
        result = await compacting
        return result
    except BaseException as exc:
        error = type(exc).__qualname__
        raise
    finally:
        telemetry.end(span, compaction_outcome(result) if result else None, error)


def compaction_outcome(result: Compaction) -> dict[str, str | int]:
    return {
        "a3s.compaction.summarized_by": result.summarized_by or "nothing",
        "a3s.context.tokens_before": result.before.total_tokens,
        "a3s.context.tokens_after": result.after.total_tokens,
        "a3s.context.messages_before": result.before.message_count,
        "a3s.context.messages_after": result.after.message_count,
    }


def _tool_attributes(session: Session, call: ToolCall) -> dict[str, str]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": session.id,
    }


def note_outcome(result: ToolOutput) -> None:
    """How the current tool call ended, on its span: success or error, the sandbox its processes ran in."""
    if not telemetry.enabled():
        return
    attributes = {"a3s.tool.outcome": "success" if result.success else "error"}
    sandbox = result.metadata.get("sandbox")
    if sandbox:
        attributes["a3s.tool.sandbox"] = str(sandbox)
    telemetry.note(attributes)
