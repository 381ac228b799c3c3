"""Putting a workspace's files back to a tree of its shadow repository, all or nothing.

Before the first file changes, the plan (the tree, the files to write and to delete) is written to
a journal beside the shadow repository, durably; once every file is in place the journal goes. A
server killed in between finds the journal when it starts (or before the workspace's next
checkpoint operation) and carries the plan out again from the start: every step is idempotent, the
contents come from the repository. So a crash leaves the old state (no journal yet) or, once it
is replayed, the new one; never a mix.

Files are written through a temporary file renamed over the old one, and every path is resolved
beneath the workspace without following a symlink out of it (tools/beneath.py).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import shutil
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

from .atomic import sync_directory, write_atomically
from .beneath import DIRECTORY_HANDLE, OutsideRoot, locate_beneath
from .shadow_repo import ShadowRepo, file_lock

JOURNAL = "restore.journal"
_LOCK = "restore.lock"
_STAGING = "restore-staging"


@dataclass(frozen=True)
class Plan:
    tree: str
    writes: list[str]  # paths to take from the tree
    deletes: list[str]  # paths to remove


class RestoreFailed(Exception):
    """Some paths could not be put back (named in the message)."""


def workspace_lock(repo: ShadowRepo) -> AbstractAsyncContextManager[None]:
    """One restore (or fork copy) of a workspace at a time, across processes sharing the volume."""
    return file_lock(repo.root / _LOCK, f"another restore of {repo.workspace}")


async def restore(repo: ShadowRepo, plan: Plan) -> None:
    """Carry `plan` out under the journal (the caller holds workspace_lock); RestoreFailed, with
    nothing changed, when a file would have to replace a directory that holds more than the plan
    deletes (files no checkpoint holds: ignored or skipped ones)."""
    blocked = await asyncio.to_thread(_blocked, repo.workspace, plan)
    if blocked:
        raise RestoreFailed(
            "nothing was restored: these directories hold files no checkpoint has (ignored or skipped"
            f" ones), and a restored file would take their place: {', '.join(blocked[:20])}"
        )
    journal = repo.root / JOURNAL
    data = {
        "workspace": str(repo.workspace),
        "tree": plan.tree,
        "writes": plan.writes,
        "deletes": plan.deletes,
    }
    await asyncio.to_thread(write_atomically, journal, json.dumps(data).encode())
    try:
        await _carry_out(repo, plan)
    except RestoreFailed:  # what could be done is done: carrying it out again would fail the same way
        await asyncio.to_thread(_finish, journal)
        raise
    await asyncio.to_thread(_finish, journal)


async def replay(repo: ShadowRepo) -> bool:
    """Finish a restore a crash interrupted, if its journal is there; whether there was one."""
    journal = repo.root / JOURNAL
    try:
        data = json.loads(journal.read_bytes())
    except FileNotFoundError:
        return False
    try:
        await _carry_out(repo, Plan(data["tree"], list(data["writes"]), list(data["deletes"])))
    finally:
        await asyncio.to_thread(_finish, journal)
    return True


def _blocked(workspace: Path, plan: Plan) -> list[str]:
    """The paths to write that are directories now holding something the plan does not delete."""
    deleted = set(plan.deletes)
    blocked = []
    for path in plan.writes:
        target = workspace / path
        if not target.is_dir() or target.is_symlink():
            continue
        for top, dirs, names in os.walk(target):
            rel = Path(top).relative_to(workspace).as_posix()
            if any(f"{rel}/{name}" not in deleted for name in names) or any(
                (Path(top) / d).is_symlink() and f"{rel}/{d}" not in deleted for d in dirs
            ):
                blocked.append(path)
                break
    return blocked


def _finish(journal: Path) -> None:
    os.sync()  # every file written is on disk before the journal that would redo it goes
    journal.unlink(missing_ok=True)
    fd = os.open(journal.parent, DIRECTORY_HANDLE)
    try:
        sync_directory(fd)
    finally:
        os.close(fd)


async def _carry_out(repo: ShadowRepo, plan: Plan) -> None:
    staging = repo.root / _STAGING
    await asyncio.to_thread(shutil.rmtree, staging, True)
    try:
        await repo.materialize(plan.tree, plan.writes, staging)
        problems = await asyncio.to_thread(_apply, repo.workspace, staging, plan)
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
    if problems:
        raise RestoreFailed("could not restore " + "; ".join(problems[:20]))


def _apply(workspace: Path, staging: Path, plan: Plan) -> list[str]:
    root_fd = os.open(workspace, DIRECTORY_HANDLE)
    problems: list[str] = []
    try:
        for path in plan.deletes:
            _step(problems, path, lambda p: _delete(root_fd, str(workspace), p))
        for path in sorted({os.path.dirname(p) for p in plan.deletes}, key=len, reverse=True):
            _remove_empty_dirs(root_fd, str(workspace), path)
        for path in plan.writes:
            _step(problems, path, lambda p: _write(root_fd, str(workspace), p, staging / p))
    finally:
        os.close(root_fd)
    return problems


def _step(problems: list[str], path: str, action: Callable[[str], None]) -> None:
    try:
        action(path)
    except (OSError, OutsideRoot) as exc:
        problems.append(f"{path}: {exc}")


def _delete(root_fd: int, root: str, path: str) -> None:
    with locate_beneath(root_fd, root, path, follow_final=False) as place:
        try:
            os.unlink(place.name, dir_fd=place.dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            return


def _remove_empty_dirs(root_fd: int, root: str, directory: str) -> None:
    while directory:
        try:
            with locate_beneath(root_fd, root, directory, follow_final=False) as place:
                os.rmdir(place.name, dir_fd=place.dir_fd)
        except (OSError, OutsideRoot):
            return
        directory = os.path.dirname(directory)


def _write(root_fd: int, root: str, path: str, source: Path) -> None:
    info = os.lstat(source)
    with locate_beneath(root_fd, root, path, follow_final=False, create_dirs=True) as place:
        temp = f".{place.name[:200]}.{secrets.token_hex(6)}.restore"
        if os.path.islink(source):
            os.symlink(os.readlink(source), temp, dir_fd=place.dir_fd)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(temp, flags, info.st_mode & 0o777, dir_fd=place.dir_fd)
            with os.fdopen(fd, "wb") as out, open(source, "rb") as given:
                shutil.copyfileobj(given, out)
                os.fchmod(out.fileno(), info.st_mode & 0o777)
        try:
            os.replace(temp, place.name, src_dir_fd=place.dir_fd, dst_dir_fd=place.dir_fd)
        except OSError as exc:
            os.unlink(temp, dir_fd=place.dir_fd)
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY):
                raise OSError(exc.errno, "a directory is in the way", path) from None
            raise
