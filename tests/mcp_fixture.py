"""A real MCP server for the MCP client's tests, written with the `mcp` SDK (MCPServer, FastMCP's
successor). Run as `python tests/mcp_fixture.py stdio` or `python tests/mcp_fixture.py http PORT`
(Streamable HTTP at http://127.0.0.1:PORT/mcp).

`MCP_FIXTURE_LOG` names a file the server appends lines to: "started <pid>", "slow started",
"slow cancelled", so a test can see what the server saw.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

# A 1x1 transparent PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server = MCPServer("fixture", instructions="A test server.")


def note(line: str) -> None:
    path = os.environ.get("MCP_FIXTURE_LOG")
    if path:
        with open(path, "a") as log:
            log.write(line + "\n")


@server.tool()
def echo(text: str) -> str:
    """Say `text` back."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def picture() -> Image:
    """A tiny picture."""
    return Image(data=PIXEL, format="png")


@server.tool()
def not_a_picture() -> Image:
    """Text that claims to be a PNG."""
    return Image(data=b"hello, not a png", format="png")


@server.tool()
def environment(name: str) -> str:
    """The value of an environment variable of this server, or (unset)."""
    return os.environ.get(name, "(unset)")


@server.tool()
def fetch(url: str) -> str:
    """GET `url` (through the proxy this server's environment names, if any): its body, or why not."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return str(response.read().decode())
    except Exception as exc:
        return f"failed: {exc}"


@server.tool()
def where() -> str:
    """This server's process id and working directory."""
    return f"{os.getpid()} {os.getcwd()}"


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ValueError("this tool always fails")


@server.tool()
async def slow(seconds: float) -> str:
    """Wait `seconds`, then say so."""
    note("slow started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note("slow cancelled")
        raise
    return f"waited {seconds}"


@server.tool()
def crash() -> str:
    """The server dies in the middle of the call."""
    note("crashing")
    os._exit(3)


@server.resource("note://hello", name="hello", mime_type="text/plain", description="A greeting")
def hello() -> str:
    return "hello from a resource"


@server.prompt()
def review(path: str) -> str:
    """Ask for a review of a file."""
    return f"Please review {path}."


if __name__ == "__main__":
    note(f"started {os.getpid()}")
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
