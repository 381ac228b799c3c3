"""A server span per HTTP request, under the caller's W3C trace context from its headers; the
middleware is installed only when tracing is on (base/telemetry.py)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from ...base import telemetry

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})


@web.middleware
async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
    # The span's name is the method and the route's pattern: never what the client made up (an
    # unknown method, a path no route matches), so that names stay few.
    method = request.method if request.method in METHODS else "_OTHER"
    resource = request.match_info.route.resource
    attributes = {"http.request.method": method, "url.path": request.path}
    name = method
    if resource is not None:
        attributes["http.route"] = resource.canonical
        name = f"{method} {resource.canonical}"
    with telemetry.span(name, attributes, kind="server", carrier=request.headers) as span:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if span is not None:
                span.set_attribute("http.response.status_code", exc.status)
            raise
        if span is not None:
            span.set_attribute("http.response.status_code", response.status)
        return response
