"""Running subprocesses for tools: own process group, bounded time, capped output, nothing left behind."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    extra_env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stdin: bytes | None = None,
    max_output_bytes: int = 1_000_000,
) -> ProcessResult:
    """Run argv in its own process group; on timeout or cancellation the whole group is killed.

    Output beyond max_output_bytes is read and dropped (so the child never blocks on a
    full pipe), and `truncated` is set. A timeout gives exit code 124.
    """
    timeout_s = min(max(timeout_s, 0.001), MAX_TIMEOUT_S)
    env = {**os.environ, **(extra_env or {})}
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    merged: list[bytes] = []
    parts: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    kept = 0
    truncated = False

    async def pump(stream: asyncio.StreamReader, name: str) -> None:
        nonlocal kept, truncated
        while chunk := await stream.read(_READ_CHUNK):
            room = max_output_bytes - kept
            if room <= 0:
                truncated = True
                continue
            piece = chunk[:room]
            truncated = truncated or len(piece) < len(chunk)
            kept += len(piece)
            merged.append(piece)
            parts[name].append(piece)

    async def feed_stdin() -> None:
        if stdin is not None and proc.stdin is not None:
            try:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            proc.stdin.close()

    assert proc.stdout is not None and proc.stderr is not None
    pumps = asyncio.gather(pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr"), feed_stdin())
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
        else:
            # The main process is done; a background child may still hold the pipes open.
            try:
                await asyncio.wait_for(asyncio.shield(pumps), _DRAIN_GRACE_S)
            except TimeoutError:
                pass
    finally:
        # Kill the group even on success: a background child must not outlive its tool call.
        _kill_group(proc)
        if proc.returncode is None:
            await proc.wait()
        try:
            await asyncio.wait_for(pumps, _DRAIN_GRACE_S)
        except (TimeoutError, asyncio.CancelledError):
            pumps.cancel()

    def text(chunks: list[bytes]) -> str:
        return b"".join(chunks).decode("utf-8", errors="replace")

    return ProcessResult(
        exit_code=TIMEOUT_EXIT_CODE if timed_out else (proc.returncode or 0),
        output=text(merged),
        stdout=text(parts["stdout"]),
        stderr=text(parts["stderr"]),
        timed_out=timed_out,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        truncated=truncated,
    )
