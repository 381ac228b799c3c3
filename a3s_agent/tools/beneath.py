"""Opening paths beneath a directory descriptor, never following a symlink out of it.

Checking a path and then opening it by name races: a symlink swapped in between leads out. Here
every step goes through descriptors instead. Linux 5.6 and later resolve a whole path in one call,
openat2 with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS. Elsewhere, and for what openat2 refuses but
may still lie inside (an absolute symlink pointing back in), a portable walk opens one component at
a time with O_NOFOLLOW from the directory already opened, and resolves each symlink itself: a target
is followed from the directory holding the link, an absolute one only if it names a place under the
root's path, and `..` never climbs above the root. The directories are held open while walking, so
swapping a name afterwards changes nothing about where the walk already is.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass

MAX_SYMLINKS = 40  # as the kernel's own limit: more hops than this is a loop

_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
# A directory held only to resolve and create names in (O_PATH: no read permission needed).
DIRECTORY_HANDLE = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
_DIRECTORY = DIRECTORY_HANDLE | os.O_NOFOLLOW


class OutsideRoot(Exception):
    """The path leads out of the directory it is resolved beneath."""


@dataclass(frozen=True)
class Located:
    """Where a path leads: the entry `name` in the open directory `dir_fd`. Closing it (or leaving
    its `with` block) closes the directory."""

    dir_fd: int
    name: str  # never a symlink that was followed; "." when the path leads to the root itself
    rel: str  # the entry's path below the root, "." for the root

    def close(self) -> None:
        os.close(self.dir_fd)

    def __enter__(self) -> Located:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _syscall() -> Callable[..., int] | None:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        return None
    function = ctypes.CDLL(None, use_errno=True).syscall
    function.restype = ctypes.c_long
    return function


_SYSCALL = _syscall()


def _openat2(dir_fd: int, path: str, flags: int) -> int:
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        raise OSError(errno.EINVAL, "path contains a NUL byte", path)
    if _SYSCALL is None:
        raise OSError(errno.ENOSYS, "openat2 is not available on this platform", path)
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    while True:
        fd = _SYSCALL(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_long(dir_fd),
            encoded,
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code != errno.EINTR:
            raise OSError(code, os.strerror(code), path)


def _probe() -> bool:
    """Whether this kernel (and any seccomp filter around it) lets openat2 through."""
    if _SYSCALL is None:
        return False
    try:
        os.close(_openat2(_AT_FDCWD, ".", _DIRECTORY))
    except OSError:
        return False
    return True


openat2_enabled = _probe()  # else every open goes through the portable walk


def open_beneath(root_fd: int, root_path: str, rel: str, flags: int) -> int:
    """A descriptor for the existing `rel` below `root_fd`, opened with `flags` (no O_CREAT); symlinks
    are followed only while they stay beneath it. OutsideRoot when the path leads out; OSError as
    open(2) fails otherwise."""
    global openat2_enabled
    if openat2_enabled:
        try:
            return _openat2(root_fd, rel, flags)
        except OSError as exc:
            if exc.errno == errno.ENOSYS:
                openat2_enabled = False
            # EXDEV: a step out, or an absolute symlink that may point back in; EAGAIN: a rename
            # raced a `..`. The walk tells which and is race-free itself.
            elif exc.errno not in (errno.EXDEV, errno.EAGAIN):
                raise
    with locate_beneath(root_fd, root_path, rel) as place:
        return os.open(place.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=place.dir_fd)


def below(path: str, root_path: str) -> str | None:
    """`path` relative to `root_path` when it names a place under it (textually), else None."""
    if path == root_path:
        return "."
    prefix = root_path.rstrip("/") + "/"
    return (path[len(prefix) :].lstrip("/") or ".") if path.startswith(prefix) else None


def locate_beneath(
    root_fd: int, root_path: str, rel: str, *, follow_final: bool = True, create_dirs: bool = False
) -> Located:
    """The directory holding the entry `rel` leads to, and the entry's name, found by the portable walk.

    Symlinks on the way are resolved (the final one too unless `follow_final` is false); the entry
    itself need not exist. `create_dirs` creates missing directories on the way. OutsideRoot when the
    path leads out of `root_path` (whose open descriptor is `root_fd`); OSError for a missing
    directory on the way, a component that is not a directory, or more than MAX_SYMLINKS symlinks.
    """
    dirs: list[tuple[int, str]] = [(os.dup(root_fd), "")]  # the directories entered, root first
    pending = rel.split("/")[::-1]  # components still to resolve, the next one last
    hops = 0
    try:
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if len(dirs) == 1:
                    raise OutsideRoot(rel)
                os.close(dirs.pop()[0])
                continue
            if not pending:  # the final component: the entry itself
                target = _link_target(dirs[-1][0], name) if follow_final else None
                if target is None:
                    return _located(dirs, name)
            else:
                opened = _enter(dirs[-1][0], name, create_dirs)
                if isinstance(opened, int):
                    dirs.append((opened, name))
                    continue
                target = opened
            hops += 1
            if hops > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
            if target.startswith("/"):
                inside = below(target, root_path)
                if inside is None:
                    raise OutsideRoot(rel)
                while len(dirs) > 1:
                    os.close(dirs.pop()[0])
                target = inside
            pending += target.split("/")[::-1]
        if len(dirs) == 1:  # the path ends at the root itself
            return Located(dirs.pop()[0], ".", ".")
        fd, name = dirs.pop()  # the path ends at a directory already entered: name it from its parent
        os.close(fd)
        return _located(dirs, name)
    finally:
        for fd, _ in dirs:
            os.close(fd)


def _located(dirs: list[tuple[int, str]], name: str) -> Located:
    """`name` in the innermost directory, taking that directory's descriptor out of `dirs`."""
    parents = [part for _, part in dirs[1:]]
    fd, _ = dirs.pop()
    return Located(fd, name, "/".join([*parents, name]))


def _link_target(dir_fd: int, name: str) -> str | None:
    """The target of the symlink `name`, None when it is something else or nothing."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT):
            return None
        raise


def _enter(dir_fd: int, name: str, create: bool) -> int | str:
    """The directory `name` opened (created first if missing and `create`), or its target if it is a symlink."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:  # ENOTDIR or ELOOP: a symlink, or something that is no directory
        target = _link_target(dir_fd, name) if exc.errno in (errno.ENOTDIR, errno.ELOOP) else None
        if target is None:
            raise
        return target
    try:
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    except FileExistsError:  # made meanwhile (maybe a symlink): look again without creating
        pass
    return _enter(dir_fd, name, create=False)
