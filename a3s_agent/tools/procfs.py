"""Reading processes from /proc, and killing them without hitting a reused pid."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
_DESCENDANT_PASSES = 8
"""At most this many readings of the root's children (each after a walk that found new ones)."""


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    sid: int
    state: str
    start: int
    """Clock ticks after boot (/proc/<pid>/stat field 22): with the pid, it names one process for good."""


def read(pid: int) -> Proc | None:
    """The process `pid`, or None once it is gone (or hidden from us)."""
    try:
        raw = _read(f"/proc/{pid}/stat")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ".
    fields = raw[raw.rindex(b")") + 2 :].split()
    return Proc(pid, int(fields[1]), int(fields[3]), fields[0].decode(), int(fields[19]))


def _read(path: str) -> bytes:
    """A whole /proc file (cheaper than pathlib: a scan reads hundreds of them)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def snapshot() -> dict[int, Proc]:
    """Every process we can see, by pid."""
    procs = {}
    for name in os.listdir(_PROC):
        if name.isdigit() and (proc := read(int(name))) is not None:
            procs[proc.pid] = proc
    return procs


def is_alive(pid: int, start: int) -> bool:
    """Whether the process that had this pid and start time still runs (a zombie does not)."""
    proc = read(pid)
    return proc is not None and proc.start == start and proc.state != "Z"


def environ_value(pid: int, name: str) -> str | None:
    """`name` in the environment the process was started with (/proc/<pid>/environ); None when
    it is not there or the file cannot be read (another user's process, or a zombie)."""
    try:
        raw = _read(f"/proc/{pid}/environ")
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", errors="replace")
    return None


def children(pid: int) -> set[int]:
    """The children of `pid` (of every one of its threads: an orphan is adopted by any thread).

    The main thread's are read last: a child moves to it when its parent thread exits, and an
    orphan is adopted by it, so a child moving during the reading is still found."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return set()
    main = str(pid)
    found: set[int] = set()
    for task in [*(t for t in tasks if t != main), main]:
        with contextlib.suppress(OSError):
            found.update(map(int, _read(f"/proc/{pid}/task/{task}/children").split()))
    return found


_WALL = 0x40000000
"""waitid's __WALL: children of every kind, one cloned without SIGCHLD too."""


def has_children() -> bool:
    """Whether this process (any of its threads) has a child, running or not yet reaped. One
    waitid answers it, where listing the children reads a /proc file per thread: a call's end finds
    no process left to kill this way. WNOWAIT leaves an exited child to whoever waits for it."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL)
    except ChildProcessError:
        return False
    return True


@functools.cache
def children_listed() -> bool:
    """Whether this kernel lists a thread's children (/proc/<pid>/task/<tid>/children)."""
    return os.path.exists("/proc/thread-self/children")


def descendants(pid: int) -> dict[int, Proc]:
    """Every process below `pid`, by pid, found down the children lists (the stat files read are
    only theirs, not every process's on the machine).

    Meant for a child subreaper `pid`: a process whose parent dies during the walk moves to `pid`,
    so `pid`'s children are read again after the walk, until no new one shows up."""
    found: dict[int, Proc] = {}
    tried: set[int] = set()
    for _ in range(_DESCENDANT_PASSES):
        pending = list(children(pid) - tried)
        if not pending:
            break
        while pending:
            child = pending.pop()
            if child in tried:
                continue
            tried.add(child)
            if (proc := read(child)) is not None:
                found[child] = proc
                pending.extend(children(child))
    return found


def with_descendants(procs: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    """`roots` and every process below them in the tree `procs` describes."""
    by_parent: dict[int, list[int]] = {}
    for proc in procs.values():
        by_parent.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    pending = [pid for pid in roots if pid in procs]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(by_parent.get(pid, ()))
    return found


def kill(procs: Iterable[Proc], wait_s: float) -> set[int]:
    """SIGKILL each process that still is the one described (same pid and start time), then wait up
    to `wait_s` for them to exit. Returns the pids signalled."""
    handles = []
    signalled = set()
    me = os.getpid()
    for proc in procs:
        if proc.state == "Z" or proc.pid == me:
            continue
        try:
            handle = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            continue
        except OSError:  # no pidfd here (kernel before 5.3): a plain kill after the same check
            if is_alive(proc.pid, proc.start):
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)
            continue
        # Checked after opening: the handle now names this very process whatever happens to the pid.
        if is_alive(proc.pid, proc.start):
            try:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            except OSError:
                os.close(handle)
                continue
            handles.append(handle)
            signalled.add(proc.pid)
        else:
            os.close(handle)
    _wait_exited(handles, wait_s)
    return signalled


def _wait_exited(handles: list[int], wait_s: float) -> None:
    """Wait until every pidfd is readable (its process exited), for at most wait_s; closes them."""
    poller = select.poll()
    for handle in handles:
        poller.register(handle, select.POLLIN)
    pending = set(handles)
    deadline = time.monotonic() + wait_s
    try:
        while pending and (left := deadline - time.monotonic()) > 0:
            for handle, _ in poller.poll(left * 1000):
                poller.unregister(handle)
                pending.discard(handle)
    finally:
        for handle in handles:
            os.close(handle)
