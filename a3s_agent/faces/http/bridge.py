"""Calling CodeAgentService from HTTP and WebSocket: JSON in, the same servicer methods, JSON out.

Bodies and replies are the proto messages' JSON forms with the proto (snake_case) field names,
so a grpcurl user's JSON works unchanged (`ParseDict` also accepts the camelCase names). Replies
include fields left at their default (`"success": false` is not dropped).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.message import Message

from ...proto import code_agent_pb2 as pb
from ..grpc.service import CodeAgentService

Code = grpc.StatusCode

# gRPC status → HTTP status: the google.rpc.Code mapping (the one grpc-gateway uses), except that
# FAILED_PRECONDITION is 409: the request was fine but the state is not (no LLM configured, session
# paused), so the same request can succeed once the state is fixed. CANCELLED (a Cancel call stopped
# the generation) is 499, as in google.rpc.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 409,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


class CallError(grpc.aio.AbortError):
    """A call that ended with a status other than OK.

    An AbortError, because the context shim's `abort` raises it and the `rpc` wrapper must see
    what grpc.aio's own abort raises: an abort that passes through, not a new failure.
    """

    def __init__(self, code: grpc.StatusCode, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def to_json(self) -> dict[str, Any]:
        """The `error` object of an HTTP or WebSocket reply."""
        return {"code": self.code.name, "message": self.message, "details": self.details}


class CallContext:
    """What the servicer and its `rpc` wrapper use of a grpc.aio.ServicerContext."""

    def __init__(self) -> None:
        self._code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        self._code = code
        raise CallError(code, details)

    def code(self) -> grpc.StatusCode | None:
        return self._code


@dataclass(frozen=True)
class Method:
    name: str
    """As in the proto: `StreamGenerate`."""
    request_type: type[Message]
    streaming: bool


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


_SERVICE = pb.DESCRIPTOR.services_by_name["CodeAgentService"]
METHODS: dict[str, Method] = {
    m.name: Method(m.name, message_factory.GetMessageClass(m.input_type), m.server_streaming)
    for m in _SERVICE.methods
}
_BY_NAME = {**METHODS, **{_snake(name): method for name, method in METHODS.items()}}


def find_method(name: object) -> Method:
    """The RPC named `name`, in CamelCase (`StreamGenerate`) or snake_case (`stream_generate`)."""
    if not isinstance(name, str) or not name:
        raise CallError(Code.INVALID_ARGUMENT, "method must be a non-empty string naming an RPC")
    method = _BY_NAME.get(name)
    if method is None:
        raise CallError(
            Code.UNIMPLEMENTED,
            f"unknown method {name!r}",
            {"methods": sorted(_snake(n) for n in METHODS)},
        )
    return method


def parse(method: Method, params: object, **fields: str) -> Message:
    """`params` (a JSON object) as the request of `method`; `fields` (path parameters) set fields too."""
    type_name = method.request_type.DESCRIPTOR.name
    if not isinstance(params, dict):
        raise CallError(
            Code.INVALID_ARGUMENT, f"a {type_name} must be a JSON object, not {_json_kind(params)}"
        )
    request = method.request_type()
    try:
        json_format.ParseDict(params, request)
    except json_format.ParseError as exc:
        raise CallError(Code.INVALID_ARGUMENT, f"invalid {type_name}: {exc}") from None
    for name, value in fields.items():
        given = getattr(request, name)
        if given and given != value:
            raise CallError(
                Code.INVALID_ARGUMENT, f"{name} {given!r} in the body differs from {value!r} in the path"
            )
        setattr(request, name, value)
    return request


def as_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def json_text(value: object) -> str:
    """Compact JSON text, as every reply is sent."""
    return json.dumps(value, separators=(",", ":"))


def _json_kind(value: object) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


class Bridge:
    """Calls one CodeAgentService the way grpc.aio does, with a CallContext in place of gRPC's."""

    def __init__(self, service: CodeAgentService) -> None:
        self._service = service

    async def unary(self, method: Method, request: Message) -> Message:
        """The reply, or CallError with the status the gRPC face would have sent."""
        return await getattr(self._service, method.name)(request, CallContext())

    def stream(self, method: Method, request: Message) -> AsyncGenerator[Message, None]:
        """The replies of a server-streaming RPC; a failure is CallError, as in `unary`.

        Drive it from one task throughout, as grpc.aio does: a generation remembers the task it
        runs in, and Cancel cancels that task.
        """
        return getattr(self._service, method.name)(request, CallContext())

    async def call(self, name: str, params: object, **fields: str) -> dict[str, Any]:
        """A unary RPC from JSON to JSON."""
        method = find_method(name)
        return as_json(await self.unary(method, parse(method, params, **fields)))
