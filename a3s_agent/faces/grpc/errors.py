"""One wrapper per RPC: maps domain errors to status codes and logs one line per call."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from ...base.log_lines import note_session
from ..call_metadata import error_metadata
from ..status import DISCONNECTED, MAX_MESSAGE_CHARS, call_log, failure, log_call, shortened, status_name


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status a domain error maps to (see faces/status.py)."""
    return grpc.StatusCode[status_name(exc)]


def _status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    name, message = failure(exc)
    return grpc.StatusCode[name], message


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> str:
    """The status name the call's log line gives."""
    if isinstance(exc, grpc.aio.AbortError):
        return (context.code() or grpc.StatusCode.UNKNOWN).name
    if isinstance(exc, GeneratorExit) or (isinstance(exc, asyncio.CancelledError) and not exc.args):
        return DISCONNECTED  # the client cancelled or went away (grpc cancels its task without a reason)
    if isinstance(exc, asyncio.CancelledError):  # the server's stop, which gives its reason
        return grpc.StatusCode.CANCELLED.name
    return _status_for(exc)[0].name


async def _raise(exc: BaseException, method: str, context: grpc.aio.ServicerContext) -> NoReturn:
    """End the call: aborts and cancellations pass through, everything else becomes a status."""
    if isinstance(exc, (grpc.aio.AbortError, asyncio.CancelledError)) or not isinstance(exc, Exception):
        raise exc
    code, message = _status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        call_log.error("rpc %s failed unexpectedly", method, exc_info=exc)
    await context.abort(code, shortened(message, MAX_MESSAGE_CHARS), tuple(error_metadata(exc)))
    raise AssertionError("unreachable: abort raises")


def _finish(method: str, request: Any, started: float, code: str) -> None:
    log_call(method, getattr(request, "session_id", ""), started, code)


def rpc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a unary or server-streaming servicer method (plain try/except: this is the hot path)."""
    method = fn.__name__

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            note_session(getattr(request, "session_id", ""))
            code = "OK"
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
        note_session(getattr(request, "session_id", ""))
        code = "OK"
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
