"""Streamed chunks alike but for one string: once one is parsed, the rest are read without a parse.

A server streams a reply as hundreds of small JSON chunks that are byte for byte the same but for
one string, a piece of the text or of a tool call's arguments. Once a parsed chunk shows where that
string sits in its text (`ChunkTemplate.of`), a later chunk with the same text before that place
and after it, and one JSON string token between, parses the same but for that string: only the
string is decoded (`ChunkTemplate.string`), by the json module's own string scanner. A JSON
tokenizer's state after the text before the place does not depend on what follows, so nothing
else can change. Any other chunk is parsed whole.

The parse of a chunk of 200 bytes costs about 2 µs, and reading the chunk's fields after it about
as much again; reading the string alone, well under one. OpenAI's own chunks carry a random
`obfuscation` string as well, so they differ in two places and are all parsed whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..base.jsontext import model_json, valid_text

_scan_string: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
"""json's string scanner (in C): a string token's value from after its opening quote, and where
the token ends."""


class ChunkTemplate:
    """A chunk's text before the place of its changing string, and after it."""

    __slots__ = ("_prefix", "_shortest", "_suffix")

    def __init__(self, prefix: str, suffix: str) -> None:
        self._prefix = prefix
        self._suffix = suffix
        self._shortest = len(prefix) + len(suffix) + 2  # an empty string token between

    @classmethod
    def of(cls, text: str, value: str, read: Callable[[Any], object]) -> ChunkTemplate | None:
        """The template of `text`, a chunk whose parse holds the non-empty string `value` where
        `read` finds it; None when that place is not certain (the string written otherwise than
        json writes it, or its token found twice in the text)."""
        for token in {json.dumps(value), json.dumps(value, ensure_ascii=False)}:
            at = text.find(token)
            if at < 0 or text.find(token, at + 1) >= 0:
                continue
            template = cls(text[:at], text[at + len(token) :])
            try:
                blanked = model_json(f'{template._prefix}""{template._suffix}')
            except ValueError:
                return None
            # Only that one token changed: it was the value's exactly when `read` now finds "".
            return template if read(blanked) == "" else None
        return None

    def string(self, text: str) -> str | None:
        """The string in `text` at the template's place, when the rest of `text` is the
        template's; else None. Lone surrogates become U+FFFD, as in a parsed chunk."""
        if len(text) < self._shortest or not text.startswith(self._prefix) or not text.endswith(self._suffix):
            return None
        start = len(self._prefix)
        if text[start] != '"':
            return None
        try:
            value, end = _scan_string(text, start + 1, True)
        except ValueError:
            return None
        return valid_text(value) if end == len(text) - len(self._suffix) else None
