"""The MCP server face: the server's built-in tools and an `agent_task` tool (a whole generation)
for other agents, over the official `mcp` SDK's stdio and Streamable HTTP transports.

Each MCP call becomes one call of the application layer (`tools.execute`, `sessions.create`,
`generation.stream`, `control.cancel`); nothing here decides more than which of the server's
tools the face shows (tools.py)."""

from .http import McpHttp
from .server import build_server
from .stdio import serve_stdio

__all__ = ["McpHttp", "build_server", "serve_stdio"]
