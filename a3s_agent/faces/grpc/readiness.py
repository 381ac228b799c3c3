"""The gRPC face's side of readiness: new calls are refused with UNAVAILABLE unless the server is
ready, calls in flight are counted for the graceful stop, and a call the stop cancels ends with
UNAVAILABLE saying so. grpc.health and reflection always pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ...proto import code_agent_pb2 as pb
from ..readiness import Phase, Readiness
from .handlers import ServiceInterceptor, behavior_of, refusing, same_shape

_SERVICE = pb.DESCRIPTOR.services_by_name["CodeAgentService"].full_name
OPEN_WHILE_STOPPING = frozenset(
    f"/{_SERVICE}/{name}"
    for name in (
        "HealthCheck",  # answers STATUS_UNHEALTHY "shutting down"
        # what a generation in its grace period may still need from its client:
        "Cancel",
        "Resume",
        "ConfirmToolExecution",
        "CompleteExternalTask",
        "ListPendingExternalTasks",
    )
)


def _tracked(handler: grpc.RpcMethodHandler, readiness: Readiness) -> grpc.RpcMethodHandler:
    behavior = behavior_of(handler)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with readiness.tracking():
            try:
                return await behavior(request, context)
            except asyncio.CancelledError:
                if not readiness.took_back_stop():
                    raise
                await context.abort(grpc.StatusCode.UNAVAILABLE, readiness.stop_message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        with readiness.tracking():
            try:
                async for reply in behavior(request, context):
                    yield reply
            except asyncio.CancelledError:
                if not readiness.took_back_stop():
                    raise
                await context.abort(grpc.StatusCode.UNAVAILABLE, readiness.stop_message)

    return same_shape(handler, unary, stream)


class ReadinessInterceptor(ServiceInterceptor):
    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness

    def guard(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        phase = self._readiness.phase
        if phase is Phase.READY or (phase is Phase.STOPPING and details.method in OPEN_WHILE_STOPPING):
            return _tracked(handler, self._readiness)
        return refusing(handler, grpc.StatusCode.UNAVAILABLE, self._readiness.refusal())
