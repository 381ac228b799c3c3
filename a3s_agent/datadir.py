"""Where the server keeps its data: outside the workspace, so it never lands in a user's repository.

The default is one directory per workspace under the user's data directory,
`$XDG_DATA_HOME/a3s-agent/workspaces/<name>-<hash of the resolved workspace path>`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

LEGACY_DIR = ".a3s"  # the default before: <workspace>/.a3s
GITIGNORE = "# a3s-agent server data (sessions, Agent Spaces runs): never commit it\n*\n"
LOCK_FILE = "server.lock"


def default_data_dir(workspace: Path, env: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_DATA_HOME/a3s-agent/workspaces/<name>-<hash>`; XDG_DATA_HOME, when unset or not an absolute
    path (as the XDG spec says), is ~/.local/share. The hash tells apart workspaces of the same name."""
    base = env.get("XDG_DATA_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    resolved = workspace.resolve()
    digest = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:12]
    return root / "a3s-agent" / "workspaces" / f"{(resolved.name or 'root')[:64]}-{digest}"


def legacy_data_dir(workspace: Path) -> Path | None:
    """`<workspace>/.a3s` when it holds a session store written by a server of the old default."""
    path = workspace / LEGACY_DIR
    return path if (path / "sessions.db").is_file() else None


def make_data_dir(path: Path) -> None:
    """Create the data directory (owner-only) when missing. One the server creates carries a
    `.gitignore` of `*`: even when it lies inside a repository, git never picks it up."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return
    (path / ".gitignore").write_text(GITIGNORE)


def hold_alone(path: Path) -> int | None:
    """Hold the data directory for this process alone, when no other process does: an exclusive
    flock on its `server.lock`, returned as the descriptor whose closing lets it go (None when
    another process holds it or the file cannot be opened). The kernel drops the lock when its
    holder ends, killed too, so holding it proves that every earlier server here has ended."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
