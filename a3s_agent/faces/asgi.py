"""One aiohttp request served by an ASGI application: the mcp SDK's Streamable HTTP transport and
the a2a SDK's JSON-RPC routes are ASGI, the HTTP face is aiohttp. Driving the SDK's application
from an aiohttp handler keeps /mcp and /a2a on the HTTP face's own listener, behind its connection
cap, TLS, request guard, token check and readiness gate, instead of a second listener with a copy
of each.

The application runs in a task of its own, as under an ASGI server: when aiohttp cancels the
handler (the client went away, or the server's stop ended the request), `receive` answers
`http.disconnect` and the application ends the exchange its own way (the SDK keeps an MCP session
whose opening request's client hung up once it had its answer; a cancelled handler would not)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aiohttp import web

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})
"""aiohttp frames the response itself."""
MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body, as on the HTTP face's other routes (aiohttp's `client_max_size`, which
a body read as a stream here does not get)."""
ENDING_S = 10.0
"""After a disconnect: how long the application may take to end the exchange before it is cancelled
(longer than an agent_task takes to stop its run)."""


async def serve_asgi(request: web.Request, app: AsgiApp) -> web.StreamResponse:
    """The application's response; 413 for a body over MAX_BODY_BYTES (read no further)."""
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, request.content_length or 0)
    exchange = _Exchange(request)
    call = asyncio.ensure_future(app(_scope(request), exchange.receive, exchange.send))
    try:
        await asyncio.shield(call)
    except asyncio.CancelledError:
        exchange.disconnected.set()
        await asyncio.wait({call}, timeout=ENDING_S)
        call.cancel()
        raise
    if exchange.too_large:
        raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, exchange.received)
    if exchange.response is None:
        raise RuntimeError(f"the ASGI application sent no response to {request.method} {request.path}")
    return exchange.response


def _scope(request: web.Request) -> dict[str, Any]:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport else None
    own = transport.get_extra_info("sockname") if transport else None
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1"),
        "query_string": request.query_string.encode("latin-1"),
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if peer else None,
        "server": tuple(own[:2]) if own else None,
    }


class _Exchange:
    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._body_read = False
        self.received = 0
        self.too_large = False
        self.disconnected = asyncio.Event()
        self.response: web.StreamResponse | None = None

    async def receive(self) -> Message:
        if self._body_read:
            await self.disconnected.wait()
            return {"type": "http.disconnect"}
        chunk = await self._request.content.readany()
        self.received += len(chunk)
        if self.received > MAX_BODY_BYTES:  # a chunked body: no Content-Length to refuse it by
            self.too_large = True
            self._body_read = True
            self.disconnected.set()
            return {"type": "http.disconnect"}
        self._body_read = not chunk or self._request.content.at_eof()
        return {"type": "http.request", "body": chunk, "more_body": not self._body_read}

    async def send(self, message: Message) -> None:
        if self.too_large:
            return  # the application's answer to a body cut short: serve_asgi answers 413
        if message["type"] == "http.response.start":
            headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers", [])
                if name.lower() not in HOP_BY_HOP
            ]
            self.response = web.StreamResponse(status=message["status"], headers=headers)
            return
        response = self.response
        if message["type"] != "http.response.body" or response is None:
            raise RuntimeError(f"unexpected ASGI message {message['type']!r}")
        if not response.prepared:
            await response.prepare(self._request)
        if message.get("body"):
            await response.write(message["body"])
        if not message.get("more_body", False):
            await response.write_eof()
