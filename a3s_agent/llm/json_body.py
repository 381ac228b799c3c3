"""A request body as JSON bytes, without stalling the server on a big one.

One json.dumps call holds the interpreter lock throughout, and on a conversation holding a 50 MB
message, or a few megabytes of images, that would stall every other request of the server for a
noticeable time. So a body whose strings add up to BIG_BODY_CHARS or more (measured, not encoded:
every string at any depth, which is what is sent whatever the provider's shape: text, tool
arguments and schemas, images' data URLs or base64 blocks, tool results' nested content) is encoded
in a worker thread, long strings a slice at a time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

BIG_BODY_CHARS = 256 * 1024
COMPACT = (",", ":")
_SLICE_CHARS = 256 * 1024


async def encoded(body: dict[str, Any]) -> bytes:
    """`body` as compact JSON bytes (no spaces after separators: every byte of a request is paid
    for on every turn); a big one encoded in a worker thread."""
    if not is_big(body):
        return json.dumps(body, separators=COMPACT).encode()
    return await asyncio.to_thread(lambda: "".join(_json_pieces(body)).encode())


def is_big(value: Any) -> bool:
    """Whether the strings in `value` add up to BIG_BODY_CHARS or more; it stops counting there.
    (About half a json.dumps of a conversation without big strings: it is on every model call.)"""
    total = 0
    pending = [value]
    pop, extend = pending.pop, pending.extend
    while pending:
        item = pop()
        kind = type(item)
        if kind is str:
            total += len(item)
            if total >= BIG_BODY_CHARS:
                return True
        elif kind is dict:
            extend(item.values())
        elif kind is list:
            extend(item)
    return False


def _json_pieces(value: Any) -> Iterator[str]:
    """json.dumps(value, separators=COMPACT), in pieces."""
    if isinstance(value, str) and len(value) > _SLICE_CHARS:
        yield '"'
        for start in range(0, len(value), _SLICE_CHARS):
            yield json.dumps(value[start : start + _SLICE_CHARS])[1:-1]
        yield '"'
    elif isinstance(value, dict):
        yield "{"
        for index, (key, item) in enumerate(value.items()):
            yield f"{',' if index else ''}{json.dumps(key)}:"
            yield from _json_pieces(item)
        yield "}"
    elif isinstance(value, list | tuple):
        yield "["
        for index, item in enumerate(value):
            if index:
                yield ","
            yield from _json_pieces(item)
        yield "]"
    else:
        yield json.dumps(value)
