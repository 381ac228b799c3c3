"""Steering a running generation over HTTP (app/control.py `steer`):

    POST /sessions/{id}/steer   {"content": "<the user's message>"} → 202 {"session_id", "steer_id"}

The running generation takes the message in at its next safe point (after the tool calls it runs
end, before its next model request) and answers it before it ends. The session's log then has
the INFO event `steer_applied` (its data: `steer_id`, `content`), and the generation's stream a
METADATA chunk of that type. With no generation running, or the running one done with its
answer: 409 FAILED_PRECONDITION (send the message as a new prompt instead).
"""

from __future__ import annotations

from aiohttp import web

from ...app import Application
from ...base.errors import InvalidArgument
from .body import closed_object, json_body, json_text
from .errors import unary_call


class SteerRoutes:
    def __init__(self, app: Application) -> None:
        self._app = app

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/sessions/{id}/steer", self.steer)]

    async def steer(self, request: web.Request) -> web.Response:
        session_id = request.match_info["id"]
        return await unary_call("Steer", session_id, self._steer(request, session_id))

    async def _steer(self, request: web.Request, session_id: str) -> web.Response:
        body = closed_object(await json_body(request), {"content": str})
        if "content" not in body:
            raise InvalidArgument("content is required: the message for the running generation")
        steer_id = await self._app.control.steer(session_id, body["content"])
        reply = {"session_id": session_id, "steer_id": steer_id}
        return web.json_response(reply, status=202, dumps=json_text)
