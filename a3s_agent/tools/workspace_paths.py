"""Keeping every path argument inside the session's workspace.

`open_in_workspace` and `locate_in_workspace` resolve beneath the workspace on descriptors
(beneath.py), so a symlink swapped in while a tool works cannot lead it out. `resolve_in_workspace`
returns a checked path that the caller then opens by name: fine for a path handed to a subprocess,
but it races a concurrent swap, so the file tools do not use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from .beneath import DIRECTORY_HANDLE, Located, OutsideRoot, below, locate_beneath, open_beneath
from .registry import ToolFailure

MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 255


def _check_raw(raw: str, field: str) -> None:
    if "\x00" in raw:
        raise ToolFailure(f"{field} contains a NUL byte")
    if len(raw) > MAX_PATH_CHARS:
        raise ToolFailure(f"{field} is longer than {MAX_PATH_CHARS} characters")
    if any(len(part) > MAX_NAME_CHARS for part in raw.split("/")):
        raise ToolFailure(f"{field} has a name longer than {MAX_NAME_CHARS} characters")


def _outside(workspace: Path, raw: str, field: str) -> ToolFailure:
    return ToolFailure(f"{field} {raw!r} is outside the workspace {workspace_root(workspace)}")


def resolve_in_workspace(workspace: Path, raw: str, *, field: str = "path") -> Path:
    """The absolute, symlink-resolved path for `raw`, refused unless it lies inside `workspace`.

    Relative paths are taken from the workspace; absolute ones must already point
    inside it. `..`, symlinks leading out, NUL bytes and over-long paths are refused.
    """
    _check_raw(raw, field)
    root = workspace_root(workspace)
    candidate = Path(raw) if os.path.isabs(raw) else root / raw
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:  # symlink loops, unreadable parents
        raise ToolFailure(f"{field} {raw!r} cannot be resolved: {exc}") from exc
    if resolved != root and root not in resolved.parents:
        raise _outside(workspace, raw, field)
    return resolved


def _below_workspace(workspace: Path, raw: str, field: str) -> str:
    """`raw` as a path relative to the workspace; an absolute one must name the workspace's own path
    (as configured or resolved), not an alias of it."""
    _check_raw(raw, field)
    if not os.path.isabs(raw):
        return raw or "."
    for base in (str(workspace_root(workspace)), os.path.abspath(workspace)):
        inside = below(raw, base)
        if inside is not None:
            return inside
    raise _outside(workspace, raw, field)


@contextmanager
def _root_fd(workspace: Path) -> Iterator[int]:
    fd = os.open(workspace_root(workspace), DIRECTORY_HANDLE)
    try:
        yield fd
    finally:
        os.close(fd)


def open_in_workspace(workspace: Path, raw: str, flags: int, *, field: str = "path") -> int:
    """A descriptor (the caller's to close) for `raw` opened with `flags`, symlinks followed only while
    they stay inside the workspace: ToolFailure when the path leads out, OSError as open(2) fails."""
    rel = _below_workspace(workspace, raw, field)
    with _root_fd(workspace) as root_fd:
        try:
            return open_beneath(root_fd, str(workspace_root(workspace)), rel, flags)
        except OutsideRoot:
            raise _outside(workspace, raw, field) from None


def locate_in_workspace(
    workspace: Path,
    raw: str,
    *,
    field: str = "path",
    follow_final: bool = True,
    create_parents: bool = False,
) -> Located:
    """The open directory holding the entry `raw` leads to, and the entry's name in it (see Located;
    use it in a `with` block to close the directory).

    Work on the entry with dir_fd-relative calls (os.stat(name, dir_fd=...), os.unlink, os.replace with
    src_dir_fd/dst_dir_fd): whatever is swapped meanwhile, they stay in that directory. Symlinks
    are followed inside the workspace, the final one only with `follow_final`; `create_parents`
    creates missing directories on the way. ToolFailure when the path leads out; OSError for a
    missing directory on the way and the like.
    """
    rel = _below_workspace(workspace, raw, field)
    with _root_fd(workspace) as root_fd:
        try:
            return locate_beneath(
                root_fd,
                str(workspace_root(workspace)),
                rel,
                follow_final=follow_final,
                create_dirs=create_parents,
            )
        except OutsideRoot:
            raise _outside(workspace, raw, field) from None


@lru_cache(maxsize=256)
def workspace_root(workspace: Path) -> Path:
    """The workspace, symlink-resolved. Workspaces are few and resolving one costs a syscall per
    component: each is resolved once."""
    return workspace.resolve()


def relative_to_workspace(workspace: Path, path: Path) -> str:
    """How a path is shown to users and models: relative to the workspace, '.' for the root."""
    rel = path.relative_to(workspace_root(workspace))
    return rel.as_posix() if rel.parts else "."
