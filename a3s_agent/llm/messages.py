"""Core messages in the Chat Completions JSON shape."""

from __future__ import annotations

import base64
from typing import Any

from ..base.models import Attachment, Message, ToolCall
from ..tools.registry import Tool


def _attachment_text(item: Attachment) -> str:
    body = item.content.decode("utf-8", errors="replace") if item.content else item.url
    label = {"file": "File", "code": "Code", "data": "Data"}.get(item.kind, "Attachment")
    return f"{label}: {item.name or '(unnamed)'}\n```\n{body}\n```"


def _image_part(item: Attachment) -> dict[str, Any]:
    if item.content:
        mime = item.mime_type or "image/png"
        url = f"data:{mime};base64,{base64.b64encode(item.content).decode('ascii')}"
    else:
        url = item.url
    return {"type": "image_url", "image_url": {"url": url}}


def _user_content(message: Message) -> str | list[dict[str, Any]]:
    """Plain text, or content parts when there are attachments (images as image parts)."""
    if not message.attachments:
        return message.content
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    for item in message.attachments:
        if item.kind == "image":
            parts.append(_image_part(item))
        else:
            parts.append({"type": "text", "text": _attachment_text(item)})
    return parts


PROVIDER_STATE = "provider_state"
"""The key under which `to_openai` passes a message's and its calls' ProviderState along. It is not
a Chat Completions field: each provider takes its own part out (`with_provider_state`) and drops
the rest before anything goes on the wire."""


def to_openai(message: Message) -> dict[str, Any]:
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            out["tool_calls"] = [_call(c) for c in message.tool_calls]
        if message.provider_state or any(c.provider_state for c in message.tool_calls):
            out[PROVIDER_STATE] = message.provider_state  # marks the message for with_provider_state
        return out
    if message.role == "tool":
        tool_call_id = message.tool_call_id or message.metadata.get("tool_call_id", "")
        if tool_call_id:
            return {"role": "tool", "tool_call_id": tool_call_id, "content": message.content}
        # A tool message a client sent without an id cannot answer a call: pass it on as text.
        return {"role": "user", "content": f"[tool output]\n{message.content}"}
    if message.role == "system":
        return {"role": "system", "content": message.content}
    return {"role": "user", "content": _user_content(message)}


def tool_schema(tool: Tool) -> dict[str, Any]:
    """A tool as Chat Completions `tools` lists it."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters_schema,
        },
    }


def _call(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    if call.provider_state:
        out[PROVIDER_STATE] = call.provider_state
    return out


def with_provider_state(messages: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """`messages` as they go to the provider whose state key is `key`: the fields it asked back
    (see ProviderState) put in place on each message and call, every provider's state removed."""
    if not any(PROVIDER_STATE in message for message in messages):
        return messages
    return [_own_state(message, key) if PROVIDER_STATE in message else message for message in messages]


def _own_state(item: dict[str, Any], key: str) -> dict[str, Any]:
    out = {name: value for name, value in item.items() if name != PROVIDER_STATE}
    out.update(item[PROVIDER_STATE].get(key) or {})
    calls = out.get("tool_calls")
    if calls:
        out["tool_calls"] = [_own_state(call, key) if PROVIDER_STATE in call else call for call in calls]
    return out
