"""GET /metrics: the server's metrics (base/metrics.py) in Prometheus' text format, for a scraper.
Served only when the operator turned it on (--prometheus-metrics), behind the token as every route
but the health probes."""

from __future__ import annotations

from aiohttp import web

from ...base import metrics

# Prometheus' text exposition format, as prometheus_client's CONTENT_TYPE_LATEST names it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def _scrape(request: web.Request) -> web.Response:
    text = metrics.prometheus_text()
    if text is None:  # metrics were shut down (the server is stopping)
        raise web.HTTPServiceUnavailable(text="metrics are not being collected")
    return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE})


def metrics_routes() -> list[web.RouteDef]:
    return [web.get("/metrics", _scrape)]
