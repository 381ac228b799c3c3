"""Running subprocesses for tools: contained (tools/containment.py), bounded time, capped output."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import containment
from .environment import tool_environment

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 600.0
TIMEOUT_EXIT_CODE = 124
_READ_CHUNK = 65536
_DRAIN_GRACE_S = 0.25


@dataclass
class ProcessResult:
    exit_code: int
    output: str  # stdout and stderr interleaved in arrival order
    stdout: str
    stderr: str
    timed_out: bool
    duration_ms: float
    truncated: bool


def find_binary(name: str) -> str | None:
    """A tool binary: next to our interpreter first (binaries installed with the package
    into its venv, such as rg and ruff), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


class _ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Knows when the process itself exits. asyncio's Process.wait() also waits for every
    pipe to close, which a background child holding stdout can delay indefinitely."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class _HeadTail:
    """Keeps the first and the last half of a stream within a byte budget: a build log's
    errors are usually at its end."""

    def __init__(self, limit: int) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.half = max(limit // 2, 1)
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        excess = len(self.tail) - self.half
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="ignore")
        return f"{head}\n[... {self.dropped} bytes of output omitted ...]\n{tail}"


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    extra_env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stdin: bytes | None = None,
    max_output_bytes: int = 1_000_000,
) -> ProcessResult:
    """Run argv contained (its own session, and cgroup where available); when it ends, times out or
    is cancelled, every process it started is killed, including any that left its process group.

    Output beyond max_output_bytes keeps its first and last halves (the child never blocks
    on a full pipe) and `truncated` is set. A timeout gives exit code 124.
    """
    timeout_s = min(max(timeout_s, 0.001), MAX_TIMEOUT_S)
    with containment.tool_call() as scope:
        return await _run_contained(argv, scope, cwd, extra_env, timeout_s, stdin, max_output_bytes)


async def _run_contained(
    argv: Sequence[str],
    scope: containment.CallScope,
    cwd: Path,
    extra_env: Mapping[str, str] | None,
    timeout_s: float,
    stdin: bytes | None,
    max_output_bytes: int,
) -> ProcessResult:
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    env = scope.environment(tool_environment(extra_env))
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitAwareProtocol(limit=_READ_CHUNK, loop=loop),
        *scope.command(argv, cwd, env),
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    scope.started(transport.get_pid())
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    merged, out, err = _HeadTail(max_output_bytes), _HeadTail(max_output_bytes), _HeadTail(max_output_bytes)

    async def pump(stream: asyncio.StreamReader, own: _HeadTail) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            merged.add(chunk)
            own.add(chunk)

    async def feed_stdin() -> None:
        if stdin is not None and proc.stdin is not None:
            try:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            proc.stdin.close()

    assert proc.stdout is not None and proc.stderr is not None
    pumps = asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err), feed_stdin())
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(protocol.exited), timeout_s)
        except TimeoutError:
            timed_out = True
        else:
            # The main process is done; a background child may still hold the pipes open.
            try:
                await asyncio.wait_for(asyncio.shield(pumps), _DRAIN_GRACE_S)
            except TimeoutError:
                pass
    finally:
        # Kill even on success: a background child must not outlive its tool call.
        scope.kill()
        try:
            await asyncio.wait_for(pumps, _DRAIN_GRACE_S)
        except (TimeoutError, asyncio.CancelledError):
            pumps.cancel()
        await asyncio.shield(protocol.exited)

    return ProcessResult(
        exit_code=TIMEOUT_EXIT_CODE if timed_out else (transport.get_returncode() or 0),
        output=merged.text(),
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        truncated=bool(merged.dropped),
    )
