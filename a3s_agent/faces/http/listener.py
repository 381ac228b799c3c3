"""The HTTP listener: binds HOST:PORT, plain or TLS, behind the connection gate and the request guard."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from pathlib import Path

from aiohttp import web

from ...app import Application
from ...app.types import Settings
from ..readiness import Readiness
from ..refusals import RefusalLog
from .app import build_app
from .connections import ConnectionGate
from .guard import RequestGuard
from .hosts import HostPolicy

IDLE_TIMEOUT_S = 15.0
"""How long a kept-alive connection may wait for its next request (aiohttp's keepalive_timeout)."""
BACKLOG = 32
"""The listen backlog, which is also how many connections asyncio accepts at a time. Each holds an
open file until it is served or turned away (over the cap), so a small one keeps what a flood
holds beyond the cap within the files reserved for the rest (faces/open_files.py)."""


class HttpBindError(RuntimeError):
    """The HTTP listener could not start: the address cannot be bound, or its settings are unusable."""


class HttpListener:
    """A running HTTP listener."""

    def __init__(self, runner: web.AppRunner, server: asyncio.Server, gate: ConnectionGate) -> None:
        self._runner = runner
        self._server = server
        self._gate = gate
        self.port: int = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, close the WebSockets, wait (up to the grace) for requests in flight,
        then drop what is left (connections that never got as far as a request)."""
        self._server.close()
        await self._runner.cleanup()
        self._gate.abort_all()
        await self._server.wait_closed()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise HttpBindError(f"cannot listen for HTTP on {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The server context for --tls-cert/--tls-key (TLS 1.2 or later), or None for plain HTTP."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise HttpBindError("TLS needs both --tls-cert and --tls-key (A3S_TLS_CERT, A3S_TLS_KEY)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise HttpBindError(f"cannot use --tls-cert {cert} and --tls-key {key} for HTTP: {exc}") from exc
    return context


async def _guard(settings: Settings, host: str, refusals: RefusalLog) -> RequestGuard:
    try:
        hosts = await HostPolicy.for_listener(host, settings.allowed_hosts)
        return RequestGuard(hosts, settings.allowed_origins, refusals)
    except ValueError as exc:
        raise HttpBindError(f"cannot serve HTTP: --allowed-origin {exc}") from exc


async def start_http(
    app: Application,
    address: str,
    *,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
    refusals: RefusalLog | None = None,
    readiness: Readiness | None = None,
) -> HttpListener:
    """Serve the HTTP face of `app` on `address` (HOST:PORT; port 0 picks a free one) in this event
    loop, with the server's settings (token, TLS, hosts, limits).

    `refusals` is the server's shared log of refused requests (a new one when not given);
    `readiness` the server's (when not given: ready now, stopping when the server is)."""
    settings = app.lifecycle.settings
    host, port = _split(address)
    refusals = refusals or RefusalLog()
    tls = tls_context(settings.tls_cert, settings.tls_key)
    guard = await _guard(settings, host, refusals)
    readiness = readiness or Readiness(app.lifecycle, ready=True)
    runner = web.AppRunner(
        build_app(app, guard, refusals, readiness, settings.auth_token, extra_routes),
        handler_cancellation=True,  # a client that goes away cancels its call, as in gRPC
        access_log=None,  # the rpc wrapper logs every call; probes would flood an access log
        shutdown_timeout=settings.grace_seconds,
        keepalive_timeout=IDLE_TIMEOUT_S,
    )
    await runner.setup()
    assert runner.server is not None
    gate = ConnectionGate(runner.server, settings.max_http_connections, refusals, tls)
    try:
        server = await asyncio.get_running_loop().create_server(gate, host, port, backlog=BACKLOG)
    except OSError as exc:
        await runner.cleanup()
        raise HttpBindError(
            f"cannot listen for HTTP on {address}: already in use or not available ({exc.strerror or exc});"
            " choose another with --http-listen or A3S_HTTP_LISTEN, or 'off'"
        ) from exc
    return HttpListener(runner, server, gate)
