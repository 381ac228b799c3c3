"""Writing a file so that readers never see half of it."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from pathlib import Path

from .beneath import DIRECTORY_HANDLE


def write_atomically(target: Path, data: bytes, mode: int | None = None) -> None:
    """Write through a temporary file in the same directory and rename it over `target`.

    `mode` (e.g. the replaced file's permission bits) is kept; without it a new file gets the
    umask's default. Missing parent directories are created.
    """
    try:
        dir_fd = os.open(target.parent, DIRECTORY_HANDLE)
    except FileNotFoundError:  # a missing parent: create it only then (one syscall less per write)
        target.parent.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(target.parent, DIRECTORY_HANDLE)
    try:
        write_atomically_at(dir_fd, target.name, data, mode)
    finally:
        os.close(dir_fd)


def write_atomically_at(dir_fd: int, name: str, data: bytes, mode: int | None = None) -> None:
    """write_atomically for the entry `name` of the open directory `dir_fd`: the temporary file is made
    and renamed in that directory, whatever its path has become meanwhile. The data is fsynced
    before the rename, so after a crash the file holds the old or the new content; the directory
    is fsynced after it, so once this returns the new content survives a power loss too."""
    temp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o666 if mode is None else mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    sync_directory(dir_fd)


def replace_file(target: Path, data: bytes) -> None:
    """Write through a temporary file renamed over `target`, without write_atomically's fsyncs: for
    records that only matter after the server died while the machine ran on (the page cache holds
    them), which a reader, or a server killed mid-write, must never see half of."""
    temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(6)}.tmp")
    try:
        temp.write_bytes(data)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def copy_file(source: Path, target: Path) -> None:
    """Copy `source` over `target` so that `target` is never seen half written (no fsync, as
    `replace_file`)."""
    temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(6)}.tmp")
    try:
        shutil.copyfile(source, temp)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def sync_directory(dir_fd: int) -> None:
    """fsync the directory `dir_fd` (an O_PATH handle will do), making its renames durable.

    Skipped where that cannot be done: a directory we may write but not read cannot be opened for
    the fsync, and some file systems refuse to fsync a directory (EINVAL)."""
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)
