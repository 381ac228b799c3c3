"""Core messages in the Chat Completions JSON shape."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

from ..base.models import Attachment, Message, ToolCall
from ..tools.compact_schema import model_schema
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


def _content(message: Message) -> str | list[dict[str, Any]]:
    """Plain text, or content parts when there are attachments (images as image parts). A tool
    message's parts are not for the wire as they are (see `tool_images_after_results`)."""
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
a Chat Completions field: each provider takes its own part out (`on_the_wire`) and drops the rest
before anything goes on the wire."""
FAILED = "failed"
"""The key that marks (True) the tool message of a call that failed (`ToolOutput.success` false,
kept as the message's metadata `success: "false"`). Not a Chat Completions field either: dropped by
`on_the_wire`; the Messages API says it (`is_error` on the tool_result block)."""
_PRIVATE = (PROVIDER_STATE, FAILED)


def to_openai(message: Message) -> dict[str, Any]:
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            out["tool_calls"] = [_call(c) for c in message.tool_calls]
        if message.provider_state or any(c.provider_state for c in message.tool_calls):
            out[PROVIDER_STATE] = message.provider_state  # marks the message for on_the_wire
        return out
    if message.role == "tool":
        tool_call_id = message.tool_call_id or message.metadata.get("tool_call_id", "")
        if tool_call_id:
            out = {"role": "tool", "tool_call_id": tool_call_id, "content": _content(message)}
            if message.metadata.get("success") == "false":
                out[FAILED] = True
            return out
        # A tool message a client sent without an id cannot answer a call: pass it on as text.
        return {
            "role": "user",
            "content": _content(replace(message, content=f"[tool output]\n{message.content}")),
        }
    if message.role == "system":
        return {"role": "system", "content": message.content}
    return {"role": "user", "content": _content(message)}


_SCHEMAS: dict[int, tuple[Tool, dict[str, Any]]] = {}
"""`tool_schema`'s results by id of the tool (kept with it, so the id stays its own): every
generation lists its tools, and flattening them all again took a fifth of a millisecond."""
_SCHEMAS_KEPT = 1024


def tool_schema(tool: Tool) -> dict[str, Any]:
    """A tool as Chat Completions `tools` lists it, its parameters in the model-facing form
    (tools/compact_schema.py); the Messages API request is made from this too."""
    kept = _SCHEMAS.get(id(tool))
    if kept is not None and kept[0] is tool:
        return kept[1]
    schema = {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": model_schema(tool.parameters_schema),
        },
    }
    if len(_SCHEMAS) >= _SCHEMAS_KEPT:
        _SCHEMAS.clear()
    _SCHEMAS[id(tool)] = (tool, schema)
    return schema


def _call(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    if call.provider_state:
        out[PROVIDER_STATE] = call.provider_state
    return out


def on_the_wire(messages: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """`messages` as they go to the provider whose state key is `key`: the fields it asked back
    (see ProviderState) put in place on each message and call, every provider's state and the
    failed mark removed."""
    if not any(name in message for message in messages for name in _PRIVATE):
        return messages
    return [_own_state(message, key) for message in messages]


def _own_state(item: dict[str, Any], key: str) -> dict[str, Any]:
    if not any(name in item for name in _PRIVATE):
        return item
    out = {name: value for name, value in item.items() if name not in _PRIVATE}
    out.update((item.get(PROVIDER_STATE) or {}).get(key) or {})
    calls = out.get("tool_calls")
    if calls:
        out["tool_calls"] = [_own_state(call, key) for call in calls]
    return out


def tool_images_after_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as Chat Completions takes them when tool results carry images.

    OpenAI takes images in user messages only ("Image URLs are only allowed for messages with role
    'user'"), and most OpenAI-compatible servers follow it. So each tool message keeps its text,
    and the images of a run of tool results follow the run in one user message naming the calls.
    Mistral (and vLLM serving its models) refuses a user message right after a tool message, so
    an assistant message comes between: valid on every server."""
    if not any(_has_parts(message) for message in messages):
        return messages
    out: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []  # the run's images, each after a line naming its call
    names: dict[str, str] = {}  # call id -> tool name
    for message in messages:
        if message.get("role") != "tool" and held:
            out += _images_message(held)
            held = []
        if not _has_parts(message):
            names.update((call["id"], call["function"]["name"]) for call in message.get("tool_calls") or ())
            out.append(message)
            continue
        parts = message["content"]
        out.append({**message, "content": "\n\n".join(p["text"] for p in parts if p["type"] == "text")})
        images = [part for part in parts if part["type"] == "image_url"]
        if images:
            call = message.get("tool_call_id", "")
            held += [
                {"type": "text", "text": f"The result of {names.get(call, 'a tool')} (call {call}):"},
                *images,
            ]
    return out + (_images_message(held) if held else [])


def _has_parts(message: dict[str, Any]) -> bool:
    """A tool message whose content is parts (it has attachments), not yet fit for the wire."""
    return message.get("role") == "tool" and isinstance(message.get("content"), list)


def _images_message(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    bridge = {"role": "assistant", "content": "Show me the images those tool results came with."}
    return [bridge, {"role": "user", "content": parts}]
