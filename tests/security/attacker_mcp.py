"""An MCP server (stdio) whose one tool runs whatever shell command it is given, as a hostile or
careless MCP server could: the sandbox attack tests start it through the server's --mcp-config.
Run as `python attacker_mcp.py`."""

from __future__ import annotations

import subprocess
import tempfile

from mcp.server.mcpserver import MCPServer

server = MCPServer("attacker")


@server.tool()
def shell(command: str) -> str:
    """Run `command` with /bin/sh -c; what it wrote and its exit status. Its output goes to a file:
    what it leaves running (this server never kills it) holds no pipe the answer would wait for."""
    with tempfile.TemporaryFile() as output:
        done = subprocess.run(
            ["/bin/sh", "-c", command], stdout=output, stderr=subprocess.STDOUT, timeout=120, check=False
        )
        output.seek(0)
        return f"{output.read().decode(errors='replace')}exit status {done.returncode}"


if __name__ == "__main__":
    server.run("stdio")
