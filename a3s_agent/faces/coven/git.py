"""The git state of the agent's working directory, as RegisterAgent's metadata reports it."""

from __future__ import annotations

from pathlib import Path

from ...app.tool_kit import base_git
from ...app.types import ToolFailure
from ...proto import coven_pb2 as pb


async def git_info(directory: Path) -> pb.GitInfo | None:
    """Branch, commit, dirty, remote, ahead and behind; None outside a repository or without git."""
    status = await _git(
        directory, "status", "--porcelain=v2", "--branch", "--untracked-files=no", "--ignore-submodules=dirty"
    )
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
    """git's stdout, or None when git is missing, fails, hangs or the repository's configuration
    is refused. git runs as the git tools run it (tools/safe_git.py): the repository's own
    configuration cannot make it run a command."""
    try:
        git = await base_git(directory, {"GIT_OPTIONAL_LOCKS": "0"}).for_repository()
        status, out, _ = await git.execute(*args)
    except ToolFailure:
        return None
    return out if status == 0 else None
