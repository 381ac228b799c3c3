"""Server-sent events framing (the WHATWG `text/event-stream` format), from raw bytes as they arrive.

Lines may end in CRLF, LF or a bare CR, all legal, and a CRLF may be split across two reads.
Comments (`: keep-alive`) and unknown fields are ignored; an event is dispatched at a blank line.
The one field beyond the standard kept here is `error:`, which llama.cpp servers of 2025 used
for mid-stream failures (`error: {...}` then `data: [DONE]`): dropping it, as a strict parser
must, would lose the server's only account of what went wrong.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass


@dataclass(slots=True)
class ServerEvent:
    """One dispatched event: its data lines joined by newlines, its `event:` name, its `error:` field."""

    data: str
    event: str = ""
    error: str = ""


async def server_events(reads: AsyncIterable[bytes]) -> AsyncGenerator[ServerEvent, None]:
    """The events of a stream whose bytes come in `reads` of any size."""
    parser = _Parser()
    held_cr = False  # a read that ended in CR: the next one may begin with its LF
    tail = b""  # the start of a line whose end has not arrived
    async for read in reads:
        if held_cr:
            read = b"\r" + read
        held_cr = read.endswith(b"\r")
        if held_cr:
            read = read[:-1]
        if b"\r" in read:
            read = read.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        complete, newline, rest = read.rpartition(b"\n")
        if not newline:
            tail += rest
            continue
        # Decoded a batch at a time: a line break never falls inside a multi-byte character.
        data = parser.data
        for line in (tail + complete).decode("utf-8", errors="replace").split("\n"):
            if line[:5] == "data:":  # nearly every line: kept without the parser's call
                data.append(line[6:] if line[5:6] == " " else line[5:])
                continue
            event = parser.line(line)
            if event is not None:
                data = parser.data  # a new list for the next event
                yield event
        tail = rest
    last = parser.end(tail.decode("utf-8", errors="replace"))
    if last is not None:
        yield last


class _Parser:
    """The field-by-field state of the event being read."""

    __slots__ = ("data", "error", "event")

    def __init__(self) -> None:
        self.data: list[str] = []
        self.event = ""
        self.error = ""

    def line(self, line: str) -> ServerEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value
        elif name == "error":
            self.error = value
        return None

    def end(self, tail: str) -> ServerEvent | None:
        """The stream ended: an event not closed by a blank line still counts (servers omit it)."""
        if tail:
            self.line(tail)
        return self._dispatch()

    def _dispatch(self) -> ServerEvent | None:
        if not self.data and not self.error:
            self.event = ""
            return None
        event = ServerEvent("\n".join(self.data), self.event, self.error)
        self.data, self.event, self.error = [], "", ""
        return event
