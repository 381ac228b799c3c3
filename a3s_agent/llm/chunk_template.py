"""Streamed chunks alike but for one string: once one is parsed, the rest are read without a parse.

A server streams a reply as hundreds of small JSON chunks that are byte for byte the same but for
one string, a piece of the text, of the reasoning or of a tool call's arguments. Once a parsed
chunk shows where that string sits in its text (`ChunkTemplate.of`), a later chunk with the same
text before that place and after it, and one JSON string token between, parses the same but for
that string: only the string is decoded (`ChunkTemplate.string`), by the json module's own string
scanner. A JSON tokenizer's state after the text before the place does not depend on what
follows, so nothing else can change. Any other chunk is parsed whole.

A chunk of 200 bytes parsed and looked through costs about 3 µs; its string read alone, under 1 µs.
OpenAI's own chunks carry a random `obfuscation` string as well, so they differ in two places and
are all parsed whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..base.jsontext import model_json, valid_text

_MOST_MISSES = 2
"""Templates that came to nothing before a reader stops making them (e.g. OpenAI's chunks, each
with a random string of its own): each costs a parse."""
_MOST_TEMPLATE_CHARS = 4096
"""The longest chunk made a template: finding its string is a pass over it beside the parse, and a
reply's hundreds of chunks alike are small."""
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


class LoneStrings:
    """A reader's template of the last chunk whose only news was a string, and what that string
    was a piece of (a number of the reader's: the text, the reasoning, a call's arguments);
    templates are no longer made once two came to nothing."""

    __slots__ = ("_last", "_misses", "_used")

    def __init__(self) -> None:
        self._last: tuple[ChunkTemplate, int] | None = None
        self._used = False
        self._misses = 0

    def read(self, text: str) -> tuple[int, str] | None:
        """(what it is a piece of, the string) when `text` is the template with another string."""
        if self._last is None or (piece := self._last[0].string(text)) is None:
            return None
        self._used = True
        return self._last[1], piece

    def learn(self, text: str, of: int, piece: str, read: Callable[[Any], object]) -> None:
        """`text` was parsed, and its only news is the non-empty string `piece` of `of`, which
        `read` finds in a parse: it becomes the template (unless it is long)."""
        if len(text) > _MOST_TEMPLATE_CHARS:
            return
        if self._last is not None and not self._used:
            self._misses += 1
        template = ChunkTemplate.of(text, piece, read) if self._misses < _MOST_MISSES else None
        self._last, self._used = (None if template is None else (template, of)), False
        if template is None:
            self._misses += 1
