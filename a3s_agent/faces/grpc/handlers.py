"""Wrapping a grpc method handler: a behaviour of the same shape (unary or streaming) in its place."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def same_shape(
    handler: grpc.RpcMethodHandler,
    unary: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    stream: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]],
) -> grpc.RpcMethodHandler:
    """A handler like `handler` (same streaming kinds and codecs) running `unary` or `stream`."""
    make = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
    return make(
        stream if handler.response_streaming else unary,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def refusing(
    handler: grpc.RpcMethodHandler,
    code: grpc.StatusCode,
    message: str,
    before: Callable[[grpc.aio.ServicerContext], None] | None = None,
) -> grpc.RpcMethodHandler:
    """A handler like `handler` that only ends the call with `code` (after `before`, e.g. logging)."""

    async def refuse(context: grpc.aio.ServicerContext) -> None:
        if before is not None:
            before(context)
        await context.abort(code, message)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse(context)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await refuse(context)
        yield  # pragma: no cover - makes this an async generator

    return same_shape(handler, unary, stream)
