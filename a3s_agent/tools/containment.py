"""Containment: nothing a tool starts outlives its call, the server, or a crash of the server.

Every tool process (bash, run_script, skills, formatters, rg, Agent Spaces shells, coven's git) is
started inside a `tool_call()` scope; when the call ends (normally, on timeout or cancellation)
everything the scope owns is killed. Three nets catch a process that left its process group:

- a cgroup v2 per call, where this process may create cgroups (`cgroup.kill` ends everything in
  it, whatever its session or parent); a call's cgroup found empty at its end is kept for a later
  call, which checks it is still empty before using it (what entered it meanwhile is killed, and the
  cgroup dropped); the server's stop and the restart after a crash kill the whole tree;
- a marker in the environment of the call's first process, `A3S_AGENT_SCOPE=<data dir key>:<server
  pid>-<start>:<call>`, which everything it starts inherits: processes carrying it are killed;
- the server as a child subreaper: an orphan reparents to the server instead of init, so one that
  also dropped the marker is still found (and its zombie reaped by the server, never with
  waitpid(-1): only zombies outside the server's own session that no one else waits for).

While the server is a subreaper, a call's kill looks only among the server's descendants (read
down the /proc children lists): whatever a call started and still runs is one, since an orphan
goes to the nearest subreaper above it, never to init. Otherwise it reads every process on the
machine, as recovery (a dead server's processes are no one's descendants) and the server's stop do.

Each call's first process (pid and start time) and cgroup are recorded in <data dir>/processes.json;
the next start after a crash kills what is recorded and every process carrying this data dir's marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import itertools
import json
import logging
import os
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import cgroups, procfs, sandbox
from .atomic import replace_file

MARKER = "A3S_AGENT_SCOPE"
CGROUPS_VARIABLE = "A3S_TOOL_CGROUPS"
"""Set to 0 to keep tool calls out of cgroups even where they could be created."""
RECORD_NAME = "processes.json"
_PR_SET_CHILD_SUBREAPER = 36
_KILL_ROUNDS = 8
_KILL_WAIT_S = 0.5
_REAP_RETRY_S = 0.05
_IN_PLACE_BYTES = 4096
"""The longest record rewritten in place (one page); a longer one is replaced through a rename."""
_SPARE_CGROUPS = 8
"""Emptied call cgroups kept for the next calls (each reuse saves a mkdir and an rmdir)."""

log = logging.getLogger(__name__)


class CallScope:
    """The processes of one tool call: what to add to its environment and its spawn, and its kill."""

    def __init__(self, owner: Containment, number: int, place: sandbox.Place) -> None:
        self.owner = owner
        self.marker = f"{owner.key}:{owner.server}:{number}"
        self.cgroup: Path | None = None
        self.root: procfs.Proc | None = None
        self.spawning = True
        self.emptied = False  # its cgroup held no process when the call was killed
        self._killed = False
        self.sandbox = sandbox.current().open(place)
        self.cgroup = owner.call_cgroup(number)

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` with the call's sandbox HOME and TMPDIR, and its marker (which no caller's value may
        replace)."""
        return {**self.sandbox.environment(env), MARKER: self.marker}

    def command(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> list[str]:
        """argv as it must be spawned (with `pass_fds`): in the call's sandbox, entering the call's
        cgroup first where it has one, within its memory limit. Raises what Popen would for a
        program that cannot be run (the shell entering the cgroup and the sandbox exec it), and
        SandboxUnavailable when no sandbox works here."""
        memory = self.sandbox.memory_bytes
        if self.cgroup is not None or self.sandbox.active or memory is not None:
            _check_program(argv[0], cwd, env)
        launch = self.sandbox.command(argv)
        by_cgroup = (
            memory is not None
            and self.cgroup is not None
            and cgroups.limit(self.cgroup, "memory.max", memory)
        )
        # Landlock's launcher sets RLIMIT_DATA itself; for bwrap (which cannot) the shell in front sets RLIMIT_AS.
        address_space = None if by_cgroup or self.sandbox.mechanism == "landlock" else memory
        if self.cgroup is None and address_space is None:
            return launch.argv
        also = self.owner.limiting(self.cgroup)
        return cgroups.command_joining(self.cgroup, launch.argv, address_space_bytes=address_space, also=also)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptors the spawned process must inherit (its sandbox's instructions)."""
        return tuple(fd for launch in self.sandbox.launches for fd in launch.pass_fds)

    def started(self, pid: int) -> None:
        """The call's first process is running (call right after the spawn returns)."""
        self.root = procfs.read(pid)
        self.spawning = False
        self.sandbox.spawned()
        self.owner.save()

    def kill(self) -> None:
        """Kill every process of the call, wherever it went (waiting for them to exit)."""
        self._killed = True
        self.owner.kill_call(self)

    async def end(self) -> None:
        """`kill`, from the event loop without holding it up: the signals go out here; when some
        process signalled has not exited at once (a big one tearing down its memory, one in
        uninterruptible sleep), the waiting, and the rounds for what it forks meanwhile, happen on
        a worker thread. A call whose processes all ended by themselves costs no thread."""
        self._killed = True
        if self.owner.kill_call(self, wait_s=0):
            await asyncio.to_thread(self.owner.kill_call, self)

    def close(self) -> None:
        """The call is over (its first process reaped): kill what is left and forget the call."""
        self.spawning = False
        if not self._killed:
            self.kill()
        self.sandbox.close()
        self.owner.forget(self)


class Containment:
    """The tool processes of one server: its calls, its record on disk, its cgroups."""

    def __init__(self, data_dir: Path | None, use_cgroups: bool) -> None:
        self.pid, self.session = os.getpid(), os.getsid(0)  # the server never changes its session
        me = procfs.read(self.pid)
        self.server = f"{self.pid}-{me.start if me else 0}"
        self.key = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16] if data_dir else "none"
        self.record_path = data_dir / RECORD_NAME if data_dir is not None else None
        self.own_cgroup = cgroups.own_directory() if use_cgroups else None
        self.cgroup_dir: Path | None = None
        self.processes = sandbox.current().settings.processes
        self.pids_v1: Path | None = None  # the v1 pids cgroup where call cgroups get their pids.max
        if self.own_cgroup is not None and cgroups.create(self.own_cgroup / self._run_name(self.server)):
            self.cgroup_dir = self.own_cgroup / self._run_name(self.server)
            if sandbox.current().settings.memory_bytes is not None:
                cgroups.enable(self.cgroup_dir, "memory")
            if not cgroups.enable(self.cgroup_dir, "pids"):  # a host that has it in a v1 hierarchy
                self.pids_v1 = cgroups.v1_directory("pids")
        self.subreaper = False
        self.closed = False
        self._calls: dict[int, CallScope] = {}
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._record_lock = threading.Lock()
        self._stale_cgroups: set[Path] = set()
        self._spare_cgroups: list[Path] = []
        self._record_size: int | None = None  # how long the record on disk is, once written
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run_name(self, server: str) -> str:
        return f"a3s-agent.{self.key}.{server}"

    # --- calls -----------------------------------------------------------------------------

    def open_call(self, place: sandbox.Place) -> CallScope:
        scope = CallScope(self, next(self._numbers), place)
        with self._lock:
            self._calls[id(scope)] = scope
        return scope

    def call_cgroup(self, number: int) -> Path | None:
        """A cgroup for a new call: a spare one that is still empty, else a new one. A spare that a
        process entered meanwhile (whatever it is: nothing of ours runs there) is killed and dropped."""
        if self.cgroup_dir is None:
            return None
        while True:
            with self._lock:
                spare = self._spare_cgroups.pop() if self._spare_cgroups else None
            if spare is None:
                break
            if cgroups.populated(spare) is False:
                return spare
            self._kill_cgroup(spare)
        path = self.cgroup_dir / f"call-{number}"
        if not cgroups.create(path):
            return None
        if self.pids_v1 is None:
            cgroups.limit(path, "pids.max", self.processes)
        elif (mirror := self._mirror(path)) is not None and cgroups.create(mirror):
            cgroups.limit(mirror, "pids.max", self.processes)
        return path

    def _mirror(self, path: Path | None) -> Path | None:
        """The v1 pids cgroup beside the v2 cgroup `path`, on a host that has the pids controller in
        a v1 hierarchy (None elsewhere)."""
        if path is None or self.pids_v1 is None or self.own_cgroup is None:
            return None
        if not path.is_relative_to(self.own_cgroup):
            return None
        return self.pids_v1 / path.relative_to(self.own_cgroup)

    def limiting(self, cgroup: Path | None) -> tuple[Path, ...]:
        """The cgroups a call's first process joins besides its cgroup `cgroup`: its v1 pids mirror,
        where its process limit is counted."""
        mirror = self._mirror(cgroup)
        return () if mirror is None else (mirror,)

    def _remove(self, path: Path) -> bool:
        """Remove one of our cgroups and its v1 pids mirror; False while a process is inside either."""
        removed = cgroups.remove(path)
        mirror = self._mirror(path)
        return (cgroups.remove(mirror) if mirror is not None else True) and removed

    def forget(self, scope: CallScope) -> None:
        with self._lock:
            self._calls.pop(id(scope), None)
            kept = scope.emptied and len(self._spare_cgroups) < _SPARE_CGROUPS and not self.closed
            if kept and scope.cgroup is not None:
                self._spare_cgroups.append(scope.cgroup)
        if scope.cgroup is not None and not kept and not self._remove(scope.cgroup):
            self._stale_cgroups.add(scope.cgroup)  # a dying process is still inside: retried later
        if self._stale_cgroups:
            self._remove_stale_cgroups()
        # No save: the next call's rewrites the record, and recovery checks each entry anyway.

    def kill_call(self, scope: CallScope, wait_s: float = _KILL_WAIT_S) -> int:
        """Kill the call's processes; how many its rounds signalled. `wait_s` 0: one round, no waiting."""
        if scope.cgroup is not None:
            scope.emptied = cgroups.populated(scope.cgroup) is False
            if not scope.emptied:
                cgroups.kill(scope.cgroup)
        signalled = self._kill_rounds(
            lambda procs: self._belonging_to(scope, procs), self._call_processes(), wait_s
        )
        self._reap_soon()
        return len(signalled)

    def _call_processes(self) -> Callable[[], dict[int, procfs.Proc]]:
        """Where a call's processes can be: as a child subreaper, among the server's descendants
        only (a process that left its parent is adopted by the server, never by init); otherwise
        anywhere on the machine."""
        if self.subreaper and procfs.children_listed():
            return self._descendants
        return procfs.snapshot

    def _descendants(self) -> dict[int, procfs.Proc]:
        """The server's descendants; none without reading /proc when it has no child at all (as a
        subreaper, a process below it that lost its parent became its child)."""
        return procfs.descendants(self.pid) if procfs.has_children() else {}

    def _belonging_to(self, scope: CallScope, procs: dict[int, procfs.Proc]) -> set[int]:
        """The call's first process, every process started since that carries its marker or is in its
        session, their descendants, and (while no other call runs) the server's adopted orphans."""
        root = scope.root
        since = root.start if root is not None else 0
        seeds = set()
        for proc in procs.values():
            if proc.start < since or proc.pid == self.pid:
                continue
            in_tree = root is not None and (
                (proc.pid, proc.start) == (root.pid, root.start) or proc.sid == root.pid
            )
            if in_tree or procfs.environ_value(proc.pid, MARKER) == scope.marker:
                seeds.add(proc.pid)
        with self._lock:
            alone = list(self._calls.values()) == [scope]
        if self.subreaper and alone:
            seeds |= self._adopted(procs)
        return procfs.with_descendants(procs, seeds)

    def _adopted(self, procs: dict[int, procfs.Proc]) -> set[int]:
        """Children of the server from outside its session that are no call's first process: orphans
        it adopted as subreaper (tool processes start in sessions of their own)."""
        with self._lock:
            first = {s.root.pid for s in self._calls.values() if s.root is not None}
        return {
            p.pid
            for p in procs.values()
            if p.ppid == self.pid and p.sid != self.session and p.pid not in first
        }

    @staticmethod
    def _kill_rounds(
        select: Callable[[dict[int, procfs.Proc]], set[int]],
        listing: Callable[[], dict[int, procfs.Proc]] = procfs.snapshot,
        wait_s: float = _KILL_WAIT_S,
    ) -> set[int]:
        """Kill what `select` picks from a fresh `listing` of processes, again until nothing is
        picked (a process may fork between the listing and the kill); with `wait_s` 0 once (what
        was signalled has not exited yet, so a second listing would pick it again). Returns the
        pids signalled."""
        killed: set[int] = set()
        for _ in range(_KILL_ROUNDS if wait_s else 1):
            procs = listing()
            chosen = [procs[pid] for pid in select(procs) if procs[pid].state != "Z"]
            signalled = procfs.kill(chosen, wait_s)
            killed |= signalled
            if not signalled:
                break
        return killed

    # --- zombies ---------------------------------------------------------------------------

    def reap(self) -> None:
        """Reap the zombies of orphans the server adopted; never a process someone else waits for
        (the first process of a call, or anything in the server's own session)."""
        if not self.subreaper:
            return
        with self._lock:
            busy = any(s.spawning for s in self._calls.values())  # a new child not yet known as a call's
            first = {s.root.pid for s in self._calls.values() if s.root is not None}
        if busy:
            if self.loop is not None and not self.loop.is_closed():
                self.loop.call_later(_REAP_RETRY_S, self.reap)
            return
        if not _exited_child():
            return  # no zombie to look for (the scan reads every thread's children)
        for pid in procfs.children(self.pid) - first:
            proc = procfs.read(pid)
            if proc is not None and proc.state == "Z" and proc.sid != self.session:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def _reap_soon(self) -> None:
        """Reap in the event loop's thread (where all spawning happens), from whichever thread."""
        if self.loop is None or self.loop.is_closed():
            return
        try:
            in_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            self.reap()
        else:
            self.loop.call_soon_threadsafe(self.reap)

    # --- the record and start-up -------------------------------------------------------------

    def save(self) -> None:
        """Write processes.json: what a crash of this server would leave behind."""
        if self.record_path is None or self.closed:
            return
        pid, start = self.server.split("-")
        with self._record_lock:  # the calls listed and written together: the last write is the newest
            with self._lock:
                calls = [
                    {"pid": s.root.pid, "start": s.root.start, "marker": s.marker, "cgroup": _text(s.cgroup)}
                    for s in self._calls.values()
                    if s.root is not None
                ]
            record = {
                "server": {"pid": int(pid), "start": int(start)},
                "marker": f"{self.key}:{self.server}",
                "cgroup": _text(self.cgroup_dir),
                "calls": calls,
            }
            try:
                data = json.dumps(record).encode()
                if self._record_size is None or max(len(data), self._record_size) > _IN_PLACE_BYTES:
                    replace_file(self.record_path, data)  # the first (an older record goes), or a long one
                    self._record_size = len(data)
                else:
                    self._record_size = _overwrite(self.record_path, data, self._record_size)
            except OSError as exc:
                log.warning("cannot record tool processes in %s: %s", self.record_path, exc)

    def recover(self) -> int:
        """Kill what a previous server on this data dir left running (it crashed, or was killed);
        returns how many processes were killed. A process is in the server's cgroup, in its call's
        below it and carries the call's marker: counted once, whichever of them found it."""
        record = self._read_record()
        server = record.get("server", {})
        if (server.get("pid"), server.get("start")) != (None, None):
            previous = f"{server['pid']}-{server['start']}"
            if previous != self.server and _server_alive(previous):
                log.warning("another server (pid %s) uses data dir %s", server["pid"], self.record_path)
                return 0
        roots = [
            (call["pid"], call["start"])
            for call in record.get("calls", [])
            if isinstance(call, dict)
            and isinstance(call.get("pid"), int)
            and isinstance(call.get("start"), int)
        ]
        killed: set[int] = set()
        for path in [record.get("cgroup"), *(c.get("cgroup") for c in record.get("calls", []))]:
            if isinstance(path, str) and self._is_ours(Path(path)):
                killed |= self._kill_cgroup(Path(path))
        if self.own_cgroup is not None:
            for path in self.own_cgroup.glob("a3s-agent.*"):
                if path == self.cgroup_dir or _server_alive(path.name.rsplit(".", 1)[-1]):
                    continue
                if path.name.startswith(f"a3s-agent.{self.key}."):
                    killed |= self._kill_cgroup(path)
                else:  # another data dir's: its own restart kills what is inside; an empty one goes
                    self._remove(path)
        if self.pids_v1 is not None:  # v1 mirrors whose v2 cgroup went first; empty ones go
            for path in self.pids_v1.glob("a3s-agent.*"):
                if path != self._mirror(self.cgroup_dir) and not _server_alive(path.name.rsplit(".", 1)[-1]):
                    cgroups.remove(path)
        alive: dict[str, bool] = {}

        def left_behind(procs: dict[int, procfs.Proc]) -> set[int]:
            # A call's first process leads its own session for life: a recorded pid that does not is
            # some other process, whatever the (writable) record says. Its session goes with it.
            leaders = {
                pid: start
                for pid, start in roots
                if (p := procs.get(pid)) is not None and p.start == start and p.sid == pid
            }
            seeds = set()
            for proc in procs.values():
                if proc.sid in leaders and proc.start >= leaders[proc.sid]:
                    seeds.add(proc.pid)
                    continue
                value = procfs.environ_value(proc.pid, MARKER) or ""
                owner, _, rest = value.partition(":")
                owner_server = rest.partition(":")[0]
                if owner == self.key and owner_server != self.server:
                    if owner_server not in alive:
                        alive[owner_server] = _server_alive(owner_server)
                    if not alive[owner_server]:
                        seeds.add(proc.pid)
            return procfs.with_descendants(procs, seeds)

        killed |= self._kill_rounds(left_behind)
        if killed:
            log.warning(
                "killed %d tool process(es) left running by a previous server on this data dir",
                len(killed),
            )
        return len(killed)

    def _is_ours(self, path: Path) -> bool:
        """Whether a recorded cgroup path is one this data dir's servers create (the record is a
        file: never kill a cgroup it merely names)."""
        run = path.parent if path.name.startswith("call-") else path
        return path.is_absolute() and ".." not in path.parts and run.name.startswith(f"a3s-agent.{self.key}.")

    def _kill_cgroup(self, path: Path) -> set[int]:
        killed = cgroups.kill(path)
        if not self._remove(path):
            self._stale_cgroups.add(path)
        return killed

    def _remove_stale_cgroups(self) -> None:
        for path in list(self._stale_cgroups):
            if self._remove(path):
                self._stale_cgroups.discard(path)

    def _read_record(self) -> dict[str, Any]:
        if self.record_path is None:
            return {}
        try:
            record = json.loads(self.record_path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self.record_path, exc)
            return {}
        return record if isinstance(record, dict) else {}

    # --- the server's lifetime -----------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.recover()
        self.save()

    def close(self) -> None:
        """The server stops: kill every tool process it started, remove its cgroups and its record."""
        with self._lock:
            scopes = list(self._calls.values())
        for scope in scopes:
            scope.kill()
        prefix = f"{self.key}:{self.server}:"
        self._kill_rounds(
            lambda procs: procfs.with_descendants(
                procs,
                [
                    p.pid
                    for p in procs.values()
                    if (procfs.environ_value(p.pid, MARKER) or "").startswith(prefix)
                ],
            )
        )
        with self._lock:
            self.closed = True  # no call's cgroup is kept any more
            self._spare_cgroups.clear()
        if self.cgroup_dir is not None:
            self._kill_cgroup(self.cgroup_dir)  # with the spare cgroups, and whatever entered them
        self.reap()
        self.subreaper = False  # nothing of this server's is left to reap
        if self.record_path is not None:
            self.record_path.unlink(missing_ok=True)


def _check_program(program: str, cwd: Path, env: Mapping[str, str]) -> None:
    """What Popen would raise for `program` (a wrapper in front of it would only fail later, inside)."""
    if "/" in program:
        path = os.path.join(cwd, program)
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except OSError:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program) from None
        if is_dir or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _server_alive(server: str) -> bool:
    pid, _, start = server.partition("-")
    return pid.isdigit() and start.isdigit() and procfs.is_alive(int(pid), int(start))


def _overwrite(target: Path, data: bytes, size: int) -> int:
    """Write `data` over the record in place, padded with spaces (which JSON allows) to the `size`
    written before; returns the size now written. A renamed or truncated file would make ext4 start
    writing it out at once (auto_da_alloc: ~0.25 ms of CPU per tool call). Only for records of up
    to _IN_PLACE_BYTES: one write of a page is whole or absent even if the server is killed during
    it, where the kernel may stop a longer one between pages."""
    padded = data.ljust(size)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        os.pwrite(fd, padded, 0)
    finally:
        os.close(fd)
    return len(padded)


def _exited_child() -> bool:
    """Whether some child of the server (of any of its threads) has exited and is not reaped yet;
    WNOWAIT leaves it to whoever waits for it."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # no child at all
        return False


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


# --- the process-wide state --------------------------------------------------------------------

_active: list[Containment] = []
_default: Containment | None = None
_subreaper_state = False


def current() -> Containment:
    """The containment of the running server, or (outside one) a plain one: marker, no record."""
    global _default
    if _active:
        return _active[-1]
    if _default is None:
        _default = Containment(None, use_cgroups=False)
    return _default


@contextlib.contextmanager
def tool_call(place: sandbox.Place) -> Iterator[CallScope]:
    """The scope of one tool call's processes, sandboxed for `place`; everything in it is killed
    when it ends."""
    scope = current().open_call(place)
    try:
        yield scope
    finally:
        scope.close()


def activate(data_dir: Path) -> Containment:
    """Called at server start (in its event loop, the data dir made): kill what a crashed run left,
    then contain every tool process this server starts until `deactivate`."""
    use_cgroups = os.environ.get(CGROUPS_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")
    containment = Containment(data_dir, use_cgroups)
    loop = asyncio.get_running_loop()
    containment.start(loop)
    # A server whose loop ended without deactivate (only in tests) no longer counts.
    _active[:] = [c for c in _active if c.loop is not None and not c.loop.is_closed()]
    if not _subreaper_state:
        _set_subreaper(True)
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
        loop.add_signal_handler(signal.SIGCHLD, _reap_all)
        _quiet_wakeup()
    containment.subreaper = _subreaper_state
    _active.append(containment)
    log.info(
        "tool processes contained by %s, markers%s",
        f"cgroup {containment.cgroup_dir}"
        if containment.cgroup_dir
        else "process trees (no writable cgroup v2)",
        ", subreaper" if containment.subreaper else "",
    )
    return containment


def deactivate(containment: Containment) -> None:
    """Called at server stop: kill every tool process still running."""
    containment.close()
    if containment in _active:
        _active.remove(containment)
    loop = containment.loop
    if loop is not None and not loop.is_closed() and all(c.loop is not loop for c in _active):
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.remove_signal_handler(signal.SIGCHLD)
    if not _active and _subreaper_state:
        _set_subreaper(False)


def _quiet_wakeup() -> None:
    """Let the event loop's wakeup socket fill up silently. A call whose thousands of processes are
    killed at once sends the server a burst of SIGCHLD; once the socket is full, Python would print
    a traceback to stderr for every further signal (a command could flood the server's log). The
    bytes already waiting wake the loop, and one reap takes every exited child. (asyncio sets the
    socket again, warnings on, with each add_signal_handler: whoever adds a signal handler does so
    before the runtime starts.)"""
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup, warn_on_full_buffer=False)


def _reap_all() -> None:
    for containment in _active:
        containment.reap()


def _set_subreaper(on: bool) -> None:
    global _subreaper_state
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0:
            _subreaper_state = on
        else:
            log.warning("cannot become a child subreaper: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:  # not Linux
        log.warning("cannot become a child subreaper: %s", exc)
