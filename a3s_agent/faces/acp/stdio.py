"""ACP's wire: newline-delimited JSON-RPC on this process's stdin and stdout, handed to the SDK as a
message transport (`run_agent` takes any object with `send`, `receive` and `close`).

Either end may be a pipe, a socket, a terminal or a regular file (`a3s-agent acp < requests.jsonl >
answers.jsonl`): asyncio watches the first three; a regular file (or /dev/null), always ready, is
read and written directly. The protocol has descriptors of its own: fd 0 is pointed at /dev/null
and fd 1 (and `sys.stdout`) at stderr, so no tool, child or library reads the requests or writes
into the answers. A line that is not a JSON object is skipped with a warning.

The end of stdin does not end the connection by itself: `receive` sets `ended` and waits, so that
the requests already read can still be answered (`answered`) before the agent closes it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import selectors
import stat
import sys
from collections import Counter
from typing import Any, Protocol

from ..agent_service import MAX_REQUEST_MESSAGE_SIZE

log = logging.getLogger(__name__)

LINE_LIMIT = 2 * MAX_REQUEST_MESSAGE_SIZE
"""The longest line read (a prompt at the request bound, its images in base64, fits); a longer one
is skipped with a warning."""
CHUNK = 64 * 1024
"""What is read of a regular file at a time, and the reader's buffer limit."""
CLOSE_WAIT_S = 5.0
"""At the close: how long what is still buffered for stdout may take to be written."""


class _Output(Protocol):
    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


class StdioTransport:
    """JSON-RPC messages in from stdin, out to stdout; counts the requests not yet answered."""

    def __init__(
        self, reader: asyncio.StreamReader, output: _Output, pump: asyncio.Task[None] | None
    ) -> None:
        self._reader = reader
        self._output = output
        self._pump = pump
        self.ended = asyncio.Event()
        """Set when stdin has ended: the client sends nothing more."""
        self._closed = asyncio.Event()
        self._unanswered: Counter[str] = Counter()
        self._settled = asyncio.Event()  # nothing unanswered, or stdout broken
        self._settled.set()

    async def receive(self) -> dict[str, Any] | None:
        while (line := await self._line()) is not None:
            message = _message(line)
            if message is None:
                continue
            if "method" in message and "id" in message:
                self._unanswered[_key(message["id"])] += 1
                self._settled.clear()
            return message
        self.ended.set()
        await self._closed.wait()
        return None

    async def send(self, message: dict[str, Any]) -> None:
        try:
            await self._output.write((json.dumps(message, separators=(",", ":")) + "\n").encode())
        except OSError:
            self._settled.set()  # nothing more can be answered
            raise
        if "method" not in message and "id" in message:
            key = _key(message["id"])
            if self._unanswered[key] > 0:
                self._unanswered[key] -= 1
            if not +self._unanswered:
                self._settled.set()

    async def answered(self) -> None:
        """Return once every request read has been answered (or stdout cannot take answers)."""
        await self._settled.wait()

    async def close(self) -> None:
        self._closed.set()
        if self._pump is not None:
            self._pump.cancel()
        await self._output.close()

    async def _line(self) -> bytes | None:
        """The next line of stdin, None at its end; lines over LINE_LIMIT are skipped."""
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                part, whole = await self._reader.readuntil(b"\n"), True
            except asyncio.LimitOverrunError as exc:
                part, whole = await self._reader.readexactly(exc.consumed), False
            except asyncio.IncompleteReadError as exc:  # the end, perhaps after a last line without "\n"
                if not exc.partial and not parts:
                    return None
                part, whole = exc.partial, True
            size += len(part)
            if size <= LINE_LIMIT:
                parts.append(part)
            else:
                parts.clear()
            if whole:
                if size <= LINE_LIMIT:
                    return b"".join(parts)
                log.warning("a line of %d bytes on stdin was skipped: at most %d are read", size, LINE_LIMIT)
                parts, size = [], 0


class Peeked:
    """The transport with a message already received in front of it again (for the SDK, once the
    first message has chosen the protocol)."""

    def __init__(self, first: dict[str, Any] | None, transport: StdioTransport) -> None:
        self._first = first
        self._transport = transport

    async def receive(self) -> dict[str, Any] | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._transport.receive()

    async def send(self, message: dict[str, Any]) -> None:
        await self._transport.send(message)

    async def close(self) -> None:
        await self._transport.close()


def _message(line: bytes) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        message = json.loads(line)
    except ValueError as exc:
        log.warning("a line on stdin that is not JSON was skipped: %s", exc)
        return None
    if not isinstance(message, dict):
        log.warning("a line on stdin that is not a JSON-RPC message (an object) was skipped")
        return None
    return message


def _key(request_id: Any) -> str:
    return json.dumps(request_id, sort_keys=True)


async def open_stdio() -> StdioTransport:
    """The transport over stdin and stdout, which from now on only it uses."""
    loop = asyncio.get_running_loop()
    source, sink = _take(0, os.O_RDONLY), _take(1, os.O_WRONLY)
    sys.stdout = sys.stderr
    reader = asyncio.StreamReader(limit=CHUNK)
    pump: asyncio.Task[None] | None = None
    if _watchable(source, selectors.EVENT_READ):
        protocol = asyncio.StreamReaderProtocol(reader)
        await loop.connect_read_pipe(lambda: protocol, os.fdopen(source, "rb", buffering=0))
    else:
        pump = asyncio.create_task(_pump(source, reader), name="acp-stdin")
    output: _Output
    if _watchable(sink, selectors.EVENT_WRITE):
        transport, flow = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop), os.fdopen(sink, "wb", buffering=0)
        )
        output = _PipeOutput(asyncio.StreamWriter(transport, flow, None, loop))
    else:
        output = _FileOutput(sink)
    return StdioTransport(reader, output, pump)


def _take(fd: int, mode: int) -> int:
    """A private copy of `fd`, which is pointed elsewhere: /dev/null for stdin, stderr for stdout."""
    private = os.dup(fd)
    elsewhere = os.open(os.devnull, mode) if fd == 0 else os.dup(2)
    os.dup2(elsewhere, fd)
    os.close(elsewhere)
    return private


def _watchable(fd: int, events: int) -> bool:
    """Whether asyncio can wait on `fd`: a pipe, a socket or a terminal; not a regular file, nor
    /dev/null (a character device no selector takes)."""
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)):
        return False
    with selectors.DefaultSelector() as probe:
        try:
            probe.register(fd, events)
        except OSError:
            return False
    return True


class _Paused:
    """What a StreamReader fed by hand asks of its transport: pause when its buffer is full."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.reading.set()

    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()


async def _pump(fd: int, reader: asyncio.StreamReader) -> None:
    """Feed a regular file to `reader` as fast as it is read (a file is always ready: no waiting)."""
    flow = _Paused()
    reader.set_transport(flow)  # type: ignore[arg-type]
    try:
        while chunk := os.read(fd, CHUNK):
            reader.feed_data(chunk)
            await flow.reading.wait()
            await asyncio.sleep(0)
    finally:
        reader.feed_eof()
        os.close(fd)


class _PipeOutput:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        """Write what is buffered (within CLOSE_WAIT_S), then close."""
        transport = self._writer.transport
        if transport.is_closing():  # the reader went away
            return
        transport.set_write_buffer_limits(high=0)  # drain now waits until everything is written
        try:
            await asyncio.wait_for(self._writer.drain(), CLOSE_WAIT_S)
        except (TimeoutError, OSError):
            if not transport.is_closing():
                transport.abort()  # what is left is given up
            return
        transport.close()


class _FileOutput:
    """A regular file: each write goes straight to it (it never waits for a reader)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def close(self) -> None:
        os.close(self._fd)
