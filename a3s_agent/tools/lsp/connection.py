"""A language server as a contained tool process, spoken to in JSON-RPC over its stdin and stdout.

The process is started as a call scope of its own (tools/containment.py), like an MCP stdio server:
sandboxed for its workspace with the network off, in its own session and cgroup, killed with its
whole tree when the connection closes, the server stops, or a crashed server's successor starts.

Requests carry a bounded wait (a server that does not answer in time is sent `$/cancelRequest` and
the caller gets Unavailable); what the server asks of us (its configuration, progress tokens,
capability registrations) is answered at once; its notifications go to `on_notification`. What it
writes to stderr is kept (the last few KB) to say why it died.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from lsprotocol import converters

from ...base.errors import Unavailable
from .. import containment
from ..environment import tool_environment
from ..sandbox import Place
from ..stdio_server import exit_reason, keep_tail, open_server
from .framing import FramingError, frame, read_message

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""The largest message a server may send; a larger one ends the connection."""
EXIT_GRACE_S = 2.0
"""After `shutdown` and `exit`: how long the server may take to exit before it is killed."""

CONVERTER = converters.get_converter()
"""lsprotocol's converter: JSON values to its typed messages and back."""

Answer = TypeVar("Answer")
Notification = Callable[[str, Any], Awaitable[None]]


class Connection:
    """One running language server: its process, its pending requests, why it ended."""

    def __init__(self, name: str, process: Process, on_notification: Notification) -> None:
        self.name = name
        self.process = process
        self.on_notification = on_notification
        self.workspace_folders: list[dict[str, str]] = []
        self.stderr = bytearray()
        self.problem = ""  # why we ended the connection ourselves
        self.said_hello = False  # it completed the handshake: it is asked to exit before it is killed
        self.ended = anyio.Event()  # its output closed: the server is gone (or going)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[anyio.Event, list[Any]]] = {}
        self._writing = anyio.Lock()

    # --- calls --------------------------------------------------------------------------------

    async def request(self, method: str, params: Any, answer: type[Answer], timeout_s: float) -> Answer:
        """Send request `method` (params: an lsprotocol value or plain JSON) and wait up to
        `timeout_s` for its response, structured as lsprotocol's `answer` response type.
        Unavailable when the server ended, answered with an error or did not answer in time."""
        if self.ended.is_set():
            raise Unavailable(self.exit_reason())
        number = next(self._ids)
        done, holder = anyio.Event(), list[dict[str, Any]]()
        self._pending[number] = (done, holder)
        try:
            await self._send({"jsonrpc": "2.0", "id": number, "method": method, "params": _json(params)})
            with anyio.move_on_after(timeout_s):
                await done.wait()
        finally:
            self._pending.pop(number, None)
        if not holder:
            if self.ended.is_set():
                raise Unavailable(self.exit_reason())
            with contextlib.suppress(Unavailable):
                await self.notify("$/cancelRequest", {"id": number})
            raise Unavailable(f"{self.name} did not answer {method} within {timeout_s:g} s")
        message: dict[str, Any] = holder[0]
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            raise Unavailable(f"{self.name} failed {method}: {str(error.get('message', error))[:500]}")
        try:
            return CONVERTER.structure({"jsonrpc": "2.0", "id": number, **message}, answer)
        except Exception as exc:  # cattrs' ClassValidationError and kin: the answer has the wrong shape
            raise Unavailable(f"{self.name} answered {method} with something not LSP: {exc}") from exc

    async def notify(self, method: str, params: Any) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": _json(params)})

    async def _send(self, message: Mapping[str, Any]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        data = frame(json.dumps(message, ensure_ascii=False).encode())
        try:
            async with self._writing:
                await stdin.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise Unavailable(self.exit_reason()) from exc

    # --- what the server sends --------------------------------------------------------------

    async def read(self) -> None:
        """Read messages until the server's output ends: responses wake their request, requests
        are answered, notifications handed on."""
        stdout = self.process.stdout
        assert stdout is not None
        stream = BufferedByteReceiveStream(stdout)
        try:
            while True:
                body = await read_message(stream, MAX_MESSAGE_BYTES)
                try:
                    message = json.loads(body)
                except ValueError:
                    log.debug("%s wrote a message that is not JSON: %.200r", self.name, body)
                    continue
                if isinstance(message, dict):
                    await self._dispatch(message)
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
        ):
            pass
        except (anyio.DelimiterNotFound, FramingError) as exc:
            self.problem = f"wrote something that is not an LSP message ({exc}); the connection was closed"
            log.warning("%s %s", self.name, self.problem)
        finally:
            if not self.problem:  # its output ended: it is exiting; its exit code, for exit_reason
                with anyio.move_on_after(EXIT_GRACE_S):
                    await self.process.wait()
            self.ended.set()
            for done, _ in self._pending.values():
                done.set()

    async def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            pending = self._pending.get(message["id"]) if isinstance(message.get("id"), int) else None
            if pending is not None:
                pending[1].append(message)
                pending[0].set()
        elif "id" in message:
            await self._answer(message["id"], str(method), message.get("params"))
        else:
            try:
                await self.on_notification(str(method), message.get("params"))
            except Exception:  # a notification we cannot read is dropped, the connection goes on
                log.debug("%s: dropped %s", self.name, method, exc_info=True)

    async def _answer(self, number: Any, method: str, params: Any) -> None:
        """Answer what the server asks: defaults for its configuration, nothing for the rest it
        may ask a client; an error for what a client need not do."""
        result: Any = None
        if method == "workspace/configuration":
            items = params.get("items", []) if isinstance(params, dict) else []
            result = [None] * len(items)
        elif method == "workspace/workspaceFolders":
            result = self.workspace_folders
        elif method not in _ANSWERED_WITH_NULL:
            reply = {"code": -32601, "message": f"{method} is not supported by this client"}
            with contextlib.suppress(Unavailable):
                await self._send({"jsonrpc": "2.0", "id": number, "error": reply})
            return
        with contextlib.suppress(Unavailable):
            await self._send({"jsonrpc": "2.0", "id": number, "result": result})

    def exit_reason(self) -> str:
        """Why the connection ended, for the error a request reports."""
        return exit_reason(f"language server {self.name}", self.problem, self.process.returncode, self.stderr)


_ANSWERED_WITH_NULL = frozenset(
    {
        "client/registerCapability",
        "client/unregisterCapability",
        "window/workDoneProgress/create",
        "window/showMessageRequest",
        "workspace/diagnostic/refresh",
        "workspace/semanticTokens/refresh",
        "workspace/inlayHint/refresh",
        "workspace/inlineValue/refresh",
        "workspace/codeLens/refresh",
    }
)


def _json(params: Any) -> Any:
    """lsprotocol values as JSON; plain JSON as it is."""
    if params is None or isinstance(params, dict | list | str | int | float | bool):
        return params
    return CONVERTER.unstructure(params)


class _ShutdownAnswer:
    """The response to `shutdown` (its result is null): whatever it holds."""


CONVERTER.register_structure_hook(_ShutdownAnswer, lambda value, _: _ShutdownAnswer())


class Running:
    """A started server: its connection, and the task that owns its process (its call scope) until
    `stop`. Made by `start`."""

    def __init__(self, connection: Connection, stopping: asyncio.Event, task: asyncio.Task[None]) -> None:
        self.connection = connection
        self._stopping = stopping
        self._task = task

    async def stop(self) -> None:
        """End the server (see `_serve`); returns once everything of its call is killed."""
        self._stopping.set()
        await asyncio.shield(self._task)


async def start(
    name: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    place: Place,
    env: Mapping[str, str],
    on_notification: Notification,
) -> Running:
    """Start `argv` (its program resolved already) contained and sandboxed for `place`, reading
    its messages in tasks of its own. OSError when the program cannot be run, SandboxUnavailable
    when no sandbox works here."""
    ready: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
    stopping = asyncio.Event()

    async def serve() -> None:
        """The server's lifetime, in a task of its own that holds its call scope: spawn it, read
        what it sends until `stopping` is set, then `_stop` it."""
        with containment.tool_call(place) as scope:
            try:
                process = await open_server(scope, argv, cwd, scope.environment(tool_environment(env)))
            except BaseException as exc:
                ready.set_exception(exc)
                return
            connection = Connection(name, process, on_notification)
            assert process.stderr is not None
            tasks = [
                asyncio.create_task(connection.read()),
                asyncio.create_task(keep_tail(process.stderr, connection.stderr)),
            ]
            ready.set_result(connection)
            try:
                await stopping.wait()
            finally:
                await _stop(connection, scope, tasks)

    task = asyncio.create_task(serve())
    try:
        connection = await asyncio.shield(ready)
    except asyncio.CancelledError:
        stopping.set()
        raise
    return Running(connection, stopping, task)


async def _stop(
    connection: Connection, scope: containment.CallScope, tasks: list[asyncio.Task[None]]
) -> None:
    process = connection.process
    if connection.said_hello and not connection.ended.is_set():
        with contextlib.suppress(Unavailable):
            await connection.request("shutdown", None, _ShutdownAnswer, EXIT_GRACE_S)
            await connection.notify("exit", None)
        with anyio.move_on_after(EXIT_GRACE_S):
            await connection.ended.wait()
    if process.stdin is not None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await process.stdin.aclose()
    await scope.end()  # its children too, even when it exited on its own
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    with anyio.move_on_after(EXIT_GRACE_S):
        await process.aclose()
