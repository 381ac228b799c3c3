"""Both A3S dialects on one port: which one each call speaks (a3s-string-dialect.md 2.5), and the
handlers of the RPCs whose requests differ (2.1), which decide from the request's bytes.

The order: the operator's `--a3s-dialect box|later` (A3S_DIALECT) for every call; else the
request's bytes (dialect.py), remembered for the connection (`context.peer()`: one connection is
one generated client); else what the connection last sent; else the client hint (the TypeScript
SDK's `grpc-node-js/` user-agent means later); else nothing, which is Box, except that an
undecided Generate answers dialect-neutral. A later request is converted to the Box request it
means and handled by the one servicer method; the reply is converted back (later_convert.py)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message

from ...app.types import A3S_DIALECTS
from ...base.errors import InvalidArgument
from ...proto import code_agent_later_pb2 as lp
from ..status import MAX_MESSAGE_CHARS, shortened
from . import dialect, later_convert
from .dialect import BOX, LATER, Dialect
from .errors import INLINE_DECODE_BYTES, decoding
from .handlers import same_shape

MAX_PEERS = 4096
"""Connections whose dialect is remembered, the least recently seen forgotten first."""
LATER_USER_AGENT = "grpc-node-js/"
"""@grpc/grpc-js, which the TypeScript SDK (the one later-dialect gRPC client known) uses."""

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


@dataclass(frozen=True)
class Way:
    """How one RPC whose dialects differ is decided and converted."""

    scan: Callable[[bytes], Dialect | None]
    later_request: type[Message]
    to_box: Callable[[Any], Message]
    reply: Callable[[Any], Message | None] | None = None
    """Box reply (or stream item) to later, a stream item None when later clients do not get it;
    None: the same bytes in both dialects."""
    neutral: Callable[[Any], Message] | None = None
    """Box reply to one both dialects decode, for an undecided request; None: Box's."""


DECIDING = {
    "Generate": Way(
        dialect.generate_dialect,
        lp.GenerateRequest,
        later_convert.generate_request,
        later_convert.generate_response,
        later_convert.neutral_response,
    ),
    "StreamGenerate": Way(
        dialect.generate_dialect, lp.GenerateRequest, later_convert.generate_request, later_convert.chunk
    ),
    "GenerateStructured": Way(
        dialect.structured_dialect, lp.GenerateStructuredRequest, later_convert.structured_request
    ),
    "StreamGenerateStructured": Way(
        dialect.structured_dialect,
        lp.GenerateStructuredRequest,
        later_convert.structured_request,
        later_convert.structured_chunk,
    ),
    "CreateSession": Way(
        dialect.create_session_dialect, lp.CreateSessionRequest, later_convert.create_session_request
    ),
    "Initialize": Way(dialect.initialize_dialect, lp.InitializeRequest, later_convert.initialize_request),
}
"""The RPCs that need a decision (2.1), by name."""


class Dialects:
    """The dialect of each call: forced by the operator (`mode` box or later) or, in `auto`, from
    the request, the connection's memory and the client hint."""

    def __init__(self, mode: str) -> None:
        if mode not in A3S_DIALECTS:
            raise ValueError(f"the dialect must be one of {', '.join(A3S_DIALECTS)}, not {mode!r}")
        self.forced: Dialect | None = BOX if mode == "box" else LATER if mode == "later" else None
        self._peers: OrderedDict[str, Dialect] = OrderedDict()

    def known(self, context: grpc.aio.ServicerContext) -> Dialect | None:
        """What this call's connection speaks, as far as anything says (None: nothing does)."""
        if self.forced is not None:
            return self.forced
        peer = context.peer()
        remembered = self._peers.get(peer)
        if remembered is not None:
            self._peers.move_to_end(peer)
            return remembered
        for key, value in context.invocation_metadata() or ():
            if key == "user-agent" and value.startswith(LATER_USER_AGENT):
                return LATER
        return None

    def is_later(self, context: grpc.aio.ServicerContext) -> bool:
        return self.known(context) == LATER

    def _remember(self, context: grpc.aio.ServicerContext, decided: Dialect) -> None:
        peer = context.peer()
        self._peers[peer] = decided
        self._peers.move_to_end(peer)
        if len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)

    async def _decide(
        self, way: Way, raw: bytes, context: grpc.aio.ServicerContext, name: str
    ) -> Dialect | None:
        """The request's dialect (remembered), else the connection's; bytes that cannot be
        scanned or mix the dialects end the call with INVALID_ARGUMENT."""
        if self.forced is not None:
            return self.forced
        try:
            if len(raw) > INLINE_DECODE_BYTES:
                decided = await asyncio.to_thread(way.scan, raw)
            else:
                decided = way.scan(raw)
        except dialect.Mixed as exc:
            await _invalid(context, str(exc))
        except dialect.Malformed as exc:
            await _invalid(context, f"the request is not a valid {name}: {exc}")
        if decided is None:
            return self.known(context)
        self._remember(context, decided)
        return decided

    def remembering(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` of a later-only RPC, which also marks its connection as later."""

        def mark(context: grpc.aio.ServicerContext) -> None:
            if self.forced is None:
                self._remember(context, LATER)

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            mark(context)
            return await handler.unary_unary(request, context)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            mark(context)
            async for item in handler.unary_stream(request, context):
                yield item

        return same_shape(handler, unary, stream)

    def deciding(
        self, name: str, behavior: Behavior, box_request: type[Message], streaming: bool
    ) -> Behavior:
        """The bytes-in behaviour of the deciding RPC `name`, around the servicer's `behavior`."""
        way = DECIDING[name]
        request_name = box_request.DESCRIPTOR.full_name
        box = decoding(behavior, box_request, streaming)
        later = decoding(_later(way, behavior, streaming), way.later_request, streaming)
        neutral = (
            box if way.neutral is None else decoding(_neutral(way.neutral, behavior), box_request, False)
        )

        async def pick(raw: bytes, context: grpc.aio.ServicerContext) -> Behavior:
            chosen = await self._decide(way, raw, context, request_name)
            return later if chosen == LATER else box if chosen == BOX else neutral

        if streaming:

            async def stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for item in (await pick(raw, context))(raw, context):
                    yield item

            return stream

        async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            return await (await pick(raw, context))(raw, context)

        return unary


def _later(way: Way, behavior: Behavior, streaming: bool) -> Behavior:
    """`behavior` taking the later request and answering in the later dialect."""
    reply = way.reply

    async def to_box(request: Any, context: grpc.aio.ServicerContext) -> Message:
        try:
            if request.ByteSize() > INLINE_DECODE_BYTES:  # as errors.decoding does
                return await asyncio.to_thread(way.to_box, request)
            return way.to_box(request)
        except InvalidArgument as exc:
            await _invalid(context, str(exc))

    if streaming:

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in behavior(await to_box(request, context), context):
                later = item if reply is None else reply(item)
                if later is not None:
                    yield later

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        answer = await behavior(await to_box(request, context), context)
        return answer if reply is None else reply(answer)

    return unary


def _neutral(neutral: Callable[[Any], Message], behavior: Behavior) -> Behavior:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        return neutral(await behavior(request, context))

    return unary


async def _invalid(context: grpc.aio.ServicerContext, message: str) -> NoReturn:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, shortened(message, MAX_MESSAGE_CHARS))
    raise AssertionError("unreachable: abort raises")
