"""One wrapper per RPC: maps domain errors to status codes and logs one line per call."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from ...core import errors

log = logging.getLogger("a3s_agent.rpc")

STATUS_OF: dict[type[errors.AgentError], grpc.StatusCode] = {
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
}


def _status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    for kind in type(exc).__mro__:
        if kind in STATUS_OF:
            return STATUS_OF[kind], str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def _session_of(request: Any) -> str:
    return getattr(request, "session_id", "") or "-"


def _finish(method: str, request: Any, started: float, code: grpc.StatusCode) -> None:
    log.info(
        "rpc %s session=%s status=%s duration_ms=%.2f",
        method,
        _session_of(request),
        code.name,
        (time.perf_counter() - started) * 1000,
    )


@asynccontextmanager
async def _guarded(method: str, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    started = time.perf_counter()
    code = grpc.StatusCode.OK
    try:
        yield
    except grpc.aio.AbortError:
        code = context.code() or grpc.StatusCode.UNKNOWN
        raise
    except asyncio.CancelledError:
        code = grpc.StatusCode.CANCELLED
        raise
    except Exception as exc:
        code, message = _status_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("rpc %s failed unexpectedly", method)
        await context.abort(code, message)
    finally:
        _finish(method, request, started, code)


def rpc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a unary or server-streaming servicer method."""
    method = fn.__name__

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with _guarded(method, request, context):
                async for item in fn(self, request, context):
                    yield item

        return stream

    @functools.wraps(fn)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with _guarded(method, request, context):
            return await fn(self, request, context)

    return unary
