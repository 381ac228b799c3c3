"""Every JSON text that comes from outside the server is parsed here, bounded in depth and size.

Outside means clients (request fields, call metadata and headers, HTTP bodies, Initialize's
`config.custom`), models and their servers (replies, error reports, tool-call arguments), web
services, and files a repository holds. Two parsers, one set of bounds:

- `parse_json` for what a client sends: anything wrong is an InvalidArgument naming the field
  (`what`), a lone surrogate included (below);
- `model_json` for a party whose words are kept, not refused (a model's reply, a web service's):
  anything wrong is a ValueError, and lone surrogates become U+FFFD.

Both refuse JSON nested deeper than MAX_DEPTH (protobuf's own bound on messages) and text longer
than their `max_chars`. Python's parser fails with a RecursionError near 1,000 levels, and JSON a
little less deep parses but breaks the first recursive walk over it (a schema validator,
json.dumps, pydantic) wherever that happens to run.

What the server wrote itself (its store's rows, the sealed messages between replicas, its own
files) is read with plain `json.loads`.

JSON escapes can spell lone surrogates (`"\\ud800"`), which no UTF-8 text can hold: such a value
would fail later, wherever it is written (a file, the store, a reply), so a client's is refused."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .errors import InvalidArgument

MAX_DEPTH = 100
"""How deeply arrays and objects may nest in JSON from outside (protobuf's bound on messages)."""
MAX_CHARS = 128 * 1024 * 1024
"""The longest JSON text parsed unless its source sets less: the bound on one event from a model's
server (llm/sse.py), twice a gRPC request's."""
_TOO_DEEP = f"nested too deeply (more than {MAX_DEPTH} levels)"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a pair is one character once parsed
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: in decoded text, only through one can parsed JSON hold one."""
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""What `json.loads` parses with (the C scanner): a value at an index, and where it ends."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key[:100]!r} appears twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


_STRICT = json.JSONDecoder(object_pairs_hook=_unique, parse_constant=_no_constant)
"""Refuses what `json.loads` lets through: a key twice in one object, NaN and Infinity."""


def parse_json(text: str, what: str, *, max_chars: int = MAX_CHARS, strict: bool = False) -> Any:
    """A client's JSON, or InvalidArgument naming `what`: not JSON, longer than `max_chars`, nested
    deeper than MAX_DEPTH, a lone surrogate; with `strict`, also a key twice in one object, NaN or
    Infinity (documents whose protocol says so)."""
    if len(text) > max_chars:
        raise InvalidArgument(f"{what}: longer than {max_chars:,} characters")
    try:
        value = _STRICT.decode(text) if strict else json.loads(text)
    except RecursionError:
        raise InvalidArgument(f"{what}: not valid JSON: {_TOO_DEEP}") from None
    except ValueError as exc:
        raise InvalidArgument(f"{what}: not valid JSON: {exc}") from exc
    if _may_nest_deeper(text) and _nested_deeper(value):
        raise InvalidArgument(f"{what}: not valid JSON: {_TOO_DEEP}")
    where = _surrogate_path(value)
    if where is not None:
        raise InvalidArgument(
            f"{what}: the string at {where} holds a lone surrogate (an escape such as \\ud800"
            " without its pair), which is not valid Unicode text"
        )
    return value


def _may_nest_deeper(text: str) -> bool:
    """Whether `text` has brackets enough to nest deeper than MAX_DEPTH (cheap: counted in C)."""
    return text.count("[") + text.count("{") > MAX_DEPTH


def _nested_deeper(value: Any) -> bool:
    """Whether a parsed value nests arrays and objects deeper than MAX_DEPTH (an iterative walk)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            if depth > MAX_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in children)
    return False


def _surrogate_path(value: Any) -> str | None:
    """Where in a parsed JSON value a string (or an object key) holds a lone surrogate, or None."""
    stack = [(value, "(root)")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                if _has_surrogate(key):
                    return _member(where, key.encode("utf-8", "backslashreplace").decode())
                stack.append((child, _member(where, key)))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


def valid_text(value: Any) -> Any:
    """Parsed JSON from a party whose words are kept, not refused (a model's reply), with every
    lone surrogate replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value) if _has_surrogate(value) else value
    if isinstance(value, dict):
        return {valid_text(key): valid_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [valid_text(item) for item in value]
    return value


def model_json(text: str, *, max_chars: int = MAX_CHARS) -> Any:
    """`text` (decoded from UTF-8, so it holds no surrogate itself) parsed as valid_text: the walk
    over every parsed value is skipped when no escape in the text can spell a surrogate.
    ValueError when it is no JSON, is longer than `max_chars` or nests deeper than MAX_DEPTH.

    Parsed by the json module's own C scanner, called directly: `json.loads` adds a third of its
    cost around it (a model's reply streams hundreds of small chunks), only to skip whitespace
    before and after the value and to say what is wrong with text that is no JSON value, which
    it still does whenever the scanner does not read the whole text."""
    if len(text) > max_chars:
        raise ValueError(f"longer than {max_chars:,} characters")
    try:
        try:
            parsed, end = _scan(text, 0)
        except StopIteration:  # no JSON value at the start (whitespace, or none at all)
            end = -1
        if end != len(text):
            parsed = json.loads(text)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    if _may_nest_deeper(text) and _nested_deeper(parsed):
        raise ValueError(_TOO_DEEP)
    return valid_text(parsed) if _SURROGATE_ESCAPE.search(text) else parsed


def _member(where: str, key: str) -> str:
    return key if where == "(root)" else f"{where}.{key}"


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
