"""Running subprocesses for tools: contained (tools/containment.py), bounded time, capped output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from . import containment
from .environment import tool_environment
from .sandbox import Place

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
    sandbox: str = "off"  # the mechanism it ran under (tools/sandbox/)
    sandbox_network: str = "on"  # the network it had there
    denial: str = ""  # when it failed: what the sandbox refused it, where its output shows it


def find_binary(name: str) -> str | None:
    """A tool binary: next to our interpreter first (binaries installed with the package
    into its venv, such as rg and ruff), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


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
    place: Place,
    extra_env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stdin: bytes | None = None,
    max_output_bytes: int = 1_000_000,
) -> ProcessResult:
    """Run argv sandboxed for `place` (tools/sandbox/) and contained (its own session, and cgroup where
    available); when it ends, times out or is cancelled, every process it started is killed,
    including any that left its process group.

    Output beyond max_output_bytes keeps its first and last halves (the child never blocks
    on a full pipe) and `truncated` is set. A timeout gives exit code 124.
    """
    timeout_s = min(max(timeout_s, 0.001), MAX_TIMEOUT_S)
    with containment.tool_call(place) as scope:
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
    started = time.perf_counter()
    env = scope.environment(tool_environment(extra_env))
    # Spawned without an await, so that it is the scope's to kill before anything can cancel us.
    proc = subprocess.Popen(  # noqa: ASYNC220
        scope.command(argv, cwd, env),
        bufsize=0,
        cwd=cwd,
        env=env,
        pass_fds=scope.pass_fds,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    scope.started(proc.pid)
    child = _Child(proc, stdin, max_output_bytes)
    timed_out = False
    try:
        timed_out = not await _settled(child.exited, timeout_s)
        if not timed_out:  # the main process is done; a background child may still hold the pipes
            await _settled(child.drained, _DRAIN_GRACE_S)
    finally:
        # Kill even on success: a background child must not outlive its tool call.
        await child.end(scope)

    output = child.merged.text()
    failed = not timed_out and proc.returncode != 0
    return ProcessResult(
        exit_code=TIMEOUT_EXIT_CODE if timed_out else (proc.returncode or 0),
        output=output,
        stdout=child.out.text(),
        stderr=child.err.text(),
        timed_out=timed_out,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        truncated=bool(child.merged.dropped),
        sandbox=scope.sandbox.mechanism,
        sandbox_network=scope.sandbox.network,
        denial=scope.sandbox.denial(output, cwd) if failed else "",
    )


async def _settled(future: asyncio.Future[None], timeout_s: float) -> bool:
    """Wait until `future` is done or `timeout_s` passed, without cancelling it; whether it is done."""
    if not future.done():
        await asyncio.wait((future,), timeout=timeout_s)
    return future.done()


Sink = Callable[[bytes], object]
"""Takes each chunk read from a pipe, in order, then b"" at the pipe's end."""


class WatchedChild:
    """A running process's pipes and exit, served by event-loop callbacks on its file descriptors and
    a pidfd: no transports, stream readers, pump tasks or child-watcher thread (through asyncio's
    subprocess machinery a call cost about 0.35 ms more of the server's CPU on Python 3.11), and no
    worker thread (grep read rg's output in one: a thread hop per call)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        sinks: Sequence[tuple[IO[bytes] | None, Sink]],
        stdin: bytes | None,
    ) -> None:
        self.proc = proc
        self.loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = self.loop.create_future()
        self.drained: asyncio.Future[None] = self.loop.create_future()
        self._reading: dict[int, tuple[IO[bytes], Sink]] = {}
        for pipe, sink in sinks:
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self.loop.add_reader(pipe.fileno(), self._read, pipe.fileno())
            self._reading[pipe.fileno()] = (pipe, sink)
        self._input = memoryview(stdin or b"")
        self._writing = False
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            self._write()
        self._watch_exit()

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        pipe, sink = self._reading[fd]
        sink(chunk)
        if chunk:
            return
        self.loop.remove_reader(fd)
        pipe.close()
        del self._reading[fd]
        if not self._reading and not self.drained.done():
            self.drained.set_result(None)

    def _write(self) -> None:
        """Feed stdin as the pipe takes it; close it at the end or when the process stops reading."""
        stdin = self.proc.stdin
        assert stdin is not None
        if self._input:
            try:
                self._input = self._input[os.write(stdin.fileno(), self._input) :]
            except BlockingIOError:
                pass
            except OSError:  # BrokenPipeError: the process no longer reads its input
                self._input = self._input[:0]
        if not self._input:
            self._close_stdin()
        elif not self._writing:
            self.loop.add_writer(stdin.fileno(), self._write)
            self._writing = True

    def _close_stdin(self) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.closed:
            return
        if self._writing:
            self.loop.remove_writer(stdin.fileno())
            self._writing = False
        stdin.close()

    def _watch_exit(self) -> None:
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except (OSError, AttributeError):  # no pidfd (Linux < 5.3, a seccomp filter, not Linux)
            threading.Thread(target=self._wait_in_thread, daemon=True).start()
            return
        self.loop.add_reader(pidfd, self._reap, pidfd)

    def _reap(self, pidfd: int) -> None:
        """(The pidfd became readable: the process exited.) Its status, without blocking."""
        self.loop.remove_reader(pidfd)
        os.close(pidfd)
        self.proc.wait()
        self._set_exited()

    def _wait_in_thread(self) -> None:
        self.proc.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self._set_exited)

    def _set_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def close_pipes(self) -> None:
        """Stop reading (a process that still holds a pipe after the kill keeps it to itself)."""
        self._close_stdin()
        for fd, (pipe, _) in list(self._reading.items()):
            self.loop.remove_reader(fd)
            pipe.close()
        self._reading.clear()

    async def end(self, scope: containment.CallScope) -> None:
        """Kill the call's processes, take what the pipes still hold (briefly: a process that left
        the call may keep them), then wait for the exit."""
        await scope.end()
        try:
            await _settled(self.drained, _DRAIN_GRACE_S)
        finally:
            self.close_pipes()
        await asyncio.shield(self.exited)


class _Child(WatchedChild):
    """run_process's child: its output kept per stream and interleaved, each as head and tail."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes | None, limit: int) -> None:
        self.merged, self.out, self.err = _HeadTail(limit), _HeadTail(limit), _HeadTail(limit)
        super().__init__(proc, ((proc.stdout, self._take_out), (proc.stderr, self._take_err)), stdin)

    def _take_out(self, chunk: bytes) -> None:
        self.merged.add(chunk)
        self.out.add(chunk)

    def _take_err(self, chunk: bytes) -> None:
        self.merged.add(chunk)
        self.err.add(chunk)
