"""Bearer-token authentication for both faces (--auth-token-file, A3S_AUTH_TOKEN_FILE or A3S_AUTH_TOKEN).

When a token is set, every gRPC call except grpc.health and reflection, and every HTTP route
except the probes (/healthz, /health/live, /health/ready), needs `authorization: Bearer <token>`;
others get UNAUTHENTICATED / 401 and
a line in the shared RefusalLog (peer, method, why). The comparison takes constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import grpc

from .grpc.handlers import refusing
from .refusals import RefusalLog

if TYPE_CHECKING:
    from aiohttp import web

# Probes must work without a token: container health checks and service discovery.
GRPC_OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
HTTP_OPEN_PATHS = frozenset({"/healthz", "/health/live", "/health/ready"})  # the probes
MISSING = "missing or wrong bearer token: send the header 'authorization: Bearer <token>'"


def token_matches(expected: str, header: str | None) -> bool:
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


def _why(header: str | None) -> str:
    """Why a request was refused; never the header's value."""
    return "no bearer token" if not header else "wrong bearer token"


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str, refusals: RefusalLog) -> None:
        self._token = token
        self._refusals = refusals

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(GRPC_OPEN_PREFIXES):
            return handler
        header = dict(details.invocation_metadata or ()).get("authorization")
        if token_matches(self._token, header):
            return handler
        # The peer is known only inside the call, so the refusing handler logs it.
        why = _why(header)
        return refusing(
            handler,
            grpc.StatusCode.UNAUTHENTICATED,
            MISSING,
            before=lambda context: self._refusals.refused(context.peer(), details.method, why),
        )


def http_middleware(token: str, refusals: RefusalLog) -> Callable[..., Awaitable[web.StreamResponse]]:
    from aiohttp import web

    @web.middleware
    async def require_token(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        if request.path in HTTP_OPEN_PATHS or token_matches(token, header):
            return await handler(request)
        refusals.refused(request.remote or "", f"HTTP {request.method} {request.path}", _why(header))
        return web.json_response(
            {"error": {"code": "UNAUTHENTICATED", "message": MISSING, "details": None}},
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    return require_token
