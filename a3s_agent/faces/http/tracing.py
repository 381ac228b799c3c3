"""A server span per HTTP request, under the caller's W3C trace context from its headers; the
middleware is installed only when tracing is on (base/telemetry.py)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from ...base import telemetry


@web.middleware
async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    attributes = {"http.request.method": request.method, "http.route": route, "url.path": request.path}
    with telemetry.span(
        f"{request.method} {route}", attributes, kind="server", carrier=request.headers
    ) as span:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if span is not None:
                span.set_attribute("http.response.status_code", exc.status)
            raise
        if span is not None:
            span.set_attribute("http.response.status_code", response.status)
        return response
