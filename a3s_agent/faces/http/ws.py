"""The WebSocket JSON form of every RPC, several calls in flight per socket.

A request is `{"method": "generate" | "Generate" | ..., "params": {<the request JSON>}, "id": ...}`.
A unary call answers `{"id", "result"}`; a streaming one answers `{"id", "result"}` per reply and
then `{"id", "done": true}`. A failure answers `{"id", "error": {"code", "message", "details"}}`
and ends that call, never the socket. Calls still running when the socket closes are cancelled,
except that a generation StreamGenerate started runs on (Cancel stops it).

A socket's requests start in the order they arrive: each one once the one before it has started
(a stream: methods.py's `started`) or, for a unary call, finished; streams then run side by side.
So a client may send create_session, subscribe_events and stream_generate at once and the
subscription sees the session and the whole generation. A unary call that waits for a later
request (a Generate waiting for a confirmation) holds the requests after it until it ends: send
that one on another socket, or use stream_generate.

StreamGenerate and SubscribeEvents resume from a cursor: `"after_seq": <seq>` next to `method`
(a whole number: the `metadata.seq` of the last chunk, the `data.seq` of the last event received),
as the gRPC face's `a3s-after-seq`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from ...app import Application
from ...base.errors import InvalidArgument
from ..call_metadata import AFTER_SEQ_KEY, seq_number
from .body import json_text, load_json
from .errors import CallError, connection_closed
from .methods import CallMetadata, Method, find_method, parse
from .stalled import StalledClient, written

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
"""Calls one socket may have running or waiting for their turn at once."""
_KEYS = {"method", "params", "id", "after_seq"}


class _Connection:
    """One socket: reads requests, runs each as a task once the one before it has started,
    writes replies as they come."""

    def __init__(
        self, socket: web.WebSocketResponse, app: Application, transport: asyncio.Transport | None
    ) -> None:
        self._socket = socket
        self._transport = transport
        self._app = app
        self._calls: set[asyncio.Task[None]] = set()
        self._closed = False
        self._last_started = asyncio.Event()  # the last request's: the next one starts once it is set
        self._last_started.set()

    async def serve(self) -> None:
        try:
            async for frame in self._socket:
                if frame.type is WSMsgType.TEXT:
                    await self._dispatch(frame.data)
                elif frame.type is WSMsgType.BINARY:
                    await self._reply_error(
                        None, CallError("INVALID_ARGUMENT", "send requests as JSON text frames")
                    )
        finally:
            self._closed = True
            for call in self._calls:
                call.cancel()
            await asyncio.gather(*self._calls, return_exceptions=True)

    async def _dispatch(self, text: str) -> None:
        request_id: Any = None
        try:
            envelope = load_json(text, "the message")
            if not isinstance(envelope, dict):
                raise CallError("INVALID_ARGUMENT", 'a message is a JSON object: {"method", "params", "id"}')
            request_id = envelope.get("id")
            unknown = sorted(set(envelope) - _KEYS)
            if unknown:
                raise CallError(
                    "INVALID_ARGUMENT",
                    f"unknown keys {', '.join(unknown)}; a message has method, params, id and after_seq",
                )
            method = find_method(envelope.get("method"))
            params = envelope.get("params")
            request = parse(method, {} if params is None else params)
            metadata = _metadata(method, envelope.get("after_seq"))
            if len(self._calls) >= MAX_IN_FLIGHT:
                raise CallError("RESOURCE_EXHAUSTED", f"{MAX_IN_FLIGHT} calls are in flight on this socket")
        except CallError as exc:
            await self._reply_error(request_id, exc)
            return
        after, self._last_started = self._last_started, asyncio.Event()
        call = asyncio.create_task(
            self._run(request_id, method, request, metadata, after, self._last_started)
        )
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)

    async def _run(
        self,
        request_id: Any,
        method: Method,
        request: dict[str, Any],
        metadata: CallMetadata,
        after: asyncio.Event,
        started: asyncio.Event,
    ) -> None:
        """One call, driven from this one task (see Method.stream): it starts once `after` is set,
        and sets `started` once it has started (a stream) or ended."""
        connection_closed.set(lambda: self._closed)
        try:
            await after.wait()
            if method.streaming:
                async for reply in method.stream(self._app, request, metadata, started.set):
                    await self._send({"id": request_id, "result": reply})
                await self._send({"id": request_id, "done": True})
            else:
                reply = await method.call(self._app, request)
                await self._send({"id": request_id, "result": reply})
        except CallError as exc:
            await self._reply_error(request_id, exc)
        except ConnectionError:
            pass  # the socket closed under us; serve() cancels what is left
        except Exception as exc:
            log.error("websocket call %s failed unexpectedly", method.name, exc_info=exc)
            await self._reply_error(
                request_id, CallError("INTERNAL", f"internal error: {type(exc).__name__}")
            )
        finally:
            started.set()

    async def _reply_error(self, request_id: Any, error: CallError) -> None:
        try:
            await self._send({"id": request_id, "error": error.to_json()})
        except ConnectionError:
            pass

    async def _send(self, payload: dict[str, Any]) -> None:
        try:
            await written(self._socket.send_str(json_text(payload)), self._transport)
        except StalledClient as exc:
            if not self._closed:
                log.warning("closed a WebSocket: %s", exc)
            self._closed = True
            raise


def _metadata(method: Method, after_seq: object) -> CallMetadata:
    """The call's cursor, as the metadata `a3s-after-seq` of the other faces."""
    if after_seq is None:
        return CallMetadata()
    if method.cursor is None:
        raise CallError(
            "INVALID_ARGUMENT", f"after_seq is for StreamGenerate and SubscribeEvents, not {method.name}"
        )
    try:  # a JSON number's text is its digits; a string, a fraction or true is refused
        cursor = seq_number(json_text(after_seq), "after_seq")
    except InvalidArgument as exc:
        raise CallError("INVALID_ARGUMENT", str(exc)) from None
    return CallMetadata({AFTER_SEQ_KEY: str(cursor)})


class WebSocketFace:
    """The /ws handler; keeps its sockets so that a shutdown can close them."""

    def __init__(self, app: Application, max_message_bytes: int) -> None:
        self._app = app
        self._max_message_bytes = max_message_bytes
        self._sockets: set[web.WebSocketResponse] = set()

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(heartbeat=30.0, max_msg_size=self._max_message_bytes)
        await socket.prepare(request)
        self._sockets.add(socket)
        try:
            await _Connection(socket, self._app, request.transport).serve()
        finally:
            self._sockets.discard(socket)
        return socket

    async def close_all(self, app: web.Application) -> None:
        """At shutdown: tell every client we are going away (their calls are cancelled)."""
        for socket in tuple(self._sockets):
            await socket.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")
