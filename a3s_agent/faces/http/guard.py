"""What a web page must not be able to make the HTTP face do, checked before any route runs.

- `Host` must name this server (hosts.py), else 421: DNS rebinding. /healthz is exempt, so that
  load balancers probing with a Host of their own keep working; it reads nothing but health.
- A browser request from another site is refused (403) unless its `Origin` is allowed
  (`--allowed-origin`): a request with an `Origin` that is not allowed, or with
  `Sec-Fetch-Site: cross-site | same-site` and no allowed Origin (no-cors GETs such as
  `<img src=".../generate/stream?content=...">` carry no Origin). Requests without either
  header (curl, SDKs, other servers) pass.
- POST, PUT and PATCH bodies must be `application/json` (415 otherwise), so no form or
  `text/plain` "simple request" reaches a handler.
- CORS: a preflight from an allowed Origin is answered 204; from any other, 403. Responses to
  an allowed Origin carry `Access-Control-Allow-Origin: <that origin>` (never `*`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import web

from ..call_metadata import REQUEST_KEYS
from ..refusals import RefusalLog
from .auth import HTTP_OPEN_PATHS
from .harness import HARNESS_PATHS
from .hosts import HostPolicy

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
CROSS_SITE = frozenset({"cross-site", "same-site"})
PREFLIGHT_MAX_AGE_S = 600
PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, PUT, PATCH, DELETE",
    # The a3s-* call metadata travels as request headers (call_metadata.py); a stream's cursor
    # may be Last-Event-ID too.
    "Access-Control-Allow-Headers": ", ".join(
        ("authorization", "content-type", "last-event-id", *REQUEST_KEYS)
    ),
    "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(value: str) -> str:
    """An Origin as browsers serialise it: `scheme://host[:port]`, lower case, no default port.

    Raises ValueError for anything else (a path, a query, no scheme or host)."""
    text = value.strip().rstrip("/")
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if not parts.scheme or not parts.hostname or parts.path or parts.query or parts.fragment or port == -1:
        raise ValueError(
            f"{value!r} is not an origin: expected scheme://host[:port], e.g. https://app.example"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{value!r} is not an origin: it holds user information")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    scheme = parts.scheme.lower()
    shown_port = "" if port is None or port == _DEFAULT_PORTS.get(scheme) else f":{port}"
    return f"{scheme}://{host}{shown_port}"


def _vary(response: web.StreamResponse, header: str) -> None:
    present = [v.strip().lower() for v in response.headers.get("Vary", "").split(",") if v.strip()]
    if header.lower() not in present and "*" not in present:
        response.headers["Vary"] = ", ".join([response.headers["Vary"], header]) if present else header


class RequestGuard:
    """The middleware and the response hook that enforce the rules above."""

    def __init__(self, hosts: HostPolicy, allowed_origins: Iterable[str], refusals: RefusalLog) -> None:
        self._hosts = hosts
        self._origins = frozenset(normalize_origin(o) for o in allowed_origins)
        self._refusals = refusals

    def _allowed_origin(self, request: web.Request) -> str | None:
        """The request's Origin when it is allowed."""
        origin = request.headers.get("Origin")
        if origin is None:
            return None
        try:
            return origin if normalize_origin(origin) in self._origins else None
        except ValueError:  # "null" (sandboxed frames, file: pages) and garbage
            return None

    def _refuse(self, request: web.Request, error: type[web.HTTPException], why: str) -> web.HTTPException:
        self._refusals.refused(request.remote or "", f"{request.method} {request.path}", why)
        return error(text=why)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self._check_host(request)
        allowed = self._allowed_origin(request)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if allowed is None:
                raise self._refuse(request, web.HTTPForbidden, _origin_refusal(request.headers.get("Origin")))
            return web.Response(
                status=204, headers={"Access-Control-Allow-Origin": allowed, **PREFLIGHT_HEADERS}
            )
        if allowed is None:
            self._check_not_cross_site(request)
        routed = request.match_info.http_exception is None  # else a 404 or 405 says more
        own_check = request.path in HARNESS_PATHS  # answers a wrong content type as its spec says
        if routed and request.method in BODY_METHODS and not own_check and not _is_json(request):
            given = request.headers.get("Content-Type")
            raise web.HTTPUnsupportedMediaType(
                text="send the body as JSON with 'Content-Type: application/json'"
                + (f", not {given!r}" if given else " (no Content-Type was sent)")
            )
        return await handler(request)

    def _check_host(self, request: web.Request) -> None:
        host = request.headers.get("Host")
        if host is None or request.path in HTTP_OPEN_PATHS:
            return
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        if not self._hosts.allows(host, sockname[0] if sockname else None):
            raise self._refuse(
                request,
                web.HTTPMisdirectedRequest,
                f"Host {host!r} does not name this server; an operator can allow it with"
                " --allowed-host (A3S_ALLOWED_HOSTS)",
            )

    def _check_not_cross_site(self, request: web.Request) -> None:
        """For a request without an allowed Origin: no Origin at all, and not cross-site."""
        origin = request.headers.get("Origin")
        if origin is not None:
            raise self._refuse(request, web.HTTPForbidden, _origin_refusal(origin))
        fetch_site = request.headers.get("Sec-Fetch-Site", "").lower()
        if fetch_site in CROSS_SITE:
            raise self._refuse(
                request,
                web.HTTPForbidden,
                f"a {fetch_site} browser request without an allowed Origin; an operator can allow a web"
                " app's origin with --allowed-origin (A3S_ALLOWED_ORIGINS)",
            )

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every response to a browser: `Vary: Origin`, and the CORS grant for an allowed Origin."""
        if "Origin" not in request.headers:
            return
        _vary(response, "Origin")
        allowed = self._allowed_origin(request)
        if allowed is not None:
            response.headers["Access-Control-Allow-Origin"] = allowed
            exposed = [name for name in response.headers if name.lower().startswith("a3s-")]
            if exposed:  # so that a page's script can read the reply's a3s-* metadata
                response.headers["Access-Control-Expose-Headers"] = ", ".join(exposed)


def _origin_refusal(origin: str | None) -> str:
    if origin is None:
        return "a CORS preflight without an Origin"
    return (
        f"Origin {origin!r} is not allowed; an operator can allow a web app's origin with"
        " --allowed-origin (A3S_ALLOWED_ORIGINS)"
    )


def _is_json(request: web.Request) -> bool:
    charset = (request.charset or "utf-8").lower()
    return (
        "Content-Type" in request.headers
        and request.content_type == "application/json"
        and charset == "utf-8"
    )
