"""What a trace records of content, when the operator opts in with
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true (base/telemetry.py reads it): a model
request's messages and reply, a tool call's arguments and result, in the GenAI conventions'
attributes (`gen_ai.system_instructions`, `gen_ai.input.messages`, `gen_ai.output.messages`,
`gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`). Every value is redacted of what looks
like a secret (base/secret_text.py) first: a collector is not a place for keys."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...base import telemetry
from ...base.models import ToolCall
from ...base.secret_text import redact_secrets
from ...tools.registry import ToolOutput

if TYPE_CHECKING:
    from opentelemetry.trace import Span


def _redacted_json(value: object) -> str:
    return redact_secrets(json.dumps(value, ensure_ascii=False))


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI-format message's content as the conventions' parts: text, tool calls, tool results."""
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if message.get("role") == "tool":
        return [{"type": "tool_call_response", "id": message.get("tool_call_id", ""), "response": content}]
    if isinstance(content, str) and content:
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append({"type": "text", "content": part.get("text", "")})
            elif isinstance(part, dict):
                parts.append({"type": str(part.get("type", "other"))})  # an image: its kind, not its bytes
    for call in message.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
            }
        )
    return parts


def note_request(chat: Span | None, conversation: list[dict[str, Any]]) -> None:
    """A model request's system instructions and messages, on its `chat` span."""
    if chat is None or not telemetry.content_recorded():
        return
    system = [part for m in conversation if m.get("role") == "system" for part in _parts(m)]
    messages = [
        {"role": m.get("role", ""), "parts": _parts(m)} for m in conversation if m.get("role") != "system"
    ]
    attributes = {"gen_ai.input.messages": _redacted_json(messages)}
    if system:
        attributes["gen_ai.system_instructions"] = _redacted_json(system)
    chat.set_attributes(attributes)


def note_reply(chat: Span | None, text: str, calls: list[ToolCall], finish_reason: str) -> None:
    """The model's reply, on its `chat` span."""
    if chat is None or not telemetry.content_recorded():
        return
    parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
    reply = [{"role": "assistant", "parts": parts, "finish_reason": finish_reason}]
    chat.set_attribute("gen_ai.output.messages", _redacted_json(reply))


def note_call(call: ToolCall) -> None:
    """A tool call's arguments, on its (current) `execute_tool` span."""
    if telemetry.content_recorded():
        telemetry.note({"gen_ai.tool.call.arguments": redact_secrets(call.arguments)})


def note_result(result: ToolOutput) -> None:
    """A tool call's result (its output, or its error), on its (current) `execute_tool` span."""
    if telemetry.content_recorded():
        telemetry.note(
            {"gen_ai.tool.call.result": redact_secrets(result.output if result.success else result.error)}
        )
