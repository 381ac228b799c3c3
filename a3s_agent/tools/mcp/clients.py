"""Every MCP connection of the server, by who uses it: "" for the server's own (the operator's
file, Initialize, skills loaded server-wide), a session id for a session's (its metadata, the
skills loaded into it). Equal configurations of one user share a connection; a connection no user
configures any more is closed, and with it a stdio server's processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

from ..registry import Tool, ToolFailure
from .config import Endpoint
from .connection import Connection, Listing
from .tools import resource_tools, server_tools

Owner = str
"""Who uses a connection: "" for the server, else a session id."""
_Key = tuple[Owner, str, str, str, bool, bool]


def _key(owner: Owner, endpoint: Endpoint) -> _Key:
    spec = endpoint.spec
    return owner, endpoint.name, spec.key(), str(endpoint.workspace), endpoint.guarded, endpoint.allow_private


class McpClients:
    def __init__(self) -> None:
        self._connections: dict[_Key, Connection] = {}
        self._tools: dict[int, tuple[Listing, list[Tool]]] = {}  # by connection: built from its listing

    def connections(self, wanted: Iterable[tuple[Owner, Endpoint]]) -> list[Connection]:
        """The connection of each (owner, endpoint), made on first sight (connecting waits for a
        call or `prepare`)."""
        found = []
        for owner, endpoint in wanted:
            key = _key(owner, endpoint)
            if key not in self._connections:
                self._connections[key] = Connection(endpoint)
            found.append(self._connections[key])
        return found

    async def prepare(self, connections: Sequence[Connection]) -> None:
        """Connect, at once, the servers whose tools are not known yet (unless a failure is being
        waited out); each within its startup timeout. Failures are left for calls to report."""
        pending = [c for c in connections if c.listing is None and not c.waiting and not c.closed]
        await asyncio.gather(*(_connect(connection) for connection in pending))

    def tools(self, connections: Sequence[Connection]) -> list[Tool]:
        """The tools of these servers' last listings, and the resource and prompt tools over them."""
        tools = [tool for connection in connections for tool in self._built(connection)]
        return [*tools, *resource_tools(connections)] if connections else tools

    def _built(self, connection: Connection) -> list[Tool]:
        listing = connection.listing
        if listing is None:
            return []
        cached = self._tools.get(id(connection))
        if cached is None or cached[0] is not listing:
            cached = self._tools[id(connection)] = (listing, server_tools(connection))
        return cached[1]

    async def release(self, owner: Owner, keep: Callable[[Connection], bool] = lambda _: False) -> None:
        """Close `owner`'s connections but those `keep` keeps."""
        gone = [
            key for key, connection in self._connections.items() if key[0] == owner and not keep(connection)
        ]
        await self._close(gone)

    async def close(self) -> None:
        """The server stops: close every connection."""
        await self._close(list(self._connections))

    async def _close(self, keys: list[_Key]) -> None:
        connections = [self._connections.pop(key) for key in keys]
        for connection in connections:
            self._tools.pop(id(connection), None)
        await asyncio.gather(*(connection.close() for connection in connections))


async def _connect(connection: Connection) -> None:
    try:
        await connection.client()
    except ToolFailure:
        pass  # logged by the connection; the server's calls say why
