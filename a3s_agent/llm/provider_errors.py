"""What OpenAI-compatible servers say went wrong, read from each shape they say it in.

OpenAI and most servers: `{"error": {"message": ...}}`. vLLM and Mistral: `{"object": "error",
"message": ...}`, Mistral's message being a validation report (an object). Gemini: a list holding
one `{"error": {...}}`. FastAPI-based servers: `{"detail": ...}`. Anything else: the text itself.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..base.errors import AgentError, ContextOverflow, Unavailable
from ..base.jsontext import model_json

_SHOWN_CHARS = 500

# How providers say a prompt is longer than the model's window: OpenAI (the code and its message),
# Anthropic, vLLM, llama.cpp (its message and its error type).
_OVERFLOW = re.compile(
    r"context_length_exceeded|maximum context length|prompt is too long|longer than the model's context"
    r"|longer than the maximum model length|exceeds the available context size|context size exceeded"
    r"|exceed_context_size_error",
    re.IGNORECASE,
)


def is_context_overflow(error_text: str) -> bool:
    """Whether a provider's error body (JSON or text) says the prompt does not fit the window."""
    return bool(_OVERFLOW.search(error_text[:10_000]))


def overflow(where: str, message: str) -> ContextOverflow:
    return ContextOverflow(
        f"the prompt is longer than the model's context window (the LLM provider refused it, {where}): {message}"
    )


def error_message(text: str) -> str:
    """The provider's own message from an error body, whatever its shape."""
    try:
        body = model_json(text)
    except ValueError:
        return text.strip()[:_SHOWN_CHARS]
    return message_of(body)


def message_of(body: Any) -> str:
    """The message of a parsed error body (see the module's list of shapes)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if isinstance(body, dict):
        found = body.get("error")
        if isinstance(found, dict):
            body = found
        elif isinstance(found, str) and found:
            return found[:_SHOWN_CHARS]
        for key in ("message", "detail"):
            value = body.get(key)
            if value:
                return _text(value)
    return _text(body)


def is_error_body(body: Any) -> bool:
    """Whether a parsed JSON object (a whole reply or a streamed chunk) is an error report."""
    return isinstance(body, dict) and bool(body.get("error") or body.get("object") == "error")


def mid_reply_failure(body: Any, where: str = "mid-reply") -> AgentError:
    """The error for a failure the server reported in a reply with HTTP status 200."""
    message = message_of(body)
    raw = body if isinstance(body, str) else json.dumps(body)
    if is_context_overflow(raw):
        return overflow(where, message)
    return Unavailable(f"the LLM provider failed {where}: {message}")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value[:_SHOWN_CHARS]
    return json.dumps(value, separators=(",", ":"))[:_SHOWN_CHARS]
