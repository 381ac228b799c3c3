"""Server-sent events framing (the WHATWG `text/event-stream` format), from raw bytes as they arrive.

Lines may end in CRLF, LF or a bare CR, all legal, and a CRLF may be split across two reads.
Comments (`: keep-alive`) and unknown fields are ignored; an event is dispatched at a blank line,
and the last one also when the stream ends without it. The one field beyond the standard kept
here is `error:`, which llama.cpp servers of 2025 used for mid-stream failures (`error: {...}`
then `data: [DONE]`): dropping it, as a strict parser must, would lose the server's only account
of what went wrong.

The events come a network read at a time (`event_batches`): every event one read completes, in one
list, so a reply of hundreds of small events costs a step of the readers' loops per read, not per
event, and what one read brings can be passed on together.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass

from ..base.errors import Unavailable

MAX_EVENT_BYTES = 128 << 20
"""The most one event may take before its blank line: room for a tool call carrying write_file's
largest content (50 MB) base64-encoded in one chunk, and a bound on what a server that never ends
its event can make us hold."""


@dataclass(slots=True)
class ServerEvent:
    """One dispatched event: its data lines joined by newlines, its `event:` name, its `error:` field."""

    data: str
    event: str = ""
    error: str = ""


async def event_batches(reads: AsyncIterable[bytes]) -> AsyncGenerator[list[ServerEvent], None]:
    """The events of a stream whose bytes come in `reads` of any size: those each read completes,
    together (a read that completes none gives no list); then the last one, if the stream ended
    without its blank line."""
    decoder = _Decoder()
    async for read in reads:
        events = decoder.feed(read)
        if events:
            yield events
    last = decoder.end()
    if last is not None:
        yield [last]


class _Decoder:
    """The bytes of the event being read, kept until its blank line (the events' boundary) comes."""

    __slots__ = ("_held_cr", "_pending")

    def __init__(self) -> None:
        self._pending = bytearray()  # the stream since the last blank line, line ends made LF
        self._held_cr = False  # a read that ended in CR: the next one may begin with its LF

    def feed(self, read: bytes) -> list[ServerEvent]:
        """The events `read` completes."""
        if self._held_cr:
            read = b"\r" + read
        self._held_cr = read.endswith(b"\r")
        if self._held_cr:
            read = read[:-1]
        if b"\r" in read:
            read = read.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        pending = self._pending
        start = max(len(pending) - 1, 0)  # a boundary may straddle the old bytes and the new
        pending += read
        boundary = pending.rfind(b"\n\n", start)
        if boundary < 0:
            if len(pending) > MAX_EVENT_BYTES:
                raise Unavailable(
                    f"the LLM provider sent more than {MAX_EVENT_BYTES >> 20} MiB without ending an"
                    " event (no blank line): not a server-sent event stream"
                )
            return []
        # Decoded whole events at a time: a line break never falls inside a multi-byte character.
        text = pending[:boundary].decode("utf-8", errors="replace")
        del pending[: boundary + 2]
        events: list[ServerEvent] = []
        for block in text.split("\n\n"):
            if block[:5] == "data:" and "\n" not in block:  # one data line: a Chat Completions event
                events.append(ServerEvent(_value(block, 5)))
            elif (event := _event(block)) is not None:
                events.append(event)
        return events

    def end(self) -> ServerEvent | None:
        """The stream ended: an event not closed by a blank line still counts (servers omit it)."""
        return _event(self._pending.decode("utf-8", errors="replace"))


def _event(block: str) -> ServerEvent | None:
    """The event of the lines between two blank lines (None when it has neither data nor error).
    A block begins or ends with an empty line at most (three line ends in a row), which adds nothing."""
    head, _, rest = block.partition("\n")
    if head[:6] == "event:" and rest[:5] == "data:" and "\n" not in rest:  # each Messages API event
        return ServerEvent(_value(rest, 5), _value(head, 6))
    data: list[str] = []
    name = error = ""
    for line in block.split("\n"):
        if not line or line[0] == ":":
            continue
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
        elif field == "error":
            error = value
    if not data and not error:
        return None
    return ServerEvent("\n".join(data), name, error)


def _value(line: str, start: int) -> str:
    """A field's value, which starts at `start` (after the field's colon), without its leading space."""
    return line[start + 1 :] if line[start : start + 1] == " " else line[start:]
