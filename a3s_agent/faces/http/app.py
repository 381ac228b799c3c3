"""The HTTP face's application: /healthz, the A3S REST adapter (server-sent events for streams), /ws.

Routes (bodies and replies are the proto messages' JSON forms, see codec.py; each RPC is one entry
of the table in methods.py, a conversion and one call into the application layer):

    GET    /healthz                          200 {"status": "ok", ...}; 503 {"status": "starting"}
                                             or {"status": "shutting_down"}
    GET    /health/live                      200 {"schema": "a3s.code.agent-health.v1", "status": "live"}
    GET    /health/ready                     200 {..., "status": "ready"}; 503 {..., "status": "not_ready"}
    GET    /health                           HealthCheck (200 with the reply, also when unhealthy)
    GET    /capabilities                     GetCapabilities
    POST   /sessions                         CreateSession (body: CreateSessionRequest) → 201
    GET    /sessions                         ListSessions
    GET    /sessions/{id}                    GetSession, its session with `parent` and `children`
                                             (its place among subagents)
    DELETE /sessions/{id}                    DestroySession
    POST   /sessions/{id}/generate           Generate (body: GenerateRequest; session_id from the path)
    POST   /sessions/{id}/generate/stream    StreamGenerate as server-sent events (body: GenerateRequest)
    GET    /sessions/{id}/generate/stream    the same, for one user message: ?content=<text>
    POST   /sessions/{id}/tools/{name}       ExecuteTool; the body is the tool's arguments object
    GET    /sessions/{id}/events             a page of the session's log: ?after_seq=&limit= (events_page.py)
    POST   /sessions/{id}/cancel             Cancel (body: CancelRequest or none; session_id from the path)
    POST   /sessions/{id}/pause, …/resume    Pause, Resume (body: none)
    POST   /sessions/{id}/confirmations/{tool_id}
                                             ConfirmToolExecution (body: {"approved", "reason"})
    POST   /sessions/{id}/steer              a message for the running generation (steering.py)
    POST   /rpc/{method}                     any RPC by name (body: its request); streaming ones as SSE
    GET    /sessions/{id}/checkpoints, POST …/rewind, …/restore, …/fork, GET …/diff: checkpoints
                                             (checkpoints.py)
    POST   /v1/agent/commands, /v1/agent/events:page, /v1/agent/changes: the A3S harness protocol
                                             (harness.py; its own bodies and error documents)
    GET    /ws                               the WebSocket JSON form of every RPC (ws.py)

A unary call's `a3s-*` metadata (faces/call_metadata.py: the session's token budget, compaction
settings and config mode, ListSessions' paging) is sent as request headers of the same names; what
the gRPC face puts in trailing metadata (the session's usage, budget and compaction settings, the
next page token) comes back as response headers.

Errors are `{"error": {"code": "NOT_FOUND", "message": ..., "details": object|null}}` with the
HTTP status of errors.HTTP_STATUS; a body over MAX_BODY_BYTES (body.py) is 413. Before any route, guard.py
refuses a foreign Host (421), a foreign browser Origin (403) and a body that is not JSON (415);
probes.py refuses new work with 503 UNAVAILABLE while the server starts or stops; listener.py binds the address behind the connection cap and the header timeout (connections.py).

A stream answers `data: <reply JSON>` per reply, then `event: done` (`data: {}`). A failure
before the first reply is a plain error response with its status; after it, `event: error`
with the error JSON ends the stream. A client that goes away cancels the call, except that a
generation StreamGenerate (or Generate) started runs on until POST /sessions/{id}/cancel (Cancel)
stops it; the call's log line says DISCONNECTED, not CANCELLED. StreamGenerate's and
SubscribeEvents' replies carry `id: <seq>`, and a request with `Last-Event-ID` (what EventSource
sends when it reconnects) or `a3s-after-seq` resumes after that seq.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from contextlib import suppress
from typing import Any

from aiohttp import web

from ...app import Application
from ...base import telemetry
from ...base.errors import InvalidArgument, NotFound
from ..call_metadata import AFTER_SEQ_KEY, seq_number
from ..readiness import Phase, Readiness
from ..refusals import RefusalLog
from . import convert
from .auth import http_middleware
from .body import MAX_BODY_BYTES, json_body, json_text
from .checkpoints import CheckpointRoutes
from .errors import CallError, connection_closed, unary_call
from .events_page import events_page
from .guard import RequestGuard
from .harness import HarnessApi, harness_errors
from .methods import CallMetadata, Cursor, Method, find_method, parse
from .probes import Probes
from .stalled import StalledClient, written
from .steering import SteerRoutes
from .tracing import traced
from .ws import WebSocketFace

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
"""How often a stream sends an SSE comment, so that proxies keep a quiet stream open."""

_CODE_OF_HTTP_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    413: "RESOURCE_EXHAUSTED",
    415: "INVALID_ARGUMENT",
    421: "PERMISSION_DENIED",
}


def _error_response(
    error: CallError, status: int | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": error.to_json()}, status=status or error.http_status, headers=headers, dumps=json_text
    )


@web.middleware
async def _connection(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Tell the call log whether this request's connection has closed (errors.connection_closed):
    aiohttp cancels a handler whose client went away (listener.py), and so does the server's stop."""

    def closed() -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    token = connection_closed.set(closed)
    try:
        return await handler(request)
    finally:
        connection_closed.reset(token)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure as the JSON error shape, including aiohttp's own 404, 405 and 413."""
    try:
        return await handler(request)
    except CallError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        default_text = f"{exc.status}: {exc.reason}"
        message = exc.text if exc.text and exc.text != default_text else exc.reason
        code = _CODE_OF_HTTP_STATUS.get(exc.status, "UNKNOWN")
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return _error_response(
            CallError(code, f"{request.method} {request.path}: {message}"), exc.status, allow
        )
    except Exception as exc:
        log.error("%s %s failed unexpectedly", request.method, request.path, exc_info=exc)
        return _error_response(CallError("INTERNAL", f"internal error: {type(exc).__name__}"))


def _json(value: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(value, status=status, headers=headers, dumps=json_text)


def _call_metadata(request: web.Request) -> CallMetadata:
    """The request's `a3s-*` headers, as the call's metadata."""
    return CallMetadata(
        {name.lower(): value for name, value in request.headers.items() if name.lower().startswith("a3s-")}
    )


def _stream_metadata(request: web.Request) -> CallMetadata:
    """A stream's metadata: its `Last-Event-ID` is its cursor (`a3s-after-seq`) too."""
    metadata = _call_metadata(request)
    last_event_id = request.headers.get("Last-Event-ID", "").strip()
    if last_event_id:
        try:
            cursor = str(seq_number(last_event_id, "Last-Event-ID"))
        except InvalidArgument as exc:
            raise CallError("INVALID_ARGUMENT", str(exc)) from None
        if metadata.given.get(AFTER_SEQ_KEY, cursor).strip() != cursor:
            raise CallError(
                "INVALID_ARGUMENT", f"Last-Event-ID and {AFTER_SEQ_KEY} name different cursors: send one"
            )
        metadata.given = {**metadata.given, AFTER_SEQ_KEY: cursor}
    return metadata


class _EventStream:
    """Server-sent events on a prepared response, with a keep-alive comment every KEEPALIVE_S."""

    def __init__(self, response: web.StreamResponse, request: web.Request) -> None:
        self._response = response
        self._transport = request.transport
        self._lock = asyncio.Lock()
        self._keepalive = asyncio.create_task(self._beat())

    async def send(self, data: dict[str, Any], event: str | None = None, seq: str | None = None) -> None:
        head = (f"id: {seq}\n" if seq else "") + (f"event: {event}\n" if event else "")
        await self._write(f"{head}data: {json_text(data)}\n\n".encode())

    async def _write(self, frame: bytes) -> None:
        async with self._lock:
            await written(self._response.write(frame), self._transport)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            await self._write(b": keepalive\n\n")

    async def close(self) -> None:
        self._keepalive.cancel()
        with suppress(asyncio.CancelledError, ConnectionError):
            await self._keepalive


async def _sse(
    request: web.Request,
    replies: AsyncGenerator[dict[str, Any], None],
    readiness: Readiness,
    cursor: Cursor | None,
) -> web.StreamResponse:
    """Serve a stream of replies (their JSON) as server-sent events, driven from this one task;
    `cursor` (a resumable stream's) gives each its `id:`. A stream the server's stop cancels ends
    with an UNAVAILABLE `event: error` saying so."""
    seq = cursor or (lambda reply: "")
    try:
        first: dict[str, Any] | None = await anext(replies)  # a failure here is a plain error response
    except StopAsyncIteration:
        first = None
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    events = _EventStream(response, request)
    try:
        if first is not None:
            await events.send(first, seq=seq(first))
            async for reply in replies:
                await events.send(reply, seq=seq(reply))
        await events.send({}, "done")
    except CallError as exc:
        with suppress(ConnectionError):
            await events.send({"error": exc.to_json()}, "error")
    except StalledClient as exc:
        log.warning("closed the event stream of %s %s: %s", request.method, request.path, exc)
    except ConnectionError:
        pass  # the client went away; closing the stream below stops the call
    except asyncio.CancelledError:
        if not readiness.took_back_stop():
            raise
        stopped = CallError("UNAVAILABLE", readiness.stop_message)
        with suppress(ConnectionError):
            await events.send({"error": stopped.to_json()}, "error")
    finally:
        await events.close()
        await replies.aclose()
    return response


class RestApi:
    """The REST routes over one Application."""

    def __init__(self, app: Application, readiness: Readiness) -> None:
        self._app = app
        self._readiness = readiness

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/healthz", self.healthz),
            web.get("/health", self.health),
            web.get("/capabilities", self.capabilities),
            web.post("/sessions", self.create_session),
            web.get("/sessions", self.list_sessions),
            web.get("/sessions/{id}", self.get_session),
            web.delete("/sessions/{id}", self.destroy_session),
            web.post("/sessions/{id}/generate", self._on_session("Generate")),
            web.post("/sessions/{id}/generate/stream", self.stream_generate),
            web.get("/sessions/{id}/generate/stream", self.stream_generate_get),
            web.post("/sessions/{id}/tools/{name}", self.execute_tool),
            web.get("/sessions/{id}/events", self.events),
            web.post("/sessions/{id}/cancel", self._on_session("Cancel")),
            web.post("/sessions/{id}/pause", self._on_session("Pause")),
            web.post("/sessions/{id}/resume", self._on_session("Resume")),
            web.post("/sessions/{id}/confirmations/{tool_id}", self._on_session("ConfirmToolExecution")),
            web.post("/rpc/{method}", self.rpc),
        ]

    async def _call(
        self, name: str, params: object, request: web.Request, **fields: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A unary RPC from JSON to JSON, and the reply's metadata as headers; `fields` are path
        parameters, the request's `a3s-*` headers the call's metadata."""
        method = find_method(name)
        metadata = _call_metadata(request)
        reply = await method.call(self._app, parse(method, params, **fields), metadata)
        return reply, dict(metadata.reply)

    async def _reply(self, name: str, params: object, request: web.Request, **fields: str) -> web.Response:
        reply, headers = await self._call(name, params, request, **fields)
        return _json(reply, headers=headers)

    async def _stream(self, request: web.Request, params: object, **fields: str) -> web.StreamResponse:
        return await self._serve_stream(request, find_method("StreamGenerate"), params, **fields)

    async def _serve_stream(
        self, request: web.Request, method: Method, params: object, **fields: str
    ) -> web.StreamResponse:
        replies = method.stream(self._app, parse(method, params, **fields), _stream_metadata(request))
        return await _sse(request, replies, self._readiness, method.cursor)

    async def healthz(self, request: web.Request) -> web.Response:
        """A probe for load balancers and Box: not an RPC, so it logs nothing."""
        phase = self._readiness.phase
        if phase is not Phase.READY:
            return _json({"status": "starting" if phase is Phase.STARTING else "shutting_down"}, 503)
        health = self._app.lifecycle.health()
        return _json(
            {
                "status": "ok",
                "version": health.version,
                "uptime_s": round(health.uptime_s, 1),
                "sessions": health.sessions,
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return await self._reply("HealthCheck", {}, request)

    async def capabilities(self, request: web.Request) -> web.Response:
        return await self._reply("GetCapabilities", {}, request)

    async def create_session(self, request: web.Request) -> web.Response:
        reply, headers = await self._call("CreateSession", await json_body(request), request)
        return _json(reply, 201, {**headers, "Location": f"/sessions/{reply['session_id']}"})

    async def list_sessions(self, request: web.Request) -> web.Response:
        return await self._reply("ListSessions", {}, request)

    async def get_session(self, request: web.Request) -> web.Response:
        """GetSession, and the session's `parent` and `children` (subagents: convert.lineage)."""
        session_id = request.match_info["id"]
        reply, headers = await self._call("GetSession", {}, request, session_id=session_id)
        with suppress(NotFound):  # destroyed since: as it was
            subagents = self._app.subagents
            reply["session"].update(
                convert.lineage(subagents.parent(session_id), subagents.children(session_id))
            )
        return _json(reply, headers=headers)

    async def destroy_session(self, request: web.Request) -> web.Response:
        return await self._reply("DestroySession", {}, request, session_id=request.match_info["id"])

    def _on_session(self, name: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        """The handler of a POST route under /sessions/{id}/ for the unary RPC `name`: the body
        (none is `{}`) is its request, its session_id (and any other path parameter, by its
        field's name) from the path."""

        async def handle(request: web.Request) -> web.Response:
            path = {"session_id" if key == "id" else key: value for key, value in request.match_info.items()}
            return await self._reply(name, await json_body(request), request, **path)

        return handle

    async def stream_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, await json_body(request), session_id=request.match_info["id"])

    async def stream_generate_get(self, request: web.Request) -> web.StreamResponse:
        """GET for EventSource clients: one user message in `?content=`; POST for everything else."""
        unknown = sorted(set(request.query) - {"content"})
        if unknown or "content" not in request.query:
            raise CallError(
                "INVALID_ARGUMENT",
                "GET .../generate/stream takes only ?content=<the user message>"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
                + "; POST a GenerateRequest for more",
            )
        body = {"messages": [{"role": "ROLE_USER", "content": request.query["content"]}]}
        return await self._stream(request, body, session_id=request.match_info["id"])

    async def execute_tool(self, request: web.Request) -> web.Response:
        arguments = await json_body(request)
        if not isinstance(arguments, dict):
            raise CallError("INVALID_ARGUMENT", "the body must be the tool's arguments as a JSON object")
        path = request.match_info
        return await self._reply(
            "ExecuteTool",
            {},
            request,
            session_id=path["id"],
            tool_name=path["name"],
            arguments=json.dumps(arguments),
        )

    async def events(self, request: web.Request) -> web.Response:
        session_id = request.match_info["id"]
        page = events_page(self._app, session_id, request.query)
        return _json(await unary_call("EventsPage", session_id, page))

    async def rpc(self, request: web.Request) -> web.StreamResponse:
        method = find_method(request.match_info["method"])
        if method.streaming:
            return await self._serve_stream(request, method, await json_body(request))
        message = parse(method, await json_body(request))
        metadata = _call_metadata(request)
        reply = await method.call(self._app, message, metadata)
        return _json(reply, headers=dict(metadata.reply))


def build_app(
    app: Application,
    guard: RequestGuard,
    refusals: RefusalLog,
    readiness: Readiness,
    auth_token: str,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
) -> web.Application:
    """The application over `app`; `extra_routes` (e.g. a RouteTableDef) are served next to ours.

    The guard runs before the token check (none without `auth_token`), so that a browser's
    preflight (which never carries the token) is answered, and a refused origin is refused
    whatever it sends. The readiness gate runs last: only a caller who passed both learns that
    the server is starting or stopping."""
    probes = Probes(readiness)
    web_app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[
            *([traced] if telemetry.enabled() else []),  # first: every request's span, refusals too
            _errors,
            _connection,
            harness_errors,
            guard.middleware,
            *([http_middleware(auth_token, refusals)] if auth_token else []),
            probes.middleware,
        ],
    )
    web_app.on_response_prepare.append(guard.on_response_prepare)
    sockets = WebSocketFace(app, MAX_BODY_BYTES)
    web_app.add_routes([*RestApi(app, readiness).routes(), *probes.routes(), web.get("/ws", sockets.handle)])
    web_app.add_routes(HarnessApi(app.harness).routes())  # the A3S harness protocol (harness.py)
    web_app.add_routes(CheckpointRoutes(app).routes())  # checkpoints, rewind, fork (checkpoints.py)
    web_app.add_routes(SteerRoutes(app).routes())  # steering a running generation (steering.py)
    web_app.add_routes(extra_routes)
    web_app.on_shutdown.append(sockets.close_all)
    return web_app
