"""The HTTP face's errors: CallError (a status by its gRPC code name, with the HTTP status it
answers with) and the wrappers that end each RPC call as the gRPC face would, one log line per call
(DISCONNECTED when its connection closed first)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from aiohttp import web

from ...app.types import Resync
from ...base.log_lines import note_session
from ..status import DISCONNECTED, MAX_MESSAGE_CHARS, call_log, failure, log_call, shortened

T = TypeVar("T")

# Status → HTTP status: the google.rpc.Code mapping (the one grpc-gateway uses), except that
# FAILED_PRECONDITION is 409: the request was fine but the state is not (no LLM configured, session
# paused), so the same request can succeed once the state is fixed. CANCELLED (a Cancel call stopped
# the generation) is 499, as in google.rpc.
HTTP_STATUS: dict[str, int] = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 409,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}


class CallError(Exception):
    """A call that ended with a status other than OK; `code` is the status's name (NOT_FOUND)."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def to_json(self) -> dict[str, Any]:
        """The `error` object of an HTTP or WebSocket reply."""
        return {"code": self.code, "message": self.message, "details": self.details}


def _ended(exc: BaseException, method: str) -> CallError:
    """The CallError a failed call answers with (as the gRPC face's status and message)."""
    code, message = failure(exc)
    if code == "INTERNAL":
        call_log.error("rpc %s failed unexpectedly", method, exc_info=exc)
    details = {"oldest_seq": exc.oldest} if isinstance(exc, Resync) else None
    return CallError(code, shortened(message, MAX_MESSAGE_CHARS), details)


connection_closed: ContextVar[Callable[[], bool] | None] = ContextVar("connection_closed", default=None)
"""Whether the connection of the call running in this context has closed: set for each request
(app.py) and each WebSocket call (ws.py). A call cancelled once it has is logged DISCONNECTED."""


def _code_of(exc: BaseException) -> str:
    if isinstance(exc, CallError):
        return exc.code
    if isinstance(exc, GeneratorExit):  # its reader closed the stream: the client went away
        return DISCONNECTED
    if isinstance(exc, asyncio.CancelledError):
        closed = connection_closed.get()
        return DISCONNECTED if closed is not None and closed() else "CANCELLED"  # else the server's stop
    return failure(exc)[0]


async def unary_call(method: str, session_id: str, call: Awaitable[T]) -> T:
    """Await one unary call: a failure is CallError; cancellations pass through."""
    started = time.perf_counter()
    note_session(session_id)  # each request and WebSocket call runs in a task of its own
    code = "OK"
    try:
        return await call
    except BaseException as exc:
        code = _code_of(exc)
        # aiohttp's own refusals (a body over the size limit: 413) keep their status (app.py _errors).
        if isinstance(exc, CallError | web.HTTPException) or not isinstance(exc, Exception):
            raise
        raise _ended(exc, method) from exc
    finally:
        log_call(method, session_id, started, code)


async def stream_call(method: str, session_id: str, replies: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """The replies of one streaming call, as `unary_call` ends a unary one."""
    started = time.perf_counter()
    note_session(session_id)  # each request and WebSocket call runs in a task of its own
    code = "OK"
    try:
        async for reply in replies:
            yield reply
    except BaseException as exc:
        code = _code_of(exc)
        if isinstance(exc, CallError) or not isinstance(exc, Exception):
            raise
        raise _ended(exc, method) from exc
    finally:
        log_call(method, session_id, started, code)
