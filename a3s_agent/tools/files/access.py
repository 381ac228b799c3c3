"""Paths beneath the workspace for the file tools, their failures worded for the model.

Every path is resolved beneath the workspace on descriptors (workspace_paths.py): a file is read from the
descriptor that opened it, and written, replaced and deleted by name inside the directory
descriptor the path led to, so a symlink swapped in meanwhile never leads a call out."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..beneath import Located
from ..registry import ToolFailure
from ..workspace_paths import locate_in_workspace


def missing(shown: str) -> ToolFailure:
    return ToolFailure(f"{shown} does not exist; use list_files or search_files to find the right path")


def regular(info: os.stat_result, shown: str) -> os.stat_result:
    """`info` when it is a regular file's; directories and devices fail."""
    if stat.S_ISDIR(info.st_mode):
        raise ToolFailure(f"{shown} is a directory; use list_files to see what it contains")
    if not stat.S_ISREG(info.st_mode):
        raise ToolFailure(f"{shown} is not a regular file")
    return info


def locate(workspace: Path, raw: str, *, follow_final: bool = True) -> Located:
    """locate_in_workspace, its failures worded for the model."""
    try:
        return locate_in_workspace(workspace, raw, follow_final=follow_final)
    except FileNotFoundError as exc:
        raise missing(raw) from exc
    except OSError as exc:
        raise ToolFailure(f"cannot access {raw}: {exc.strerror or exc}") from exc
