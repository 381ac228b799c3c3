"""Which A3S dialect one request is in, from its bytes alone (a3s-string-dialect.md 2.2-2.4).

The Box-era dialect and the later (string) one share method paths; where their requests differ a
tag scan tells them apart before anything is decoded: `Message.role` is a VARINT in Box and a
string in the later dialect, only Box has `Message` #4 and the generate options, and `Message` #3
holds Box `Attachment`s or later map entries. Nothing here decodes a message; bytes that cannot
be scanned raise `Malformed` (the caller answers INVALID_ARGUMENT), a request whose messages
disagree raises `Mixed`. The scan reads at most MAX_TAGS tags, so no request makes it slow.
"""

from __future__ import annotations

from typing import Literal

Dialect = Literal["box", "later"]
BOX: Dialect = "box"
LATER: Dialect = "later"

_NAMES = {BOX: "Box", LATER: "later"}

MAX_TAGS = 1 << 18
"""Tags one scan may read: a real request has about one per message (at most A3S_MAX_REQUEST_MESSAGES)."""

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_ROLE_BOX = 0x08  # Message #1 VARINT: the Box enum
_ROLE_LATER = 0x0A  # Message #1 LEN: the later string; also a later map entry's key
_MAP_ENTRY_VALUE = 0x12
_BOX_METADATA = 0x22  # Message #4: only Box has it
_LATER_METADATA = 0x1A  # Message #3: Box attachments or later metadata entries
_INIT_ENV = 0x1A  # InitializeRequest #3: Box's env (the later dialect has no #3)
_INIT_SECOND = 0x12  # InitializeRequest #2: Box's AgentConfig or a later env entry


class Malformed(ValueError):
    """The bytes are not a protobuf message."""


class Mixed(ValueError):
    """The request's messages are in both dialects: no generated client sends that."""


class _Reader:
    """Tags and lengths of a buffer, bounds checked, counting every tag against MAX_TAGS."""

    __slots__ = ("data", "tags")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.tags = 0

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        """The varint at `pos` and the position after it."""
        data = self.data
        if pos >= end:
            raise Malformed("truncated varint")
        byte = data[pos]
        if byte < 0x80:
            return byte, pos + 1
        value, shift = byte & 0x7F, 7
        while True:
            pos += 1
            if pos >= end:
                raise Malformed("truncated varint")
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos + 1
            shift += 7
            if shift > 63:
                raise Malformed("varint longer than 10 bytes")

    def tag(self, pos: int, end: int) -> tuple[int, int]:
        self.tags += 1
        if self.tags > MAX_TAGS:
            raise Malformed(f"more than {MAX_TAGS} fields")
        tag, pos = self.varint(pos, end)
        if tag >> 3 == 0:
            raise Malformed("field number 0")
        return tag, pos

    def skip(self, tag: int, pos: int, end: int) -> tuple[int, int]:
        """(start, stop) of the value of `tag` at `pos`: a LEN's payload, else the value's bytes."""
        kind = tag & 7
        if kind == _LEN:
            length, pos = self.varint(pos, end)
            stop = pos + length
        elif kind == _VARINT:
            _, stop = self.varint(pos, end)
        elif kind == _I64:
            stop = pos + 8
        elif kind == _I32:
            stop = pos + 4
        else:  # groups (3, 4) and 6, 7: neither dialect has them
            raise Malformed(f"wire type {kind}")
        if stop > end:
            raise Malformed("a field runs past the end of its message")
        return pos, stop


def _message(reader: _Reader, pos: int, end: int) -> Dialect | None:
    """A `Message`'s dialect (2.2), None when it has no role, attachment or metadata."""
    data = reader.data
    while pos < end:
        tag, pos = reader.tag(pos, end)
        start, pos = reader.skip(tag, pos, end)
        if tag in (_ROLE_BOX, _BOX_METADATA):
            return BOX
        if tag == _ROLE_LATER:
            return LATER
        if tag == _LATER_METADATA:  # a later map entry starts with its key (#1 LEN); an Attachment never
            return LATER if start < pos and data[start] == _ROLE_LATER else BOX
    return None


def messages_dialect(data: bytes, messages_field: int, options_field: int, name: str) -> Dialect | None:
    """The dialect of a request with `repeated Message` at `messages_field` (named `name` in
    errors) and, when not 0, Box's options at `options_field` (2.3); None when undecidable."""
    reader = _Reader(data)
    messages_tag = messages_field << 3 | _LEN
    options_tag = options_field << 3 | _LEN if options_field else -1
    found: Dialect | None = None
    found_at = -1  # the message that decided (-1: the options)
    index = -1
    pos, end = 0, len(data)
    while pos < end:  # the hot path (every Generate): one-byte LEN tags and a message's first byte inline
        tag = data[pos]
        if tag < 0x80 and tag > 7 and tag & 7 == _LEN:
            reader.tags += 1
            if reader.tags > MAX_TAGS:
                raise Malformed(f"more than {MAX_TAGS} fields")
            if pos + 3 < end and data[pos + 1] < 0x80:  # lengths below 128
                start = pos + 2
                pos = start + data[pos + 1]
            elif pos + 3 < end and data[pos + 2] < 0x80:  # below 16384
                start = pos + 3
                pos = start + (data[pos + 1] & 0x7F | data[pos + 2] << 7)
            else:
                length, start = reader.varint(pos + 1, end)
                pos = start + length
            if pos > end:
                raise Malformed("a field runs past the end of its message")
        else:
            tag, pos = reader.tag(pos, end)
            start, pos = reader.skip(tag, pos, end)
        dialect: Dialect | None
        if tag == messages_tag:
            index += 1
            first = data[start] if start < pos else -1
            if first == _ROLE_BOX:
                dialect = BOX
            elif first == _ROLE_LATER:
                dialect = LATER
            else:
                dialect = _message(reader, start, pos)
        elif tag == options_tag:
            dialect = BOX
        else:
            continue
        if dialect is None or dialect == found:
            continue
        if found is None:
            found, found_at = dialect, index if tag == messages_tag else -1
            continue
        here = f"{name}[{index}]" if tag == messages_tag else "options"
        there = f"{name}[{found_at}]" if found_at >= 0 else "options"
        raise Mixed(
            f"{here} is in the {_NAMES[dialect]} dialect but {there} in the {_NAMES[found]} dialect:"
            " one request cannot mix them"
        )
    return found


def generate_dialect(data: bytes) -> Dialect | None:
    """GenerateRequest: messages #2, options #3."""
    return messages_dialect(data, 2, 3, "messages")


def structured_dialect(data: bytes) -> Dialect | None:
    """GenerateStructuredRequest: messages #2, options #4."""
    return messages_dialect(data, 2, 4, "messages")


def create_session_dialect(data: bytes) -> Dialect | None:
    """CreateSessionRequest: initial_context #3."""
    return messages_dialect(data, 3, 0, "initial_context")


def initialize_dialect(data: bytes) -> Dialect | None:
    """InitializeRequest (2.4): #3 is Box's env; #2 more than once is later env entries; one #2 is
    a later entry when it is exactly key then value with a printable key, else Box's AgentConfig."""
    reader = _Reader(data)
    seconds = 0
    payload = (0, 0)
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = reader.tag(pos, end)
        start, pos = reader.skip(tag, pos, end)
        if tag == _INIT_ENV:
            return BOX
        if tag == _INIT_SECOND:
            seconds += 1
            payload = (start, pos)
    if seconds == 0:
        return None
    if seconds > 1:
        return LATER
    return LATER if _env_entry(reader, *payload) else BOX


def _env_entry(reader: _Reader, pos: int, end: int) -> bool:
    """Whether data[pos:end] is one map entry, #1 LEN then #2 LEN and nothing else, whose key is
    UTF-8 without C0 control characters (what an environment name is; an encoded LLMConfig is not)."""
    data = reader.data
    if pos >= end or data[pos] != _ROLE_LATER:
        return False
    key_start, key_stop = reader.skip(_ROLE_LATER, pos + 1, end)
    if key_stop >= end or data[key_stop] != _MAP_ENTRY_VALUE:
        return False
    _, value_stop = reader.skip(_MAP_ENTRY_VALUE, key_stop + 1, end)
    if value_stop != end:
        return False
    key = data[key_start:key_stop]
    try:
        key.decode()
    except UnicodeDecodeError:
        return False
    return not key or min(key) >= 0x20
