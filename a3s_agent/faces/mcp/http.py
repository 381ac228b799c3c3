"""The MCP server over Streamable HTTP at /mcp, as routes of the HTTP face (server.py passes them
in with the Agent Spaces routes), so the face's token, Host and Origin guard and readiness gate
apply as to every route; asgi.py says why it is the SDK's transport driven from aiohttp.

POST carries the client's messages (answered with JSON or a server-sent event stream: progress
notifications, then the result), DELETE ends an MCP session. GET, the optional stream for messages
outside any request, is refused with 405 as the spec allows: this server sends none, and an idle
stream per client would hold up every graceful stop for the whole grace period."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiohttp import web
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from ...app import Application
from ..asgi import serve_asgi
from .runs import AgentRuns
from .server import build_server
from .tools import Offer

PATH = "/mcp"


class McpHttp:
    """The SDK's session manager, started at the first request and stopped with the server."""

    def __init__(self, app: Application, allowed: Iterable[str]) -> None:
        self._runs = AgentRuns(app)
        # The face's guard checks Host and Origin before the SDK sees a request: its own check off.
        self._manager = StreamableHTTPSessionManager(
            build_server(app, Offer(app, allowed), self._runs), security_settings=None
        )
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    def routes(self) -> list[web.RouteDef]:
        return [web.post(PATH, self._handle), web.delete(PATH, self._handle)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        await self._ready.wait()
        return await serve_asgi(request, self._manager.handle_request)

    async def _run(self) -> None:
        """The manager's task group, which runs every MCP session's server, lives in this task."""
        try:
            async with self._manager.run():
                self._ready.set()
                await self._stop.wait()
        finally:
            self._ready.set()  # a manager that failed to start: requests fail rather than wait

    async def stop(self) -> None:
        """End every MCP session; a tool call still running is cancelled (after the HTTP face's
        grace, which POSTs in flight had), as are the agent_task runs kept for later requests."""
        self._stop.set()
        if self._task is not None:
            await self._task
        await self._runs.close()
