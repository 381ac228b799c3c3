"""The Agent Spaces operations protocol over HTTP (`/v1/spaces/...`): each route one call of the
application layer's Spaces service (app/spaces.py).

POST /v1/spaces                                   {"spaceId"?, "sessionId"? | "workspace"?, "policy"?} → 201 space
GET  /v1/spaces/{spaceId}                         the space
DELETE /v1/spaces/{spaceId}                       204; the space, its runs and its own directory are gone
POST /v1/spaces/{spaceId}/runs                    an operations message → the events message
GET  /v1/spaces/{spaceId}/runs/{runId}            the run with all its events so far
POST /v1/spaces/{spaceId}/runs/{runId}/resume     {"approval": {"operationId", "decision", "reason"?}}
POST /v1/spaces/{spaceId}/runs/{runId}/cancel
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from ...app import Application
from ...base.errors import AgentError
from ..status import status_name
from .body import json_body
from .errors import CallError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _domain(handler: Handler) -> Handler:
    """Domain errors as the HTTP face's JSON errors (400, 404, 409...)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except AgentError as exc:
            raise CallError(status_name(exc), str(exc)) from exc

    return wrapped


def spaces_routes(app: Application) -> web.RouteTableDef:
    spaces = app.spaces
    routes = web.RouteTableDef()

    @routes.post("/v1/spaces")
    @_domain
    async def create_space(request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise AgentError("the body must be a JSON object")
        space = await spaces.create_space(
            body.get("spaceId"),
            session_id=str(body["sessionId"]) if body.get("sessionId") else None,
            workspace=str(body["workspace"]) if body.get("workspace") else None,
            policy=body.get("policy", "standard"),
        )
        return web.json_response(space.to_dict(), status=201, headers={"Location": f"/v1/spaces/{space.id}"})

    @routes.get("/v1/spaces/{space}")
    @_domain
    async def get_space(request: web.Request) -> web.StreamResponse:
        return web.json_response((await spaces.get_space(request.match_info["space"])).to_dict())

    @routes.delete("/v1/spaces/{space}")
    @_domain
    async def delete_space(request: web.Request) -> web.StreamResponse:
        await spaces.delete_space(request.match_info["space"])
        return web.Response(status=204)

    @routes.post("/v1/spaces/{space}/runs")
    @_domain
    async def start_run(request: web.Request) -> web.StreamResponse:
        result = await spaces.start_run(request.match_info["space"], await json_body(request))
        return web.json_response(result)

    @routes.get("/v1/spaces/{space}/runs/{run}")
    @_domain
    async def get_run(request: web.Request) -> web.StreamResponse:
        return web.json_response(await spaces.get_run(request.match_info["space"], request.match_info["run"]))

    @routes.post("/v1/spaces/{space}/runs/{run}/resume")
    @_domain
    async def resume_run(request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        approval = body.get("approval", body) if isinstance(body, dict) else body
        result = await spaces.resume_run(request.match_info["space"], request.match_info["run"], approval)
        return web.json_response(result)

    @routes.post("/v1/spaces/{space}/runs/{run}/cancel")
    @_domain
    async def cancel_run(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            await spaces.cancel_run(request.match_info["space"], request.match_info["run"])
        )

    return routes
