"""What the servers we run over stdio (MCP servers, language servers) share: their spawn in a tool
call's scope, reading one of their streams in chunks, the tail of what they write to stderr, and
the words for why one ended."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from subprocess import PIPE

import anyio
from anyio.abc import ByteReceiveStream, Process

from .containment import CallScope

STDERR_TAIL_BYTES = 4096
STDERR_SHOWN = 400  # characters of it an error message shows
_READ_CHUNK = 65536


async def open_server(
    scope: CallScope, argv: Sequence[str], cwd: Path, environment: Mapping[str, str]
) -> Process:
    """Spawn a server in the call `scope` (sandboxed, contained, in a session of its own) with
    pipes for its three streams; `environment` is the scope's (`scope.environment(...)`)."""
    process = await anyio.open_process(
        scope.command(list(argv), cwd, environment),
        stdin=PIPE,
        stdout=PIPE,
        stderr=PIPE,
        cwd=cwd,
        env=environment,
        pass_fds=scope.pass_fds,
        start_new_session=True,
    )
    scope.started(process.pid)
    return process


async def chunks(stream: ByteReceiveStream) -> AsyncIterator[bytes]:
    """What the stream delivers until it ends or breaks."""
    try:
        while True:
            yield await stream.receive(_READ_CHUNK)
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        return


async def keep_tail(stream: ByteReceiveStream, tail: bytearray) -> None:
    """Read the stream to its end, keeping its last STDERR_TAIL_BYTES in `tail`."""
    async for chunk in chunks(stream):
        tail += chunk
        del tail[:-STDERR_TAIL_BYTES]


def exit_reason(who: str, problem: str, returncode: int | None, stderr: bytes | bytearray) -> str:
    """Why the connection to server `who` ended, for the error a call reports: `problem` (why we
    ended it ourselves), else its exit and the last lines it wrote to stderr."""
    if problem:
        return f"{who} {problem}"
    status = "is still running" if returncode is None else f"exited with code {returncode}"
    if returncode is not None and returncode < 0:
        status = f"was killed by signal {-returncode}"
    lines = [line.strip() for line in stderr.decode("utf-8", errors="replace").splitlines()]
    tail = " | ".join(line for line in lines if line)[-STDERR_SHOWN:]
    return f"{who} {status}" + (f"; it last wrote: {tail}" if tail else "")
