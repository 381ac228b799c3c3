"""JSON in and out of the HTTP face: request bodies (REST, RPC, Agent Spaces) and WebSocket
messages read one way, and every reply written one way (json_text).

By the time a handler reads a body the guard (guard.py) has checked its content type (415) and
aiohttp its size (`client_max_size`, MAX_BODY_BYTES: 413); what is left is turning the bytes into
JSON, or a CallError INVALID_ARGUMENT (400) naming what and the fault.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ...base.errors import InvalidArgument
from ...base.jsontext import parse_json
from .errors import CallError

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body, and the largest WebSocket message."""


def load_json(raw: bytes | str, what: str) -> Any:
    """JSON from a client (UTF-8 text), or CallError INVALID_ARGUMENT naming `what` and the fault:
    not UTF-8, not JSON, nested too deeply, a lone surrogate."""
    try:
        return parse_json(raw.decode("utf-8") if isinstance(raw, bytes) else raw, what)
    except UnicodeDecodeError as exc:
        raise CallError(
            "INVALID_ARGUMENT", f"{what}: not valid UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    except InvalidArgument as exc:
        raise CallError("INVALID_ARGUMENT", str(exc)) from None


def json_text(value: object) -> str:
    """Compact JSON text, as every reply is sent."""
    return json.dumps(value, separators=(",", ":"))


async def json_body(request: web.Request) -> Any:
    """The request's body as JSON; an empty (or blank) body is `{}`."""
    raw = await request.read()
    return load_json(raw, "the request body") if raw.strip() else {}


def closed_object(body: object, types: Mapping[str, type]) -> dict[str, Any]:
    """The body as a closed object of these fields and types; InvalidArgument naming the fault."""
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    unknown = sorted(set(body) - set(types))
    if unknown:
        raise InvalidArgument(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(types)})")
    for name, value in body.items():
        kind = types[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise InvalidArgument(f"{name} must be {_TYPE_NAMES[kind]}, not {json_text(value)[:50]}")
    return body


_TYPE_NAMES = {int: "a whole number", bool: "true or false", str: "a string"}
