"""Keeping every path argument inside the session's workspace."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from .registry import ToolFailure

MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 255


def resolve_in_workspace(workspace: Path, raw: str, *, field: str = "path") -> Path:
    """The absolute, symlink-resolved path for `raw`, refused unless it lies inside `workspace`.

    Relative paths are taken from the workspace; absolute ones must already point
    inside it. `..`, symlinks leading out, NUL bytes and over-long paths are refused.
    """
    if "\x00" in raw:
        raise ToolFailure(f"{field} contains a NUL byte")
    if len(raw) > MAX_PATH_CHARS:
        raise ToolFailure(f"{field} is longer than {MAX_PATH_CHARS} characters")
    if any(len(part) > MAX_NAME_CHARS for part in raw.split("/")):
        raise ToolFailure(f"{field} has a name longer than {MAX_NAME_CHARS} characters")
    root = _resolved_root(workspace)
    candidate = Path(raw) if os.path.isabs(raw) else root / raw
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:  # symlink loops, unreadable parents
        raise ToolFailure(f"{field} {raw!r} cannot be resolved: {exc}") from exc
    if resolved != root and root not in resolved.parents:
        raise ToolFailure(f"{field} {raw!r} is outside the workspace {root}")
    return resolved


@lru_cache(maxsize=256)
def _resolved_root(workspace: Path) -> Path:
    """Workspaces are few and resolving one costs a syscall per component: resolve each once."""
    return workspace.resolve()


def relative_to_workspace(workspace: Path, path: Path) -> str:
    """How a path is shown to users and models: relative to the workspace, '.' for the root."""
    rel = path.relative_to(_resolved_root(workspace))
    return rel.as_posix() if rel.parts else "."
