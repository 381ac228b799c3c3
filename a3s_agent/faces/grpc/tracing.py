"""A server span per call of the service's methods (both dialects share the method paths), under
the caller's W3C trace context from the call's metadata; added only when tracing is on
(base/telemetry.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from ...base import telemetry
from .handlers import ServiceInterceptor, behavior_of, same_shape


class TracingInterceptor(ServiceInterceptor):
    def guard(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        behavior = behavior_of(handler)
        name = details.method.lstrip("/")
        service, _, method = name.rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        carrier = {key: value for key, value in details.invocation_metadata or () if isinstance(value, str)}

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with telemetry.span(name, attributes, kind="server", carrier=carrier):
                return await behavior(request, context)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            # grpc runs each call in a task of its own: the span is current in it until the end.
            with telemetry.span(name, attributes, kind="server", carrier=carrier):
                async for reply in behavior(request, context):
                    yield reply

        return same_shape(handler, unary, stream)
