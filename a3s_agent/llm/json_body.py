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
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

BIG_BODY_CHARS = 256 * 1024
COMPACT = (",", ":")
_SLICE_CHARS = 256 * 1024
_FIXED_KEPT = 16


@dataclass(frozen=True)
class JSONText:
    """A value already encoded (`fixed_json`): spliced into a body as it is."""

    text: str
    chars: int
    """The characters of its strings (what `is_big` counts), up to BIG_BODY_CHARS."""


_FIXED: OrderedDict[tuple[int, ...], tuple[tuple[Any, ...], JSONText]] = OrderedDict()


def fixed_json(values: list[Any]) -> JSONText:
    """`values` as compact JSON, kept while its items are the same objects: for lists of values that
    never change once built (the tool schemas, built once per tool), sent again on every turn."""
    key = tuple(map(id, values))
    kept = _FIXED.get(key)
    if kept is not None and all(a is b for a, b in zip(kept[0], values, strict=True)):
        _FIXED.move_to_end(key)
        return kept[1]
    encoded = JSONText(json.dumps(values, separators=COMPACT), _chars(values))
    _FIXED[key] = (tuple(values), encoded)  # the items are held, so their ids stay theirs
    if len(_FIXED) > _FIXED_KEPT:
        _FIXED.popitem(last=False)
    return encoded


async def encoded(body: dict[str, Any]) -> bytes:
    """`body` as compact JSON bytes (no spaces after separators: every byte of a request is paid
    for on every turn); a big one encoded in a worker thread. Its top-level values may be JSONText."""
    if not is_big(body):
        if not any(type(value) is JSONText for value in body.values()):
            return json.dumps(body, separators=COMPACT).encode()
        return _spliced(body).encode()
    return await asyncio.to_thread(lambda: "".join(_json_pieces(body)).encode())


def is_big(value: Any) -> bool:
    """Whether the strings in `value` add up to BIG_BODY_CHARS or more."""
    return _chars(value) >= BIG_BODY_CHARS


def _chars(value: Any) -> int:
    """The characters of the strings in `value`, counted up to BIG_BODY_CHARS (it stops there).
    (About half a json.dumps of a conversation without big strings: it is on every model call.)"""
    total = 0
    pending = [value]
    pop, extend = pending.pop, pending.extend
    while pending:
        item = pop()
        kind = type(item)
        if kind is str:
            total += len(item)
        elif kind is dict:
            extend(item.values())
        elif kind is list:
            extend(item)
        elif kind is JSONText:
            total += item.chars
        else:
            continue
        if total >= BIG_BODY_CHARS:
            return total
    return total


def _spliced(body: dict[str, Any]) -> str:
    """json.dumps(body, separators=COMPACT), its JSONText values spliced in as they are."""
    members = (
        f"{json.dumps(key)}:{value.text if type(value) is JSONText else json.dumps(value, separators=COMPACT)}"
        for key, value in body.items()
    )
    return "{" + ",".join(members) + "}"


def _json_pieces(value: Any) -> Iterator[str]:
    """json.dumps(value, separators=COMPACT), in pieces."""
    if type(value) is JSONText:
        yield value.text
    elif isinstance(value, str) and len(value) > _SLICE_CHARS:
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
