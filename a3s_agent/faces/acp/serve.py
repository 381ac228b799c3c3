"""`a3s-agent acp`: ACP on this process's stdin and stdout, for an editor that started it.

stdout carries the protocol alone: the process's own descriptor 1 (and `sys.stdout`) are pointed at
stderr first, so nothing a library prints or a child inherits can corrupt it; logs go to stderr.
The agent runs an application of its own, on the data dir the server would use for the workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import cast

from acp import Agent, run_agent
from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES

from ...app.standalone import standalone
from ...config import Settings
from .agent import EditorAgent
from .editor import Editor
from .tools import acp_registry


async def run_acp(settings: Settings, *, editor_tools: bool) -> int:
    """Serve the editor on stdin/stdout until it closes stdin (or SIGTERM/SIGINT); the exit code."""
    reader, writer = await _protocol_streams()
    editor = Editor(enabled=editor_tools)
    async with standalone(settings, registry=acp_registry(editor)) as app:
        agent = EditorAgent(app, editor)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # ACP v1 made session/resume and session/close stable; the SDK still routes them only
        # with its unstable methods on. Those we do not implement answer "method not found".
        serving = asyncio.create_task(
            run_agent(cast(Agent, agent), writer, reader, use_unstable_protocol=True)
        )
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (serving, stopping):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await agent.close()
    return 0


async def _protocol_streams() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """stdin as a reader, and the original stdout as a writer that only the protocol uses."""
    output = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=DEFAULT_STDIO_BUFFER_LIMIT_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop), output
    )
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)
