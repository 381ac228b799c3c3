"""One MCP server: connected on first need, every wait bounded, reconnected after a failure.

A connection is owned by a task of its own (the SDK's client holds task groups, which must be
left by the task that entered them); calls from any task go through it. Connecting (start, the
protocol handshake and the tool listing) is bounded by the server's `startup_timeout_ms`, each
request by its `timeout_ms`. A server that cannot be reached is tried again only after a backoff
(1 s doubling to a minute), so a server that is down costs a call an immediate error, not a wait.

A stdio server that exited is noticed before the next request is sent, and started again; a
call the failure interrupted is reported failed, never sent twice. The tool listing is kept
after the connection ends, so the server's tools stay offered while it is restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import mcp_types
from mcp.client import Client, Transport
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from ... import NAME, __version__
from ...base.backoff import Backoff
from ..fetcher import connection_problem
from ..registry import ToolFailure
from ..sandbox import Place
from .config import Endpoint, HttpServer, StdioServer
from .http import http_transport
from .stdio import ServerProcess, stdio_transport

log = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name=NAME, version=__version__)
MAX_PAGES = 100
"""Listings stop after this many pages: a server whose cursor never ends cannot hold a connect."""
STOP_TIMEOUT_S = 6.0
"""Closing: stdin closed, the exit grace, the kill; past this the owner task is cancelled."""
_EXIT_WAIT_S = 1.0


@dataclass
class Listing:
    tools: list[mcp_types.Tool]
    has_resources: bool
    has_prompts: bool


class Connection:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.listing: Listing | None = None  # the last listing (None: never listed)
        self.error = ""  # why the last attempt to connect failed ("" after a success)
        self.closed = False
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._processes: list[ServerProcess] = []
        self._lock = asyncio.Lock()
        self._retry_at = 0.0
        self._backoff = Backoff(1.0, 60.0, jitter=0.2)

    @property
    def name(self) -> str:
        return self.endpoint.name

    @property
    def timeout_s(self) -> float:
        return self.endpoint.spec.timeout_ms / 1000

    @property
    def waiting(self) -> bool:
        """Whether a failed connect is not to be retried yet."""
        return time.monotonic() < self._retry_at

    # --- connecting ------------------------------------------------------------------------

    async def client(self) -> Client:
        """The connected client, connecting first when there is none (or its process ended);
        ToolFailure says why the server cannot be used."""
        if self._alive():
            assert self._client is not None
            return self._client
        async with self._lock:
            if self._alive():
                assert self._client is not None
                return self._client
            if self.closed:
                raise ToolFailure(f"MCP server {self.name!r} is no longer configured")
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                raise ToolFailure(
                    f"MCP server {self.name!r} is unavailable: {self.error} (next attempt in {wait:.0f} s)"
                )
            await self._disconnect()
            try:
                return await self._connect()
            except ToolFailure as exc:
                self.error = str(exc).removeprefix(f"MCP server {self.name!r} is unavailable: ")
                self._retry_at = time.monotonic() + self._backoff.next_s()
                log.warning("%s", exc)
                raise

    def _alive(self) -> bool:
        if self._client is None or self._owner is None or self._owner.done():
            return False
        return not (self._processes and self._processes[-1].ended.is_set())

    async def _connect(self) -> Client:
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._processes = []
        self._owner = asyncio.create_task(self._own(ready, self._stop), name=f"MCP server {self.name}")
        startup_s = self.endpoint.spec.startup_timeout_ms / 1000
        try:
            async with asyncio.timeout(startup_s):
                client = await asyncio.shield(ready)
                self.listing = await _listing(client)
        except asyncio.CancelledError:
            self._owner.cancel()
            await self._disconnect()
            raise
        except Exception as exc:
            reason = f"it did not start within {startup_s:g} s" if isinstance(exc, TimeoutError) else ""
            reason = reason or await self._describe(exc)
            if not ready.done():
                self._owner.cancel()  # still connecting: nothing to close politely
            await self._disconnect()
            raise ToolFailure(f"MCP server {self.name!r} is unavailable: {reason}") from exc
        self._client = client
        for process in self._processes:
            process.answered = True
        self._backoff.reset()
        self.error = ""
        log.info("MCP server %r connected: %d tools", self.name, len(self.listing.tools))
        return client

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """The connection's life: enter the client, hand it out, hold it until told to stop."""
        try:
            async with Client(
                self._transport(), client_info=CLIENT_INFO, read_timeout_seconds=self.timeout_s, cache=None
            ) as client:
                ready.set_result(client)
                await stop.wait()
        except asyncio.CancelledError:
            ready.cancel()
            raise
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.debug("MCP server %r: the connection ended: %r", self.name, exc)

    def _transport(self) -> Transport:
        spec = self.endpoint.spec
        if isinstance(spec, StdioServer):
            cwd = self.endpoint.workspace / spec.cwd if spec.cwd else self.endpoint.workspace
            place = Place(
                self.endpoint.workspace, self.endpoint.session_id, network=self.endpoint.sandbox_network
            )
            return stdio_transport(spec.command, spec.args, spec.env, cwd, self._processes, place)
        assert isinstance(spec, HttpServer)
        guard = self.endpoint.allow_private if self.endpoint.guarded else None
        return http_transport(spec.url, spec.headers, guard=guard, timeout_s=self.timeout_s)

    async def _describe(self, exc: BaseException) -> str:
        """Why a connect or call failed, in a sentence: the process's exit, or the innermost error."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if self._processes and (self._processes[-1].ended.is_set() or isinstance(exc, MCPError)):
            process = self._processes[-1]
            if process.problem or await process.exited(_EXIT_WAIT_S):
                return process.exit_reason()
        if isinstance(exc, FileNotFoundError | PermissionError):
            return f"cannot run {exc.filename or exc}: {exc.strerror or exc}"
        if isinstance(exc, ToolFailure | MCPError) or not isinstance(exc, Exception):
            return str(exc) or type(exc).__name__
        return connection_problem(exc)  # (DNS, a refused connection, or the library's message)

    # --- requests ---------------------------------------------------------------------------

    async def request(self, what: str, send: Any) -> Any:
        """`await send(client)` on the connected client; ToolFailure for anything but a result. A
        connection that closed under the request is started again on the next one."""
        client = await self.client()
        try:
            return await send(client)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._client = None
                raise ToolFailure(
                    f"MCP server {self.name!r} closed the connection during {what}: {await self._describe(exc)}"
                ) from exc
            if exc.code == REQUEST_TIMEOUT:
                raise ToolFailure(
                    f"MCP server {self.name!r} did not answer {what} within {self.timeout_s:g} s"
                    " (the request was cancelled)"
                ) from exc
            raise ToolFailure(f"MCP server {self.name!r} refused {what}: {exc.message}") from exc
        except (asyncio.CancelledError, ToolFailure):
            raise
        except Exception as exc:
            self._client = None  # a transport failure: the next request connects afresh
            raise ToolFailure(f"MCP server {self.name!r} failed {what}: {await self._describe(exc)}") from exc

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        async def send(client: Client) -> mcp_types.CallToolResult:
            return await client.call_tool(tool, arguments, read_timeout_seconds=self.timeout_s)

        result: mcp_types.CallToolResult = await self.request(f"the call of {tool!r}", send)
        return result

    # --- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the server (a stdio server's process tree ends); the connection is not used again."""
        self.closed = True
        await self._disconnect()

    async def _disconnect(self) -> None:
        owner, self._owner, self._client = self._owner, None, None
        if owner is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), STOP_TIMEOUT_S)
        except TimeoutError:
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # we are cancelled, not (only) the owner
                owner.cancel()
                raise
        except Exception:  # the owner's failure was handed to whoever waited for the connect
            pass


async def _listing(client: Client) -> Listing:
    capabilities = client.server_capabilities
    tools: list[mcp_types.Tool] = []
    if capabilities.tools is not None:
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
    return Listing(tools, capabilities.resources is not None, capabilities.prompts is not None)
