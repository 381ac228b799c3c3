"""The other names a file operation's path has in the workspace, so a policy decides on all of them.

A path is only a spelling: `notes.txt` may be a symlink to `.env`, `cfg/` a symlink to `.git`, and
`copy.txt` a hard link to `id_rsa`. `target_name` is where the path leads (symlinks resolved, also
for a file not created yet, so a write through a symlinked directory is decided on the name it
would create); `hard_links` finds the other links of a file with more than one, by a walk of the
workspace that compares inode numbers from the directory entries (one readdir per directory, a
stat only for an entry with the same inode) and stops once every link is found.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path

from ..tools.registry import ToolFailure
from ..tools.workspace_paths import relative_to_workspace, resolve_in_workspace


def target_name(
    workspace: Path, raw: str, *, follow: bool = True
) -> tuple[str, os.stat_result | None] | None:
    """Where `raw` leads, relative to the workspace, and its lstat (None if it does not exist).

    `follow=False` keeps a final symlink itself (deleteFile removes the link, not its target).
    None when the path cannot be resolved inside the workspace: the operation fails on it anyway.
    """
    try:
        target = resolve_in_workspace(workspace, raw)
        if not follow:
            parent = resolve_in_workspace(workspace, posixpath.dirname(raw) or ".")
            entry = parent / posixpath.basename(raw)
            if entry.is_symlink():
                target = entry
    except ToolFailure:
        return None
    try:
        info = target.lstat()
    except OSError:
        info = None
    return relative_to_workspace(workspace, target), info


def has_other_links(info: os.stat_result | None) -> bool:
    return info is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def hard_links(workspace: Path, info: os.stat_result) -> list[str]:
    """The workspace paths of the file `info` describes (every hard link to it inside the workspace)."""
    root = resolve_in_workspace(workspace, ".")
    found: list[str] = []
    pending = [str(root)]
    while pending and len(found) < info.st_nlink:
        directory = pending.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if (
                        entry.inode() == info.st_ino
                        and entry.stat(follow_symlinks=False).st_dev == info.st_dev
                    ):
                        found.append(os.path.relpath(entry.path, root))
                    elif entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                except OSError:
                    continue
    return found
