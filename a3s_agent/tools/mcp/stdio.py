"""The stdio transport, contained: an MCP server run as a tool process (tools/containment.py).

The SDK's own stdio client starts the process itself, which would leave it outside the server's
containment (its cgroup, its marker, the record a restart after a crash kills from). This one
starts it as a call scope of its own: its own session and process group, the allow-listed tool
environment plus the variables the config declares (tools/environment.py), killed with its whole
tree when the connection closes, the server stops, or a crashed server's successor starts.

Messages are newline-delimited JSON-RPC on stdin and stdout; what the server writes to stderr
is kept (the last few KB) to say why it died.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import mcp_types
from anyio.abc import ByteReceiveStream, Process
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

from .. import containment
from ..environment import tool_environment
from ..sandbox import Place
from ..stdio_server import chunks, exit_reason, keep_tail, open_server

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""A line longer than this ends the connection: a server cannot make us buffer without end."""
EXIT_GRACE_S = 2.0
"""After stdin closes: how long the server may take to exit before it is killed."""
_POLL_S = 0.01


class ServerProcess:
    """The running server: what it last wrote to stderr, and whether it ended."""

    def __init__(self, process: Process, command: str) -> None:
        self.process = process
        self.command = command
        self.stderr = bytearray()
        self.ended = anyio.Event()  # stdout closed: the server is gone (or going)
        self.problem = ""  # why we ended the connection ourselves
        self.answered = False  # it completed the handshake: it is asked to exit before it is killed

    async def exited(self, within_s: float) -> bool:
        """Whether the process exits within `within_s`. Its return code is polled: asyncio's wait
        also waits for its pipes, which a child of it may hold open."""
        for _ in range(int(within_s / _POLL_S)):
            if self.process.returncode is not None:
                return True
            await anyio.sleep(_POLL_S)
        return self.process.returncode is not None

    def exit_reason(self) -> str:
        """Why the connection ended, for the error a call reports."""
        return exit_reason(self.command, self.problem, self.process.returncode, self.stderr)


def resolve_command(command: str, cwd: Path, env: Mapping[str, str]) -> str:
    """A program named without a path is looked up beside our interpreter first (servers
    installed into the same virtual environment, such as mcp-server-git), then on the PATH of
    its environment; a relative path is relative to its working directory."""
    if "/" in command:
        return str(cwd / command)
    path = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    found = shutil.which(command, path=path)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, f"no such program beside {sys.executable} or on PATH", command)
    return found


@asynccontextmanager
async def stdio_transport(
    command: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: Path,
    started: list[ServerProcess],
    place: Place,
) -> AsyncIterator[TransportStreams]:
    """Run the server, sandboxed for `place`; yield the SDK's (read, write) streams. `started` gets
    the ServerProcess once it runs (the connection reads its state from there)."""
    with containment.tool_call(place) as scope:
        environment = scope.environment(tool_environment(env))
        program = resolve_command(command, cwd, environment)
        process = await open_server(scope, [program, *args], cwd, environment)
        server = ServerProcess(process, command)
        started.append(server)
        try:
            async with _streams(server) as streams:
                yield streams
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(server, scope)


@asynccontextmanager
async def _streams(server: ServerProcess) -> AsyncIterator[TransportStreams]:
    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](0)
    process = server.process
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None

    async def read() -> None:
        assert process.stdout is not None
        try:
            async with incoming_send:
                async for line in _lines(process.stdout, server):
                    try:
                        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError:
                        log.debug("%s wrote a line that is not JSON-RPC: %.200r", server.command, line)
                        continue
                    await incoming_send.send(SessionMessage(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the session closed its end
        finally:
            server.ended.set()

    async def write() -> None:
        assert process.stdin is not None
        async with outgoing_receive:
            async for item in outgoing_receive:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                try:
                    await process.stdin.send(data.encode())
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    await incoming_send.aclose()  # the session sees the connection end
                    return

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        group.start_soon(write)
        group.start_soon(keep_tail, process.stderr, server.stderr)
        try:
            yield incoming, outgoing
        finally:
            group.cancel_scope.cancel()
            outgoing.close()
            incoming.close()


async def _lines(stream: ByteReceiveStream, server: ServerProcess) -> AsyncIterator[bytes]:
    buffer = bytearray()
    async for chunk in chunks(stream):
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end]).strip()
            del buffer[: end + 1]
            if line:
                yield line
        if len(buffer) > MAX_MESSAGE_BYTES:
            server.problem = f"sent a message over {MAX_MESSAGE_BYTES} bytes; the connection was closed"
            log.warning("%s %s", server.command, server.problem)
            return


async def _stop(server: ServerProcess, scope: containment.CallScope) -> None:
    """Close stdin (the MCP way to ask a stdio server to exit), give a server that answered
    EXIT_GRACE_S, then kill everything of the call; every wait is bounded."""
    process = server.process
    if process.stdin is not None:
        try:
            await process.stdin.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
    if server.answered:
        await server.exited(EXIT_GRACE_S)
    await scope.end()  # its children too, even when it exited on its own
    with anyio.move_on_after(EXIT_GRACE_S):
        await process.aclose()
