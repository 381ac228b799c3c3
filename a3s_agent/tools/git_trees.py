"""Snapshots of a working tree as git tree objects, and the exact patch between two of them.

A tree is written through a temporary index (`read-tree HEAD`, `add -A -- .`, `write-tree`), so
the repository's own index, branches and working files are never touched; it holds the tracked
files and the untracked ones that are not ignored. Every git command goes through safe_git: the
repository's configuration cannot make it run a program (hooks, fsmonitor, filters, diff drivers).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .registry import ToolFailure
from .safe_git import SafeGit, base_git

MAX_PATCH_BYTES = 4 * 1024 * 1024
_DIFF = (
    "diff",
    "--binary",
    "--full-index",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


class TreeUnavailable(Exception):
    """The directory is not in a git work tree with a HEAD commit, or git failed."""


async def _git(workspace: Path) -> SafeGit:
    try:
        git = base_git(workspace, {})
        status, out, _ = await git.execute("rev-parse", "--is-inside-work-tree")
        if status != 0 or out.strip() != "true":
            raise TreeUnavailable(f"{workspace} is not inside a git work tree")
        return await git.for_repository()
    except ToolFailure as exc:
        raise TreeUnavailable(str(exc)) from None


async def _run(git: SafeGit, *args: str, env: dict[str, str] | None = None) -> str:
    try:
        status, out, err = await git.execute(*args, env=env)
    except ToolFailure as exc:
        raise TreeUnavailable(str(exc)) from None
    if status != 0:
        raise TreeUnavailable(f"git {args[0]} failed: {(err or out).strip()[:500]}")
    return out


async def capture_tree(workspace: Path) -> str:
    """The id of a tree holding the work tree's files as they are now (relative to HEAD's)."""
    with tempfile.TemporaryDirectory(prefix="a3s-tree-") as scratch:
        git = (await _git(workspace)).writing(Path(scratch))
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        await _run(git, "read-tree", "HEAD", env=env)
        await _run(git, "add", "-A", "--", ".", env=env)
        tree = (await _run(git, "write-tree", env=env)).strip()
    if len(tree) not in (40, 64) or not all(c in "0123456789abcdef" for c in tree):
        raise TreeUnavailable(f"git write-tree gave {tree[:80]!r}")
    return tree


async def tree_patch(workspace: Path, base: str, result: str) -> bytes:
    """The raw `git diff --binary --full-index` from `base` to `result`; TreeUnavailable when it
    is longer than MAX_PATCH_BYTES. Written to a file by git, so its bytes stay exact."""
    with tempfile.TemporaryDirectory(prefix="a3s-patch-") as scratch:
        git = (await _git(workspace)).writing(Path(scratch))
        out = Path(scratch) / "patch"
        await _run(git, *_DIFF, f"--output={out}", base, result, "--")
        if out.stat().st_size > MAX_PATCH_BYTES:
            raise TreeUnavailable(f"the patch is larger than {MAX_PATCH_BYTES} bytes")
        return out.read_bytes()


async def keep_tree(workspace: Path, ref: str, tree: str) -> None:
    """Point `ref` at `tree`, so that garbage collection keeps it."""
    await _run(await _git(workspace), "update-ref", ref, tree)
