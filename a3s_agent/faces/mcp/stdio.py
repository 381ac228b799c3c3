"""`a3s-agent mcp`: the MCP server over this process's stdin and stdout. The SDK points fd 0 at
/dev/null and fd 1 at stderr while it serves, so no tool and no log line can write into the
protocol; the operator's own process (the parent) is the only client.

An MCP client ends the server by closing its stdin, then (if it lingers) with SIGTERM. The SDK
reads stdin in a thread, which no cancellation interrupts: on a stop, serve_stdio cancels the calls
in flight (their runs stop, their tools are killed) and returns without waiting for that reader."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import suppress

import anyio
from mcp.server.stdio import stdio_server

from ...app import Application
from ...base import telemetry
from .agent_task import CANCEL_WAIT_S
from .runs import AgentRuns
from .server import build_server
from .tools import Offer

STOP_WAIT_S = 2 * CANCEL_WAIT_S
"""After a stop: how long the calls in flight may take to end."""


async def serve_stdio(app: Application, allowed: Iterable[str], stop: asyncio.Event) -> bool:
    """Serve until stdin ends or `stop` is set. True when everything ended; False when the stdin
    reader is left blocked (after a stop), and the process must exit without joining it."""
    telemetry.configure(app.lifecycle.info.version)  # when the OTEL_* variables name an endpoint
    try:
        return await _serve_until(app, allowed, stop)
    finally:
        await asyncio.to_thread(telemetry.shutdown)  # the last spans exported


async def _serve_until(app: Application, allowed: Iterable[str], stop: asyncio.Event) -> bool:
    served = asyncio.Event()
    serving = asyncio.ensure_future(_serve(app, Offer(app, allowed), served))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not serving.done():
        serving.cancel()
        with suppress(TimeoutError):
            await asyncio.wait_for(served.wait(), STOP_WAIT_S)
    if not serving.done():
        return False
    if not serving.cancelled():
        serving.result()  # a failure of the server's own
    return True


async def _serve(app: Application, offer: Offer, served: asyncio.Event) -> None:
    """`served` is set once no call runs any more (the SDK's stdin reader may still be blocked)."""
    runs = AgentRuns(app)
    server = build_server(app, offer, runs)
    async with stdio_server() as (read, write):
        try:
            await server.run(read, write, server.create_initialization_options())
        finally:
            with anyio.CancelScope(shield=True):
                await runs.close()
            served.set()
