"""The HTTP listener's connections: at most `max_http_connections` at once, and request headers
within HEADER_TIMEOUT_S, so that idle or slowloris connections cannot use up the process's file
descriptors (which gRPC and its health checks need too).

`ConnectionGate` is the protocol factory of the listening socket. Each connection it admits is a
`_Connection` that hands the bytes to aiohttp's own protocol. A connection over the cap is
answered 503 (plain HTTP) or dropped (TLS) at once. The deadline runs from the accept: the TLS
handshake, done here under the cap, counts against it too. After the first request, aiohttp's
keep-alive timeout closes a connection that does not send its next request in time.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Callable

from ..refusals import RefusalLog
from .body import json_text

HEADER_TIMEOUT_S = 5.0
_HEADERS_END = re.compile(rb"[^\r\n]\r?\n\r?\n")
"""The empty line after the request line and headers (a leading empty line does not count)."""


class ConnectionGate:
    """Protocol factory for the listening socket; counts the connections it admits."""

    def __init__(
        self,
        protocol_factory: Callable[[], asyncio.Protocol],
        limit: int,
        refusals: RefusalLog,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.protocol_factory = protocol_factory
        self.limit = limit
        self.refusals = refusals
        self.tls = tls
        self.admitted: set[_Connection] = set()

    def __call__(self) -> _Connection:
        return _Connection(self)

    def refuse(self, transport: asyncio.Transport, why: str) -> None:
        self.refusals.refused(_peer(transport), "HTTP connection", why)
        if self.tls is None:
            transport.write(_unavailable(f"this server has {self.limit} HTTP connections open; retry later"))
            transport.close()
        else:
            transport.abort()

    def abort_all(self) -> None:
        """Drop the connections still open (at shutdown, once aiohttp has closed its own)."""
        for connection in tuple(self.admitted):
            connection.abort()


class _Connection(asyncio.Protocol):
    """One admitted connection: the cap's bookkeeping and the header deadline, around aiohttp's protocol."""

    def __init__(self, gate: ConnectionGate) -> None:
        self._gate = gate
        self._transport: asyncio.Transport | None = None
        self._inner: asyncio.Protocol | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._tail = b""
        self._handshake: asyncio.Task[None] | None = None
        self._early: list[bytes] = []
        """Bytes decrypted before start_tls returned (the request right after the handshake)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        gate = self._gate
        if len(gate.admitted) >= gate.limit:
            gate.refuse(transport, f"{gate.limit} HTTP connections are open (max_http_connections)")
            return
        gate.admitted.add(self)
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(HEADER_TIMEOUT_S, self._too_slow)
        if gate.tls is None:
            self._attach(transport)
        else:
            self._handshake = loop.create_task(self._start_tls(transport, gate.tls))

    async def _start_tls(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            secured = await loop.start_tls(
                transport, self, context, server_side=True, ssl_handshake_timeout=HEADER_TIMEOUT_S
            )
        except OSError:  # SSLError, a reset, the handshake timeout, or our own abort
            transport.abort()
            self._release()
            return
        if secured is None:  # the connection closed during the handshake
            self._release()
            return
        self._transport = secured
        self._attach(secured)

    def _attach(self, transport: asyncio.Transport) -> None:
        self._inner = self._gate.protocol_factory()
        self._inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self._inner.data_received(data)

    def _too_slow(self) -> None:
        self._deadline = None
        transport = self._transport
        if transport is not None:
            self._gate.refusals.refused(
                _peer(transport),
                "HTTP connection",
                f"no complete request headers within {HEADER_TIMEOUT_S:.0f} s",
            )
        self.abort()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._release()

    def _release(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._gate.admitted.discard(self)

    def data_received(self, data: bytes) -> None:
        if self._deadline is not None:
            seen = self._tail + data
            if _HEADERS_END.search(seen):
                self._deadline.cancel()
                self._deadline = None
            self._tail = seen[-3:]
        if self._inner is not None:
            self._inner.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self._inner is not None:
            self._inner.connection_lost(exc)
            self._inner = None


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if peer else ""


def _unavailable(message: str) -> bytes:
    body = json_text({"error": {"code": "UNAVAILABLE", "message": message, "details": None}}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body
