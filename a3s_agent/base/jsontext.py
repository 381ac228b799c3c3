"""JSON sent by clients: parsed, or an InvalidArgument naming the field (even when nested too deeply).

JSON escapes can spell lone surrogates (`"\\ud800"`), which no UTF-8 text can hold: such a value
would fail later, wherever it is written (a file, the store, a reply), so it is refused here."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .errors import InvalidArgument

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a pair is one character once parsed
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: in decoded text, only through one can parsed JSON hold one."""
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""What `json.loads` parses with (the C scanner): a value at an index, and where it ends."""


def parse_json(text: str, what: str) -> Any:
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidArgument(f"{what}: not valid JSON: nested too deeply") from None
    except ValueError as exc:
        raise InvalidArgument(f"{what}: not valid JSON: {exc}") from exc
    where = _surrogate_path(value)
    if where is not None:
        raise InvalidArgument(
            f"{what}: the string at {where} holds a lone surrogate (an escape such as \\ud800"
            " without its pair), which is not valid Unicode text"
        )
    return value


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


def model_json(text: str) -> Any:
    """`text` (decoded from UTF-8, so it holds no surrogate itself) parsed as valid_text: the walk
    over every parsed value is skipped when no escape in the text can spell a surrogate.

    Parsed by the json module's own C scanner, called directly: `json.loads` adds a third of its
    cost around it (a model's reply streams hundreds of small chunks), only to skip whitespace
    before and after the value and to say what is wrong with text that is no JSON value, which
    it still does whenever the scanner does not read the whole text."""
    try:
        parsed, end = _scan(text, 0)
    except StopIteration:  # no JSON value at the start (whitespace, or none at all)
        end = -1
    if end != len(text):
        parsed = json.loads(text)
    return valid_text(parsed) if _SURROGATE_ESCAPE.search(text) else parsed


def _member(where: str, key: str) -> str:
    return key if where == "(root)" else f"{where}.{key}"


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
