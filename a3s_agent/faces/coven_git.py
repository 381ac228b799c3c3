"""The git state of the agent's working directory, as RegisterAgent's metadata reports it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ..proto import coven_pb2 as pb

GIT_TIMEOUT_S = 10.0


async def git_info(directory: Path) -> pb.GitInfo | None:
    """Branch, commit, dirty, remote, ahead and behind; None outside a repository or without git."""
    status = await _git(directory, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    if status is None:
        return None
    info = pb.GitInfo()
    upstream = ""
    for line in status.splitlines():
        if line.startswith("# branch.oid "):
            oid = line.removeprefix("# branch.oid ")
            info.commit = "" if oid == "(initial)" else oid
        elif line.startswith("# branch.head "):
            head = line.removeprefix("# branch.head ")
            info.branch = "" if head == "(detached)" else head
        elif line.startswith("# branch.upstream "):
            upstream = line.removeprefix("# branch.upstream ")
        elif line.startswith("# branch.ab "):
            ahead, behind = line.removeprefix("# branch.ab ").split()
            info.ahead, info.behind = int(ahead), -int(behind)
        elif line and not line.startswith("#"):
            info.dirty = True
    # The upstream's remote ("origin/main" -> origin), else the conventional one.
    remote = await _git(directory, "remote", "get-url", upstream.split("/", 1)[0] or "origin")
    info.remote = (remote or "").strip()
    return info


async def _git(directory: Path, *args: str) -> str | None:
    """git's stdout, or None when git is missing, fails or hangs."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        proc = await asyncio.create_subprocess_exec(
            "git", "-C", str(directory), *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
    except OSError:
        return None
    try:
        stdout, _ = await asyncio.wait_for(proc.communicate(), GIT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    return stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else None
