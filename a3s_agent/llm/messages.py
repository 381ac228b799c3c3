"""Core messages in the Chat Completions JSON shape."""

from __future__ import annotations

import base64
from typing import Any

from ..base.models import Attachment, Message
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


def to_openai(message: Message) -> dict[str, Any]:
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in message.tool_calls
            ]
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
