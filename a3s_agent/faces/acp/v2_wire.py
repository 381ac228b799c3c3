"""ACP v2's JSON-RPC connection (schema 2.0.0-alpha.5): the Python ACP SDK speaks v1 only, so a
client that negotiates v2 at `initialize` is served here, on the same stdio transport
(stdio.py): requests dispatched to the v2 agent (v2.py) each in its own task, their answers and
errors written back, and the agent's own requests to the client (`session/request_permission`)
answered by id. Domain errors keep the codes the v1 face answers with (errors.py)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ...base.errors import AgentError
from ..status import MAX_MESSAGE_CHARS, shortened, status_name
from .errors import CODES, INTERNAL
from .stdio import StdioTransport

log = logging.getLogger(__name__)

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


class RpcError(Exception):
    """A JSON-RPC error answer: its code, message and data."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class Connection:
    """One client's JSON-RPC over `transport`: `handlers` by method name answer its requests
    (a handler returning None for a notification), `request` asks the client."""

    def __init__(self, transport: StdioTransport, handlers: Mapping[str, Handler]) -> None:
        self._transport = transport
        self._handlers = handlers
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, first: dict[str, Any]) -> None:
        """Answer `first` and every message after it until the client's end."""
        message: dict[str, Any] | None = first
        while message is not None:
            self._take(message)
            message = await self._transport.receive()

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def request(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Ask the client; its result, RpcError for its error, TimeoutError past `timeout_s`."""
        request_id = next(self._ids)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return await asyncio.wait_for(answer, timeout_s)
        finally:
            self._waiting.pop(request_id, None)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for answer in self._waiting.values():
            answer.cancel()

    def _take(self, message: dict[str, Any]) -> None:
        if "method" not in message:  # an answer to one of our requests
            answer = self._waiting.get(message.get("id"))  # type: ignore[arg-type]
            if answer is not None and not answer.done():
                if isinstance(message.get("error"), dict):
                    error = message["error"]
                    answer.set_exception(
                        RpcError(int(error.get("code", INTERNAL)), str(error.get("message")))
                    )
                else:
                    answer.set_result(message.get("result") or {})
            return
        task = asyncio.create_task(self._answer(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, message: dict[str, Any]) -> None:
        method, request_id = message.get("method"), message.get("id")
        params = message.get("params")
        try:
            handler = self._handlers.get(method) if isinstance(method, str) else None
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"method not found: {str(method)[:100]}")
            if params is not None and not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            result = await handler(params or {})
            reply: dict[str, Any] = {"result": result if result is not None else {}}
        except RpcError as exc:
            reply = {"error": _error(exc.code, exc.message, exc.data)}
        except ValidationError as exc:
            reply = {"error": _error(INVALID_PARAMS, _invalid(exc), {"status": "INVALID_ARGUMENT"})}
        except AgentError as exc:
            reply = {"error": domain_error(exc)}
        except Exception:
            log.exception("ACP v2 %s failed", method)
            reply = {"error": _error(INTERNAL, "internal error")}
        if request_id is not None:
            await self._send({"jsonrpc": "2.0", "id": request_id, **reply})

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._transport.send(message)
        except OSError as exc:
            log.warning("the client's pipe is closed: %s", exc)


def domain_error(exc: AgentError) -> dict[str, Any]:
    """A domain error as a JSON-RPC error object: the v1 face's code, its status name in `data`."""
    name = status_name(exc)
    return _error(CODES.get(name, INTERNAL), str(exc), {"status": name})


def _error(code: int, message: str, data: object = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": shortened(message, MAX_MESSAGE_CHARS)}
    if data is not None:
        error["data"] = data
    return error


def _invalid(exc: ValidationError) -> str:
    """The first fault of the params, naming its field."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "params"
    return f"{where}: {first['msg']}"
