"""Where the server keeps its data: outside the workspace, so it never lands in a user's repository.

The default is one directory per workspace under the user's data directory,
`$XDG_DATA_HOME/a3s-agent/workspaces/<name>-<hash of the resolved workspace path>`.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path

LEGACY_DIR = ".a3s"  # the default before: <workspace>/.a3s
GITIGNORE = "# a3s-agent server data (sessions, Agent Spaces runs): never commit it\n*\n"
LOCK_FILE = "server.lock"
SHARE_WAIT_S = 30.0  # the longest a server waits for another's start to end what crashed servers left
SHARE_POLL_S = 0.05


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


class DataDirLock:
    """Which processes use a data directory: each server using it holds a flock on its
    `server.lock`, shared, for its life, and the kernel drops a holder's lock when it ends, killed
    too. A starting server that gets it exclusive so knows that no other process uses the directory
    and that every one that did has ended; it keeps it exclusive until it has ended what they left
    (another starting meanwhile waits), then shares it."""

    def __init__(self, path: Path) -> None:
        self.path = path / LOCK_FILE
        self._fd: int | None = None

    def take_alone(self) -> bool:
        """Hold the lock exclusive, when no other process holds it; whether it is held so."""
        fd = self._opened()
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    async def share(self, wait_s: float = SHARE_WAIT_S) -> bool:
        """Hold the lock shared (from exclusive, or from nothing), waiting at most `wait_s` while a
        starting server holds it exclusive; whether it is held."""
        fd = self._opened()
        if fd is None:
            return False
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
            except OSError:
                return False
            await asyncio.sleep(SHARE_POLL_S)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _opened(self) -> int | None:
        if self._fd is None:
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                self._fd = os.open(self.path, flags, 0o600)
            except OSError:
                return None
        return self._fd
