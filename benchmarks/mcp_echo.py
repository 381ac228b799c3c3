"""The MCP server of the `mcp` section: one `echo` tool over stdio, written with the `mcp` SDK.
Run by its path (`python benchmarks/mcp_echo.py`), as an operator's MCP server is."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")


@server.tool()
def echo(text: str) -> str:
    """Say `text` back."""
    return f"echo: {text}"


if __name__ == "__main__":
    server.run("stdio")
