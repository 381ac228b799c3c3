"""The MCP servers an editor passes (session/new, load, resume) as the session's own MCP servers.

The editor is this machine's user, who started the agent: its stdio servers run without the
operator's --allow-api-mcp-commands (runtime/mcp.py); http servers go through the request guard as
any URL from the API does (a server on this machine needs A3S_FETCH_ALLOW_PRIVATE=1). SSE servers,
which MCP deprecated, are refused (mcpCapabilities.sse is false)."""

from __future__ import annotations

from collections.abc import Sequence

from acp.schema import AcpMcpServer, HttpMcpServer, McpServerStdio, SseMcpServer

from ...app.sessions import ServersGiven
from ...base.errors import InvalidArgument

McpServer = HttpMcpServer | SseMcpServer | AcpMcpServer | McpServerStdio


def servers_given(servers: Sequence[McpServer] | None, method: str) -> ServersGiven | None:
    """The editor's list in the common mcpServers shape; None when it sent none at all."""
    if servers is None:
        return None
    config: dict[str, dict[str, object]] = {}
    for server in servers:
        if isinstance(server, McpServerStdio):
            env = {variable.name: variable.value for variable in server.env}
            config[server.name] = {"command": server.command, "args": list(server.args), "env": env}
        elif isinstance(server, HttpMcpServer):
            headers = {header.name: header.value for header in server.headers}
            config[server.name] = {"type": "http", "url": server.url, "headers": headers}
        else:
            raise InvalidArgument(
                f"{method}: MCP server {server.name!r} is of type {server.type!r}; stdio and http are supported"
            )
    return ServersGiven({"mcpServers": config}, f"{method} mcpServers", commands_allowed=True)
