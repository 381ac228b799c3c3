"""Server-wide MCP servers managed over the API (A3S's RegisterMcpServer, ConnectMcpServer, ...).

A registered server is checked as every server given over the API is (runtime/mcp.py): a command
only when the operator allows API MCP commands, a URL reached through the request guard. While
connected it is one of the server's own MCP servers: every session's model sees its tools.
Registrations live in this process's memory: they end with it and are not shared by replicas.
The listings (`servers`, `tools`) show every server-wide server, the operator's and Initialize's
too; connecting and disconnecting apply to registered ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ..runtime import Runtime
from ..runtime.mcp import ServersGiven
from ..tools.mcp.config import MAX_SERVERS
from ..tools.registry import ToolFailure

if TYPE_CHECKING:
    from ..tools.mcp.connection import Connection

SOURCE = "RegisterMcpServer"
MAX_CONFIG_CHARS = 64 * 1024
"""The most one registration's config may hold (as JSON): registrations stay in memory."""


@dataclass(frozen=True)
class McpServerStatus:
    name: str
    connected: bool
    """Its tools are known and its last connect succeeded."""
    enabled: bool
    """It is used (registered ones: between connecting and disconnecting)."""
    tool_count: int
    error: str
    """Why its last connect failed ("" when it did not)."""


@dataclass(frozen=True)
class McpToolInfo:
    full_name: str
    """The name the model calls it by: mcp__<server>__<tool>."""
    server_name: str
    tool_name: str
    description: str
    input_schema: dict[str, Any]


class McpServerAdmin:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def register(self, name: str, entry: dict[str, Any], enabled: bool) -> list[str]:
        """Add (or replace) server `name` (`entry` in the mcpServers shape); with `enabled`, connect
        it and return its tool names. InvalidArgument for a bad or oversized config,
        FailedPrecondition for a command the operator does not allow, ResourceExhausted past
        MAX_SERVERS registrations, Unavailable when it is registered but cannot connect."""
        mcp = self._rt.mcp
        size = len(json.dumps(entry))
        if size > MAX_CONFIG_CHARS:
            raise InvalidArgument(
                f"{SOURCE}: {name}: the config holds {size} characters; at most {MAX_CONFIG_CHARS}"
            )
        servers = mcp.from_api(ServersGiven({name: entry}, SOURCE))
        if name not in mcp.registered and len(mcp.registered) >= MAX_SERVERS:
            raise ResourceExhausted(
                f"{SOURCE}: {MAX_SERVERS} servers are registered, the most this server keeps"
            )
        mcp.registered[name] = servers[name]
        mcp.connected.discard(name)
        await mcp.server_changed()  # a replaced registration's connection ends
        return await self.connect(name) if enabled else []

    async def connect(self, name: str) -> list[str]:
        """Connect registered server `name` (within its startup timeout); its tools' full names.
        NotFound when no server is registered as `name`; Unavailable when it cannot be reached (it
        stays enabled: sessions try it again, after a backoff)."""
        mcp = self._rt.mcp
        self._registered(name)
        mcp.connected.add(name)
        connection = self._connection(name)
        try:
            await connection.client()
        except ToolFailure as exc:
            raise Unavailable(str(exc)) from None
        return [tool.full_name for tool in _tools(connection)]

    async def disconnect(self, name: str) -> None:
        """Stop using registered server `name` (its process ends); NotFound when none is registered."""
        self._registered(name)
        self._rt.mcp.connected.discard(name)
        await self._rt.mcp.server_changed()

    def servers(self) -> list[McpServerStatus]:
        """Every server-wide server: those in use, then the registered ones that are not."""
        found = [
            McpServerStatus(
                c.name,
                c.listing is not None and not c.error,
                True,
                len(c.listing.tools) if c.listing is not None else 0,
                c.error,
            )
            for c in self._rt.mcp.connections(None)
        ]
        used = {status.name for status in found}
        idle = [McpServerStatus(name, False, False, 0, "") for name in self._rt.mcp.registered]
        return found + [status for status in idle if status.name not in used]

    def tools(self, server_name: str | None) -> list[McpToolInfo]:
        """The tools of the server-wide servers as last listed (all, or `server_name`'s)."""
        return [
            tool
            for connection in self._rt.mcp.connections(None)
            if server_name is None or connection.name == server_name
            for tool in _tools(connection)
        ]

    def _registered(self, name: str) -> None:
        if name not in self._rt.mcp.registered:
            raise NotFound(f"no MCP server is registered as {name!r} (RegisterMcpServer adds one)")

    def _connection(self, name: str) -> Connection:
        for connection in self._rt.mcp.connections(None):
            if connection.name == name:
                return connection
        raise FailedPrecondition(f"MCP server {name!r} is not in use: another level's server replaces it")


def _tools(connection: Connection) -> list[McpToolInfo]:
    from ..tools.mcp.tools import tool_name  # the MCP SDK is imported only once a server is used

    if connection.listing is None:
        return []
    return [
        McpToolInfo(
            tool_name(connection.name, tool.name),
            connection.name,
            tool.name,
            tool.description or "",
            tool.input_schema,
        )
        for tool in connection.listing.tools
    ]
