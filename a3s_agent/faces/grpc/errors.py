"""One wrapper per RPC: maps domain errors to status codes and logs one line per call."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from ...base import errors

log = logging.getLogger("a3s_agent.rpc")

# Status messages travel in metadata; clients refuse more than 16 KB by default.
MAX_MESSAGE_CHARS = 2000

STATUS_OF: dict[type[errors.AgentError], grpc.StatusCode] = {
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
}


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status a domain error maps to (INVALID_ARGUMENT for a bare AgentError)."""
    for kind in type(exc).__mro__:
        if kind in STATUS_OF:
            return STATUS_OF[kind]
    return (
        grpc.StatusCode.INVALID_ARGUMENT if isinstance(exc, errors.AgentError) else grpc.StatusCode.INTERNAL
    )


def _status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    code = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        return code, f"internal error: {type(exc).__name__}: {exc}"
    return code, str(exc)


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    if isinstance(exc, grpc.aio.AbortError):
        return context.code() or grpc.StatusCode.UNKNOWN
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # the client went away
        return grpc.StatusCode.CANCELLED
    return _status_for(exc)[0]


async def _raise(exc: BaseException, method: str, context: grpc.aio.ServicerContext) -> NoReturn:
    """End the call: aborts and cancellations pass through, everything else becomes a status."""
    if isinstance(exc, (grpc.aio.AbortError, asyncio.CancelledError)) or not isinstance(exc, Exception):
        raise exc
    code, message = _status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.error("rpc %s failed unexpectedly", method, exc_info=exc)
    await context.abort(code, shortened(message, MAX_MESSAGE_CHARS))
    raise AssertionError("unreachable: abort raises")


def shortened(text: str, limit: int) -> str:
    """At most `limit` characters: a message quoting a huge value must still fit a client's limits."""
    return (
        text if len(text) <= limit else f"{text[: limit - 30]}... [{len(text) - limit + 30} more characters]"
    )


def _finish(method: str, request: Any, started: float, code: grpc.StatusCode) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(
            "rpc %s session=%s status=%s duration_ms=%.2f",
            method,
            shortened(getattr(request, "session_id", "") or "-", 128),
            code.name,
            (time.perf_counter() - started) * 1000,
        )


def rpc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a unary or server-streaming servicer method (plain try/except: this is the hot path)."""
    method = fn.__name__

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                async for item in fn(self, request, context):
                    yield item
            except BaseException as exc:
                code = _code_of(exc, context)
                await _raise(exc, method, context)
            finally:
                _finish(method, request, started, code)

        return stream

    @functools.wraps(fn)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await fn(self, request, context)
        except BaseException as exc:
            code = _code_of(exc, context)
            await _raise(exc, method, context)
        finally:
            _finish(method, request, started, code)

    return unary


INLINE_DECODE_BYTES = 1 << 20
"""Requests bigger than this are decoded in a worker thread, so that other calls keep being answered."""


def decoding(
    behavior: Callable[..., Any], request_type: type[Message], streaming: bool
) -> Callable[..., Any]:
    """`behavior` taking the raw request bytes: undecodable ones end the call with INVALID_ARGUMENT."""

    async def decode(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            if len(raw) > INLINE_DECODE_BYTES:  # parsing holds the event loop: tens of ms on megabytes
                return await asyncio.to_thread(request_type.FromString, raw)
            return request_type.FromString(raw)
        except (DecodeError, RecursionError) as exc:
            message = f"the request is not a valid {request_type.DESCRIPTOR.full_name}: {exc or 'nested too deeply'}"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, shortened(message, MAX_MESSAGE_CHARS))

    if streaming:

        async def stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behavior(await decode(raw, context), context):
                yield item

        return stream

    async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(await decode(raw, context), context)

    return unary
