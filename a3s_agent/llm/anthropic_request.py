"""The Messages API request for one model turn, from the conversation in the Chat Completions shape.

- The leading system messages become the top-level `system`; a system message after the
  conversation began (GenerateStructured's instruction, in a session with history) becomes a text
  block of a user turn, in place.
- Tool calls become `tool_use` blocks; tool messages `tool_result` blocks in the next user turn
  (`is_error: true` for a call that failed); consecutive messages of one role are one turn (the
  API alternates user and assistant).
- Images (`image_url` parts, data URLs or links) become `image` blocks: in a user turn, or inside
  the `tool_result` block of the tool that returned them.
- An assistant message's signed thinking, kept as provider state under this provider's key, goes
  back as it came: its thinking and redacted_thinking blocks, unmodified and in their place.
- Prompt caching: `cache_control` marks the system prompt, the last tool and the last block of each
  of the two latest user turns (four breakpoints, the API's limit), so each request re-reads from
  cache what the one before wrote: the prefix up to the previous user turn.
"""

from __future__ import annotations

from typing import Any

from ..base.jsontext import model_json
from .messages import FAILED, PROVIDER_STATE
from .provider import CompletionRequest

DEFAULT_MAX_TOKENS = 8192  # the Messages API requires max_tokens: Claude 3.5 and later take 8192
MIN_THINKING_BUDGET = 1024  # the API's minimum budget_tokens
BLOCKS = "blocks"
"""The provider state key under which an assistant message's content layout is kept: its thinking
blocks whole, its text and tool_use blocks as placeholders (the message itself holds those)."""
_EPHEMERAL = {"type": "ephemeral"}
_CACHED_TURNS = 2


def request_body(request: CompletionRequest, state_key: str, *, thinking: bool) -> dict[str, Any]:
    """The JSON body of a streamed Messages API request."""
    leading = 0
    while leading < len(request.messages) and request.messages[leading].get("role") == "system":
        leading += 1
    system = [
        block for message in request.messages[:leading] for block in _text_blocks(message.get("content"))
    ]
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
        "messages": _turns(request.messages[leading:], state_key),
        "stream": True,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [_tool(schema) for schema in request.tools]
    if thinking:
        # The budget must be at least 1024 tokens and less than max_tokens; temperature must be left unset.
        body["max_tokens"] = max(body["max_tokens"], 2 * MIN_THINKING_BUDGET)
        body["thinking"] = {"type": "enabled", "budget_tokens": body["max_tokens"] // 2}
    elif request.temperature is not None:
        body["temperature"] = request.temperature
    if request.stop:
        body["stop_sequences"] = request.stop
    _mark_cache(body)
    return body


def _mark_cache(body: dict[str, Any]) -> None:
    marked = [body["system"][-1]] if body.get("system") else []
    if body.get("tools"):
        marked.append(body["tools"][-1])
    users = [turn for turn in body["messages"] if turn["role"] == "user"]
    marked += [turn["content"][-1] for turn in users[-_CACHED_TURNS:]]
    for block in marked:
        block["cache_control"] = _EPHEMERAL


def _tool(schema: dict[str, Any]) -> dict[str, Any]:
    function = schema.get("function") or {}
    tool: dict[str, Any] = {
        "name": function.get("name", ""),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        tool["description"] = function["description"]
    return tool


def _turns(messages: list[dict[str, Any]], state_key: str) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            blocks = _assistant_blocks(message, state_key)
        elif role == "tool":
            blocks = [_tool_result(message)]
        else:  # a user message, or a system message within the conversation
            blocks = _text_blocks(message.get("content"))
        if not blocks:
            continue
        speaker = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == speaker:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": speaker, "content": blocks})
    return turns


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """Blocks of a user or system message's content: text (never blank: the API refuses it) and images."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    blocks: list[dict[str, Any]] = []
    for part in content or ():
        if part.get("type") == "text" and (part.get("text") or "").strip():
            blocks.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "image_url":
            blocks.append(_image((part.get("image_url") or {}).get("url", "")))
    return blocks


def _image(url: str) -> dict[str, Any]:
    """An image block from a `data:` URL (base64) or a link the API fetches itself."""
    if url.startswith("data:"):
        header, _, data = url.partition(",")
        media_type = header.removeprefix("data:").split(";", 1)[0]
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    """A tool message's result: its text, and the images a tool returned (read_file of an image)
    inside the block, where the model reads them as part of the result; `is_error` when the call failed."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id", "")}
    if message.get(FAILED):
        block["is_error"] = True
    content = message.get("content")
    if isinstance(content, list):
        content = _text_blocks(content)
    if content and (not isinstance(content, str) or content.strip()):
        block["content"] = content
    return block


def _assistant_blocks(message: dict[str, Any], state_key: str) -> list[dict[str, Any]]:
    """The message's blocks: its kept layout (thinking in place) when it has one, else text then calls."""
    text = message.get("content") or ""
    texts = [{"type": "text", "text": text}] if isinstance(text, str) and text.strip() else []
    uses = {use["id"]: use for use in map(_tool_use, message.get("tool_calls") or ())}
    layout = ((message.get(PROVIDER_STATE) or {}).get(state_key) or {}).get(BLOCKS) or ()
    blocks: list[dict[str, Any]] = []
    for kept in layout:
        if kept.get("type") == "text":
            blocks += texts
            texts = []
        elif kept.get("type") == "tool_use":
            use = uses.pop(kept.get("id"), None)
            blocks += [use] if use is not None else []
        elif kept.get("type") in ("thinking", "redacted_thinking"):  # exactly as the API sent it
            blocks.append(dict(kept))
    return [*blocks, *texts, *uses.values()]


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    try:
        arguments = model_json(function.get("arguments") or "{}")
    except ValueError:
        arguments = None
    return {
        "type": "tool_use",
        "id": call.get("id", ""),
        "name": function.get("name", ""),
        # The API takes an object; arguments the model botched were answered as an error already.
        "input": arguments if isinstance(arguments, dict) else {},
    }
