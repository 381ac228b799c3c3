"""What the system prompt tells the model about its workspace: the root, the git branch with a count of
changes, and the top-level entries.

The facts are kept per workspace and computed again only when a cheap check sees a change (the
modification times of the workspace directory and of the repository's HEAD, index and branch ref), so
the system prompt stays byte-identical from turn to turn and providers' prefix caches hit. Git runs
through tools/safe_git (a hostile repository configuration runs nothing) and within GIT_BOUND_S a
command: a repository too large to answer in time gets no status counts, then or later.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ...tools.registry import ToolFailure
from ...tools.safe_git import SafeGit, base_git

GIT_BOUND_S = 2.0
MAX_ENTRIES = 30  # top-level entries named; the rest are counted
MAX_LAYOUT_BYTES = 900
MAX_NAME_CHARS = 60
MAX_CHECKED = 500  # top-level names git is asked about (whether it ignores them)
MAX_WORKSPACES = 256  # workspaces whose facts are kept
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0"}  # git status must not rewrite the index (its mtime is watched)
_CHANGE_KINDS = ("modified", "added", "deleted", "renamed", "conflicted", "untracked")

Stamp = tuple[int | None, ...]


def shown(name: str, limit: int = MAX_NAME_CHARS) -> str:
    """A name as the prompt may carry it: one line, control characters escaped, at most `limit` chars."""
    if not name.isprintable():
        name = name.encode("unicode_escape").decode("ascii")
    return name if len(name) <= limit else name[: limit - 1] + "…"


@dataclass(frozen=True)
class Repository:
    git_dir: Path
    branch: str
    changes: dict[str, int] | None  # counts by kind; None when git status failed or took too long
    ref: str = ""  # the checked-out branch's ref, e.g. refs/heads/main ("" when detached)

    def line(self) -> str:
        if self.changes is None:
            return f"- Git: branch {self.branch}; status omitted (git status failed or took too long)"
        counts = [f"{self.changes[kind]} {kind}" for kind in _CHANGE_KINDS if self.changes.get(kind)]
        state = ", ".join(counts) or "clean"
        return f"- Git: branch {self.branch}; {state} (as of the last change seen; git_status shows it now)"


@dataclass(frozen=True)
class WorkspaceFacts:
    root: Path
    repository: Repository | None
    layout: tuple[str, ...]  # top-level names, directories ending in "/"
    unlisted: int  # top-level entries not named

    def text(self) -> str:
        layout = ", ".join(self.layout) or "(empty)"
        if self.unlisted:
            layout += f" and {self.unlisted} more"
        git = self.repository.line() if self.repository else "- Git: no repository found"
        return "\n".join(
            [
                "# Workspace",
                f"- Root: {shown(str(self.root), 300)} (tool paths are relative to it)",
                git,
                f"- Top level: {layout}",
            ]
        )

    def stamp(self) -> Stamp:
        """What changes when these facts may: the mtimes of the root and the repository's HEAD,
        index and branch ref (stat only: nothing is opened)."""
        paths = [self.root]
        if self.repository is not None:
            git_dir = self.repository.git_dir
            paths += [git_dir / "HEAD", git_dir / "index", git_dir / "packed-refs"]
            if self.repository.ref:
                paths.append(git_dir / self.repository.ref)
        return tuple(_mtime(path) for path in paths)


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _entries(root: Path) -> list[tuple[str, bool]]:
    """The root's entries but .git, sorted by name, each with whether it is a directory."""
    try:
        with os.scandir(root) as entries:
            return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in entries if e.name != ".git")
    except OSError:
        return []


def _layout(entries: list[tuple[str, bool]]) -> tuple[tuple[str, ...], int]:
    """The names the prompt lists (directories ending in "/"), within its bounds, and how many are left."""
    names: list[str] = []
    size = 0
    for name, is_dir in entries:
        text = shown(name) + ("/" if is_dir else "")
        size += len(text.encode()) + 2
        if len(names) == MAX_ENTRIES or size > MAX_LAYOUT_BYTES:
            break
        names.append(text)
    return tuple(names), len(entries) - len(names)


async def _bounded(git: SafeGit, *args: str) -> tuple[int, str]:
    """Exit status and stdout of `git args`; TimeoutError after GIT_BOUND_S (the process is killed)."""
    status, out, _ = await asyncio.wait_for(git.execute(*args, env=_GIT_ENV), GIT_BOUND_S)
    return status, out


def _count(porcelain: str) -> tuple[str, str, dict[str, int]]:
    """The commit (branch.oid), the branch's ref (from branch.head; empty when detached) and the
    change counts of `git status --porcelain=v2 --branch -z`."""
    headers: dict[str, str] = {}
    counts = dict.fromkeys(_CHANGE_KINDS, 0)
    items = iter(porcelain.split("\0"))
    for item in items:
        kind, _, rest = item.partition(" ")
        if kind == "#":
            key, _, value = rest.partition(" ")
            headers[key] = value
        elif kind == "?":
            counts["untracked"] += 1
        elif kind == "u":
            counts["conflicted"] += 1
        elif kind == "2":
            counts["renamed"] += 1
            next(items, None)  # the path it was renamed or copied from
        elif kind == "1":
            xy = rest[:2]
            counts["added" if xy[0] == "A" else "deleted" if "D" in xy else "modified"] += 1
    head = headers.get("branch.head", "")
    ref = f"refs/heads/{head}" if head and head != "(detached)" else ""
    return headers.get("branch.oid", ""), ref, counts


def _beside_git(workspace: Path) -> bool:
    """Whether `workspace` or a directory above it has a `.git` (directory or file): without one no
    git runs at all (a workspace that is not a repository costs no process per refresh)."""
    return any(os.path.lexists(directory / ".git") for directory in (workspace, *workspace.parents))


def _look(workspace: Path) -> tuple[list[tuple[str, bool]], bool]:
    """`_entries` and `_beside_git`: one trip to a worker thread for both."""
    return _entries(workspace), _beside_git(workspace)


async def _git(workspace: Path) -> tuple[SafeGit, Path] | None:
    """Git set up for the repository holding `workspace` (which `_beside_git` found), and its git
    directory; None without git or a repository."""
    try:
        git = await asyncio.wait_for(base_git(workspace, {}).for_repository(), GIT_BOUND_S)
        status, out = await _bounded(git, "rev-parse", "--is-inside-work-tree", "--absolute-git-dir")
    except (ToolFailure, TimeoutError):
        return None
    lines = out.split("\n")
    if status != 0 or len(lines) < 2 or lines[0] != "true":
        return None
    return git, Path(lines[1].strip())


async def _head_ref(git: SafeGit) -> str:
    status, out = await _bounded(git, "symbolic-ref", "-q", "HEAD")
    return out.strip() if status == 0 else ""


async def _repository(git: SafeGit, git_dir: Path, with_status: bool) -> Repository | None:
    """The branch and, `with_status`, the change counts (status names the branch too: one process)."""
    try:
        if not with_status:
            ref = await _head_ref(git)
            return Repository(git_dir, _branch(ref, ""), None, ref)
        try:
            status, out = await _bounded(
                git, "status", "--porcelain=v2", "--branch", "-z", "--ignore-submodules=dirty"
            )
        except TimeoutError:
            ref = await _head_ref(git)
            return Repository(git_dir, _branch(ref, ""), None, ref)
        if status != 0:
            ref = await _head_ref(git)
            return Repository(git_dir, _branch(ref, ""), None, ref)
    except (ToolFailure, TimeoutError):
        return None
    oid, ref, counts = _count(out)
    return Repository(git_dir, _branch(ref, oid), counts, ref)


async def _ignored(git: SafeGit, names: list[str]) -> set[str]:
    """Which of the top-level `names` git ignores (build output, caches, virtualenvs). Without -z
    (which needs --stdin) a name git had to quote does not match, so it is listed: harmless."""
    asked = [name for name in names[:MAX_CHECKED] if not name.startswith(":")]  # not pathspec magic
    if not asked:
        return set()
    try:
        status, out = await _bounded(git, "check-ignore", "--", *asked)
    except (ToolFailure, TimeoutError):
        return set()
    return set(out.split("\n")) if status == 0 else set()


def _branch(ref: str, oid: str) -> str:
    if ref:
        return shown(ref.removeprefix("refs/heads/"), 100)
    return f"(detached at {oid[:7]})" if len(oid) >= 7 else "(detached HEAD)"


async def workspace_facts(workspace: Path, with_status: bool = True) -> WorkspaceFacts:
    """The facts of `workspace` now; `with_status` false skips git status (known to be too slow).
    The layout leaves out what git ignores."""
    entries, beside_git = await asyncio.to_thread(_look, workspace)
    found = await _git(workspace) if beside_git else None
    repository = await _repository(*found, with_status) if found else None
    ignored = await _ignored(found[0], [name for name, _ in entries]) if found and repository else set()
    layout, unlisted = _layout([entry for entry in entries if entry[0] not in ignored])
    return WorkspaceFacts(workspace, repository, layout, unlisted)


class FactsCache:
    """Each workspace's facts, computed again only when their stamp changes."""

    def __init__(self) -> None:
        self._known: OrderedDict[Path, tuple[Stamp, WorkspaceFacts]] = OrderedDict()

    async def current(self, workspace: Path) -> WorkspaceFacts:
        known = self._known.get(workspace)
        if known is not None and known[0] == known[1].stamp():
            self._known.move_to_end(workspace)
            return known[1]
        slow = known is not None and known[1].repository is not None and known[1].repository.changes is None
        facts = await workspace_facts(workspace, with_status=not slow)
        self._known[workspace] = (facts.stamp(), facts)
        self._known.move_to_end(workspace)
        while len(self._known) > MAX_WORKSPACES:
            self._known.popitem(last=False)
        return facts

    def latest(self, workspace: Path) -> WorkspaceFacts | None:
        """The facts last computed for `workspace`, without looking for changes."""
        known = self._known.get(workspace)
        return known[1] if known else None
