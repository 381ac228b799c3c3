"""Wrapping a grpc method handler: a behaviour of the same shape (unary or streaming) in its place,
and the base of the interceptors that guard the service's own methods."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

# Probes must work without a token or readiness: container health checks and service discovery.
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

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


def behavior_of(handler: grpc.RpcMethodHandler) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
    """The function `handler` runs, whichever of the four kinds it is."""
    if handler.response_streaming:
        return handler.unary_stream or handler.stream_stream
    return handler.unary_unary or handler.stream_unary


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


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor whose `guard` sees every call of the service's own methods, never the probes'."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        return self.guard(handler, details)

    def guard(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        """`handler` itself, or one that refuses or wraps it."""
        raise NotImplementedError
