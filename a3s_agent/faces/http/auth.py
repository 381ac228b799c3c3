"""The HTTP face's bearer-token check (see faces/auth.py); the probes stay open."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ..auth import MISSING, token_matches, why_refused
from ..refusals import RefusalLog

# Probes must work without a token: container health checks and service discovery; so must the A2A
# agent card (served with --a2a), which tells a client that it needs the token.
HTTP_OPEN_PATHS = frozenset({"/healthz", "/health/live", "/health/ready", "/.well-known/agent-card.json"})


def http_middleware(token: str, refusals: RefusalLog) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def require_token(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        if request.path in HTTP_OPEN_PATHS or token_matches(token, header):
            return await handler(request)
        refusals.refused(request.remote or "", f"HTTP {request.method} {request.path}", why_refused(header))
        return web.json_response(
            {"error": {"code": "UNAUTHENTICATED", "message": MISSING, "details": None}},
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    return require_token
