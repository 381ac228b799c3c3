"""A client that reads nothing holds its stream: the frame being written waits for it, and with it
the reader of the session's log behind the stream, for as long as the connection stays open. So
each frame of a stream (SSE or WebSocket) waits at most STALLED_WRITE_S for the client to take
it; then the connection is closed and the server logs why. Nothing is lost: the client resumes
after the last event it got (`Last-Event-ID`, `after_seq`), from the durable log."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

STALLED_WRITE_S = 60.0


class StalledClient(ConnectionError):
    """The client took none of a frame within STALLED_WRITE_S: its connection was closed."""


async def written(write: Awaitable[None], transport: asyncio.Transport | None) -> None:
    """`write` done, or the connection (`transport`) aborted and StalledClient raised."""
    try:
        async with asyncio.timeout(STALLED_WRITE_S):  # not wait_for: it may swallow the call's cancel
            await write
    except TimeoutError:
        if transport is not None:
            transport.abort()
        raise StalledClient(
            f"the client read nothing for {STALLED_WRITE_S:g} s; it resumes after the last event it got"
        ) from None
