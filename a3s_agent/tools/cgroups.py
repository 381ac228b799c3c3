"""cgroup v2 directories for tool calls, where this process may create them below its own cgroup.

A process in a cgroup cannot leave it by forking, setsid or double-forking; `cgroup.kill` ends
everything inside at once. Creating them needs a writable (delegated) cgroup v2 directory: true
for root and for services with systemd's Delegate=yes; elsewhere `own_directory()` is None.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
from collections.abc import Sequence
from pathlib import Path

_KILL_ROUNDS = 8
SHELL = "/bin/sh"
_JOIN = '{ echo 0 > "$0"; } 2>/dev/null; exec "$@"'


def own_directory() -> Path | None:
    """The cgroup v2 directory this process is in, if this process may create cgroups in it."""
    return _own("0", "cgroup2", None)


def v1_directory(controller: str) -> Path | None:
    """This process's cgroup in the v1 hierarchy of `controller` (a host with both hierarchies, whose
    v2 one lacks the controller), if this process may create cgroups in it."""
    return _own(controller, "cgroup", controller)


def _own(hierarchy: str, filesystem: str, option: str | None) -> Path | None:
    """The directory of this process's cgroup in `hierarchy` ("0" for v2, else a v1 controller's
    name as /proc/self/cgroup lists it), on a mount of `filesystem` (with the super option
    `option`), if this process may create cgroups there."""
    if not os.access(SHELL, os.X_OK):
        return None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    own = None
    for line in lines:
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if (number == "0" and hierarchy == "0") or (number != "0" and hierarchy in names.split(",")):
            own = path
    if own is None:
        return None
    for line in mounts:
        fields, _, tail = line.partition(" - ")
        described = tail.split()
        if described[:1] != [filesystem] or (option and option not in described[-1].split(",")):
            continue
        mount_root, mount_point = fields.split()[3:5]
        relative = os.path.relpath(own, mount_root)
        if relative.startswith(".."):
            continue
        directory = Path(mount_point) / relative
        if os.access(directory, os.W_OK) and os.access(directory / "cgroup.procs", os.W_OK):
            return directory
    return None


def create(path: Path) -> bool:
    """Create the cgroup `path` (parents included); False when this is not allowed here."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return (path / "cgroup.procs").exists()


def command_joining(
    path: Path | None,
    argv: Sequence[str],
    *,
    address_space_bytes: int | None = None,
    also: Sequence[Path] = (),
) -> list[str]:
    """argv, run so that it first moves itself into the cgroup `path` (if any) and those in `also`
    (v1 cgroups that limit it) and limits its address space (RLIMIT_AS, inherited by all it starts)
    to `address_space_bytes` (if given): a shell writes "0" (itself) to their cgroup.procs and runs
    `ulimit -v`, then execs the command under the same pid. No Python runs between fork and exec (a
    preexec_fn would force a fork of the multi-threaded server, which crashes gRPC's fork handlers).
    If a move is refused, the command runs where it is: the other containment holds. If the limit
    is refused, the command does not run."""
    script = ""
    if address_space_bytes is not None:
        script += f"ulimit -v {max(address_space_bytes // 1024, 1)} || exit 126; "
    for other in also:
        script += f"{{ echo 0 > {shlex.quote(str(other / 'cgroup.procs'))}; }} 2>/dev/null; "
    if path is not None:
        script += _JOIN
    else:
        script += 'exec "$@"'
    procs = str(path / "cgroup.procs") if path is not None else SHELL
    return [SHELL, "-c", script, procs, *argv]


def limit(path: Path, control: str, value: int) -> bool:
    """Write a limit to the cgroup's `control` file: memory.max (bytes), pids.max (processes and
    threads at once, a fork or clone beyond failing with EAGAIN; v2, or a v1 pids cgroup); False
    where it has no such file (its controller not enabled for it)."""
    try:
        (path / control).write_text(str(value))
    except OSError:
        return False
    return True


def enable(path: Path, controller: str) -> bool:
    """Let the cgroups below `path` use `controller` (memory, pids) where the hierarchy allows it
    (the controller enabled above it, no process in `path` itself); whether they may."""
    with contextlib.suppress(OSError):
        (path / "cgroup.subtree_control").write_text(f"+{controller}")
    try:
        return controller in (path / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def populated(path: Path) -> bool | None:
    """Whether a process runs in the cgroup or below it (cgroup.events; a zombie does not count);
    None when the cgroup is gone or unreadable."""
    try:
        fd = os.open(path / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        events = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"populated 1" in events


def kill(path: Path) -> set[int]:
    """SIGKILL every process in the cgroup and its sub-cgroups; returns the pids that were inside."""
    if populated(path) is False:
        return set()  # nothing inside: no walk, no write
    found = set(_all_procs(path))
    try:
        (path / "cgroup.kill").write_text("1")
        return found
    except FileNotFoundError:  # no cgroup.kill before Linux 5.14: list and kill, until none is left
        pass
    except OSError:
        return set()
    for _ in range(_KILL_ROUNDS):
        pids = _all_procs(path)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return found


def remove(path: Path) -> bool:
    """Remove the cgroup and its sub-cgroups; False while a process (even a dying one) is inside."""
    try:
        path.rmdir()  # the common case: no sub-cgroup, nothing inside
        return True
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: it has sub-cgroups, or is populated
        pass
    for sub in _bottom_up(path):
        try:
            sub.rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # EBUSY while populated
            return False
    return True


def _bottom_up(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    return [Path(root) for root, _, _ in os.walk(path, topdown=False)]


def _all_procs(path: Path) -> list[int]:
    pids: list[int] = []
    for sub in _bottom_up(path):
        with contextlib.suppress(OSError):
            pids += map(int, (sub / "cgroup.procs").read_text().split())
    return pids
