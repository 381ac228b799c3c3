"""`a3s-agent acp`: ACP on this process's stdin and stdout, for an editor that started it (or any
client that pipes requests in). stdout carries the protocol alone (see stdio.py); logs go to stderr.
The agent runs an application of its own, on the data dir the server would use for the workspace.
The client's first message picks the protocol: an `initialize` asking for version 2 or later is
served by v2.py, anything else by the SDK's v1 agent (agent.py).

When stdin ends, the requests already read are answered before the process exits: those running
finish, a prompt's turn is cancelled (its answer says `cancelled`: the client that would see it
work is gone), all within ANSWER_WAIT_S. SIGTERM or SIGINT stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import cast

from acp import Agent, run_agent

from ... import __version__
from ...app.standalone import standalone
from ...app.types import Settings
from ...base import telemetry
from .agent import EditorAgent
from .editor import Editor
from .stdio import Peeked, open_stdio
from .tools import acp_registry
from .v2 import V2Agent, wants_v2
from .v2_wire import Connection

ANSWER_WAIT_S = 30.0
"""After stdin ended: how long the requests read before may take to be answered (a session/new
starting MCP servers waits for them, within their own start-up bound)."""


async def run_acp(settings: Settings, *, editor_tools: bool) -> int:
    """Serve the editor on stdin/stdout until it closes stdin (or SIGTERM/SIGINT); the exit code."""
    stdio = await open_stdio()
    telemetry.configure(__version__)  # when the OTEL_* variables name an endpoint
    editor = Editor(enabled=editor_tools)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the runtime's SIGCHLD handler (containment)
        loop.add_signal_handler(sig, stop.set)
    async with standalone(settings, registry=acp_registry(editor)) as app:
        first = await stdio.receive()
        agent: EditorAgent | V2Agent
        if first is not None and wants_v2(first):  # v2.py: the Python SDK speaks v1 only
            agent = V2Agent(app)
            agent.connection = Connection(stdio, agent.handlers())
            serving = asyncio.create_task(agent.connection.serve(first))
        else:
            agent = EditorAgent(app, editor)
            # ACP v1 made session/resume and session/close stable; the SDK still routes them only
            # with its unstable methods on. Those we do not implement answer "method not found".
            stream = Peeked(first, stdio)
            serving = asyncio.create_task(run_agent(cast(Agent, agent), stream, use_unstable_protocol=True))
        stopping = asyncio.create_task(stop.wait())
        ended = asyncio.create_task(stdio.ended.wait())
        tasks = [serving, stopping, ended]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if ended.done() and not stopping.done():
                if isinstance(agent, EditorAgent):
                    agent.end()
                answered = asyncio.create_task(stdio.answered())
                tasks.append(answered)
                await asyncio.wait(
                    {answered, stopping}, timeout=ANSWER_WAIT_S, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await agent.close()
            if isinstance(agent, V2Agent) and agent.connection is not None:
                await agent.connection.close()
            await asyncio.to_thread(telemetry.shutdown)  # the last spans exported
    return 0
