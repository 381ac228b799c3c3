"""The HTTP face's side of readiness: the probes /health/live and /health/ready (the A3S Harness's
bodies, schema a3s.code.agent-health.v1) and a middleware that refuses new requests with 503
unless the server is ready, counts those in flight for the graceful stop, and ends one the stop
cancels with 503 UNAVAILABLE saying so. /healthz is in app.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..readiness import Phase, Readiness
from .auth import HTTP_OPEN_PATHS
from .body import json_text
from .errors import CallError

HEALTH_SCHEMA = "a3s.code.agent-health.v1"
OPEN_WHILE_STOPPING = frozenset(
    {
        "/health",  # HealthCheck: STATUS_UNHEALTHY "shutting down"
        # what a generation in its grace period may still need from its client:
        "/rpc/Cancel",
        "/rpc/Resume",
        "/rpc/ConfirmToolExecution",
        "/rpc/CompleteExternalTask",
        "/rpc/ListPendingExternalTasks",
    }
)
UNTRACKED_PATHS = frozenset({"/ws"})
"""An idle WebSocket must not hold up the stop for the whole grace: sockets are closed after it."""


def _health(status: str, http_status: int) -> web.Response:
    return web.json_response({"schema": HEALTH_SCHEMA, "status": status}, status=http_status, dumps=json_text)


class Probes:
    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/health/live", self.live), web.get("/health/ready", self.ready)]

    async def live(self, request: web.Request) -> web.Response:
        """200 while the process serves, whatever its phase."""
        return _health("live", 200)

    async def ready(self, request: web.Request) -> web.Response:
        """200 once every configured face listens; 503 while starting or stopping."""
        if self._readiness.phase is Phase.READY:
            return _health("ready", 200)
        return _health("not_ready", 503)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in HTTP_OPEN_PATHS:  # the probes
            return await handler(request)
        readiness = self._readiness
        phase = readiness.phase
        if not (phase is Phase.READY or (phase is Phase.STOPPING and request.path in OPEN_WHILE_STOPPING)):
            raise CallError("UNAVAILABLE", readiness.refusal())
        if request.path in UNTRACKED_PATHS:
            return await handler(request)
        with readiness.tracking():
            try:
                return await handler(request)
            except asyncio.CancelledError:
                if not readiness.took_back_stop():
                    raise
                raise CallError("UNAVAILABLE", readiness.stop_message) from None
