"""The LSP base protocol's framing: each JSON-RPC message is a `Content-Length: N` header block, a
blank line and N bytes of UTF-8 JSON. Reads are bounded: a header block or a body over its limit
ends the connection, so a server cannot make us buffer without end."""

from __future__ import annotations

from anyio.streams.buffered import BufferedByteReceiveStream

MAX_HEADER_BYTES = 8192
HEADER_END = b"\r\n\r\n"


class FramingError(Exception):
    """The server wrote something that is not a base-protocol message (or one over the bound)."""


def frame(body: bytes) -> bytes:
    """`body` (JSON) as one message on the wire."""
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def content_length(headers: bytes, max_body_bytes: int) -> int:
    """The body's length a header block announces; FramingError when it names none, or more than
    `max_body_bytes`."""
    length: int | None = None
    for line in headers.split(b"\r\n"):
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise FramingError(f"a Content-Length that is no number: {value.strip()[:40]!r}") from None
    if length is None or length < 0:
        raise FramingError(f"a header block without a Content-Length: {headers[:200]!r}")
    if length > max_body_bytes:
        raise FramingError(f"a message of {length} bytes, over the {max_body_bytes} bytes allowed")
    return length


async def read_message(stream: BufferedByteReceiveStream, max_body_bytes: int) -> bytes:
    """The next message's body. Raises anyio's EndOfStream when the server closed its output
    (IncompleteRead mid-message), DelimiterNotFound for a header block over MAX_HEADER_BYTES,
    FramingError for a bad or oversized header."""
    headers = await stream.receive_until(HEADER_END, MAX_HEADER_BYTES)
    return await stream.receive_exactly(content_length(headers, max_body_bytes))
