"""Git tools: status, diff, log and commit in the repository that holds the workspace.

git finds the repository (the workspace itself or a directory above it) and runs at its
root through safe_git, which keeps the repository's configuration from running commands.
Every path argument is sandboxed to the workspace and handed to git as a literal
pathspec; paths shown to the caller are relative to the workspace.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .registry import PATH, RuleSubject, Tool, ToolContext, ToolFailure, ToolOutput, tool
from .safe_git import SafeGit, base_git
from .workspace_paths import relative_to_workspace, resolve_in_workspace

_Args = TypeVar("_Args", bound=BaseModel)
_AUTHOR = re.compile(r"^\s*(?P<name>[^<>]*[^<>\s])\s*<(?P<email>[^<>\s]+)>\s*$")
_CHANGE_NAMES = {
    "M": "modified",
    "T": "type changed",
    "A": "added",
    "D": "deleted",
    "R": "renamed",
    "C": "copied",
}
# Diffs never run a program named by the repository (external diff, textconv) and never
# start git inside a submodule, whose own configuration safe_git has not looked at.
_DIFF_SAFETY = ("--no-ext-diff", "--no-textconv", "--ignore-submodules=dirty")


# --- the repository -------------------------------------------------------------------------


@dataclass
class _Checkout:
    """The repository's git and where the workspace sits inside its working tree."""

    git: SafeGit
    root: Path  # resolved top of the working tree
    workspace: Path  # resolved workspace, at or below root

    async def run(self, *args: str, env: dict[str, str] | None = None) -> str:
        """`git args` at the repository root; a non-zero exit becomes a ToolFailure with git's message."""
        status, out, err = await self.git.execute(*args, env=env)
        if status != 0:
            message = err.strip() or out.strip() or f"exit status {status}"
            raise ToolFailure(f"git {args[0]} failed: {message}", exit_code=status)
        return out

    async def succeeds(self, *args: str) -> bool:
        return (await self.git.execute(*args))[0] == 0

    async def is_commit(self, rev: str) -> bool:
        return await self.succeeds("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")

    async def require_commit(self, rev: str) -> None:
        if not await self.is_commit(rev):
            raise ToolFailure(f"unknown revision {rev!r}: it does not name a commit in this repository")

    def spec(self, target: Path) -> str:
        """A pathspec matching exactly `target` (a file or a whole directory), whatever git's cwd."""
        rel = target.relative_to(self.root).as_posix()
        return ":(top)" if rel == "." else f":(top,literal){rel}"

    def limit(self, target: Path) -> list[str]:
        """Pathspec arguments restricting a command to `target`; none for the whole tree."""
        return [] if target == self.root else [self.spec(target)]

    def diff_relative(self) -> list[str]:
        """Options making diff paths relative to the workspace (and leaving out changes outside it)."""
        if self.workspace == self.root:
            return []
        return [f"--relative={self.workspace.relative_to(self.root).as_posix()}/"]

    def shown(self, repo_path: str) -> str:
        """A path git printed (relative to the repository root) as seen from the workspace."""
        rel = Path(os.path.relpath(self.root / repo_path, self.workspace)).as_posix()
        return rel + "/" if repo_path.endswith("/") else rel


async def _checkout(ctx: ToolContext) -> _Checkout:
    """The repository holding the workspace, with git set up for its configuration."""
    workspace = ctx.workspace.resolve()
    git = await base_git(workspace, ctx.env, ctx.place).for_repository()
    status, out, err = await git.execute("rev-parse", "--show-toplevel")
    if status != 0:
        if "not a git repository" in err:
            raise ToolFailure(
                f"the workspace {workspace} is not inside a git repository "
                "(run `git init` in it to start one)"
            )
        if "must be run in a work tree" in err:
            raise ToolFailure(f"the workspace {workspace} is inside a bare git repository, with no work tree")
        raise ToolFailure(f"git cannot open the repository holding the workspace: {err.strip()}")
    root = _work_tree(out.rstrip("\n"), workspace)
    return _Checkout(git.at(root), root, workspace)


def _work_tree(shown: str, workspace: Path) -> Path:
    """The resolved top of the work tree git reported, which must hold the workspace (a
    repository's core.worktree may point anywhere)."""
    root = Path(shown).resolve()
    if not workspace.is_relative_to(root):
        raise ToolFailure(f"the repository's work tree {root} does not contain the workspace {workspace}")
    return root


async def _in_repository(
    work: Callable[[_Args, _Checkout], Awaitable[ToolOutput]], args: _Args, ctx: ToolContext
) -> ToolOutput:
    return await work(args, await _checkout(ctx))


def _target(checkout: _Checkout, raw: str | None, argument: str = "path") -> Path:
    """The sandboxed path `raw` names; a symlink stays itself (git tracks the link, not its target)."""
    resolved = resolve_in_workspace(checkout.workspace, raw or ".", field=argument)
    named = checkout.workspace / (raw or ".")
    if not named.is_symlink():
        return resolved
    return resolve_in_workspace(checkout.workspace, str(named.parent), field=argument) / named.name


def _scope_note(checkout: _Checkout, target: Path) -> str:
    return "" if target == checkout.workspace else f" in {relative_to_workspace(checkout.workspace, target)}"


# --- argument checks ------------------------------------------------------------------------


def _check_ref(ref: str) -> str:
    if ref.startswith("-"):
        raise ValueError("ref must name a revision, not start with '-'")
    return ref


def _check_author(author: str) -> str:
    if not _AUTHOR.match(author):
        raise ValueError("author must look like 'Name <email>'")
    return author


def _check_message(message: str) -> str:
    if not message.strip():
        raise ValueError("message must not be empty")
    return message


_Ref = Annotated[str, AfterValidator(_check_ref)]


# --- changes (status and commit) ------------------------------------------------------------


@dataclass
class _Change:
    path: str
    change: str
    from_path: str | None = None

    def line(self) -> str:
        moved = f"{self.from_path} -> " if self.from_path else ""
        return f"  {self.change}: {moved}{self.path}"

    def as_dict(self) -> dict[str, str]:
        item = {"path": self.path, "change": self.change}
        if self.from_path:
            item["from"] = self.from_path
        return item


def _change(checkout: _Checkout, code: str, path: str, from_path: str | None) -> _Change:
    moved = checkout.shown(from_path) if from_path and code in "RC" else None
    return _Change(checkout.shown(path), _CHANGE_NAMES.get(code, code), moved)


def _section(title: str, lines: list[str]) -> list[str]:
    return [f"{title}:", *lines] if lines else []


# --- git_status -----------------------------------------------------------------------------


class GitStatusArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = "."


@dataclass
class _Status:
    oid: str = ""
    head: str = ""
    upstream: str | None = None
    ahead: int | None = None
    behind: int | None = None
    staged: list[_Change] = field(default_factory=list)
    unstaged: list[_Change] = field(default_factory=list)
    conflicted: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)

    @property
    def branch(self) -> str:
        return f"HEAD detached at {self.oid[:7]}" if self.head == "(detached)" else self.head

    def header(self, key: str, value: str) -> None:
        if key == "branch.oid":
            self.oid = value
        elif key == "branch.head":
            self.head = value
        elif key == "branch.upstream":
            self.upstream = value
        elif key == "branch.ab":
            ahead, behind = value.split()
            self.ahead, self.behind = int(ahead), -int(behind)

    def entry(self, checkout: _Checkout, kind: str, rest: str, entries: Iterator[str]) -> None:
        """One porcelain v2 line: '1' changed, '2' renamed/copied (origin follows), 'u' unmerged, '?'."""
        if kind == "?":
            self.untracked.append(checkout.shown(rest))
            return
        parts = rest.split(" ", {"1": 7, "2": 8, "u": 9}[kind])
        xy, path = parts[0], parts[-1]
        if kind == "u":
            self.conflicted.append(checkout.shown(path))
            return
        from_path = next(entries) if kind == "2" else None
        if xy[0] != ".":
            self.staged.append(_change(checkout, xy[0], path, from_path))
        if xy[1] != ".":
            self.unstaged.append(_change(checkout, xy[1], path, from_path))


def _parse_status(checkout: _Checkout, raw: str) -> _Status:
    status = _Status()
    entries = iter(item for item in raw.split("\0") if item)
    for item in entries:
        kind, _, rest = item.partition(" ")
        if kind == "#":
            key, _, value = rest.partition(" ")
            status.header(key, value)
        elif kind in ("1", "2", "u", "?"):
            status.entry(checkout, kind, rest, entries)
    return status


def _status_text(status: _Status, scope: str) -> str:
    if status.head == "(detached)":
        lines = [status.branch]
    else:
        lines = [f"On branch {status.head}" + (" (no commits yet)" if status.oid == "(initial)" else "")]
    if status.upstream and status.ahead is None:
        lines.append(f"Upstream {status.upstream} is gone")
    elif status.upstream:
        lines.append(f"Tracking {status.upstream}: ahead {status.ahead}, behind {status.behind}")
    lines += _section("Staged changes", [c.line() for c in status.staged])
    lines += _section("Unstaged changes", [c.line() for c in status.unstaged])
    lines += _section("Unmerged (conflicts)", [f"  {p}" for p in status.conflicted])
    lines += _section("Untracked", [f"  {p}" for p in status.untracked])
    if not (status.staged or status.unstaged or status.conflicted or status.untracked):
        lines.append(f"Nothing to commit, working tree clean{scope}")
    return "\n".join(lines)


async def _status(args: GitStatusArgs, checkout: _Checkout) -> ToolOutput:
    target = _target(checkout, args.path)
    raw = await checkout.run(
        "status",
        "--porcelain=v2",
        "--branch",
        "-z",
        "--ignore-submodules=dirty",
        "--",
        *checkout.limit(target),
    )
    status = _parse_status(checkout, raw)
    return ToolOutput(
        output=_status_text(status, _scope_note(checkout, target)),
        metadata={
            "branch": status.branch,
            "detached": status.head == "(detached)",
            "upstream": status.upstream,
            "ahead": status.ahead,
            "behind": status.behind,
            "staged": [c.as_dict() for c in status.staged],
            "unstaged": [c.as_dict() for c in status.unstaged],
            "conflicted": status.conflicted,
            "untracked": status.untracked,
        },
    )


@tool("git_status", family="git", lane="query", rule_subject=PATH)
async def git_status(args: GitStatusArgs, ctx: ToolContext) -> ToolOutput:
    """The repository's branch, how far it is ahead of or behind its upstream, and the changed
    files: staged, unstaged and untracked. Use it to orient yourself and before committing.
    """
    return await _in_repository(_status, args, ctx)


# --- git_diff -------------------------------------------------------------------------------


class GitDiffArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = None
    staged: bool = Field(default=False, description="The index instead of the working tree.")
    ref: _Ref | None = Field(default=None, description="Compare with this commit, not the index/HEAD.")


def _diff_label(args: GitDiffArgs) -> str:
    side = "index" if args.staged else "working tree"
    base = args.ref or ("HEAD" if args.staged else "index")
    return f"{side} vs {base}"


def _numstat(raw: str) -> tuple[int, int, int]:
    """Files, insertions, deletions from `git diff --numstat` (binary files count 0 lines)."""
    rows = [line.split("\t", 2) for line in raw.splitlines() if line]
    return (
        len(rows),
        sum(int(row[0]) for row in rows if row[0].isdigit()),
        sum(int(row[1]) for row in rows if row[1].isdigit()),
    )


async def _diff(args: GitDiffArgs, checkout: _Checkout) -> ToolOutput:
    target = _target(checkout, args.path)
    if args.ref:
        await checkout.require_commit(args.ref)
    common = [
        "--no-color",
        *_DIFF_SAFETY,
        *checkout.diff_relative(),
        *(["--cached"] if args.staged else []),
        *([args.ref] if args.ref else []),
        "--",
        *checkout.limit(target),
    ]
    files, insertions, deletions = _numstat(await checkout.run("diff", "--numstat", *common))
    patch = await checkout.run("diff", *common) if files else ""
    label = _diff_label(args)
    return ToolOutput(
        output=patch or f"No changes ({label}){_scope_note(checkout, target)}.",
        metadata={
            "compared": label,
            "files_changed": files,
            "insertions": insertions,
            "deletions": deletions,
        },
    )


@tool(
    "git_diff",
    family="git",
    lane="query",
    truncation_hint="diff fewer files with path, or look at git_status first",
    rule_subject=PATH,
)
async def git_diff(args: GitDiffArgs, ctx: ToolContext) -> ToolOutput:
    """A unified diff: unstaged changes by default, staged ones (the next commit) with staged, or
    against a commit with ref. Untracked files are in no diff: see git_status.
    """
    return await _in_repository(_diff, args, ctx)


# --- git_log --------------------------------------------------------------------------------


class GitLogArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_count: int = Field(default=20, ge=1, le=1000)
    path: str | None = None
    ref: _Ref | None = Field(default=None, description="Where to start; default HEAD.")


_LOG_FIELDS = ("sha", "short", "author", "email", "date", "subject")
_LOG_FORMAT = "%H%x1f%h%x1f%an%x1f%ae%x1f%aI%x1f%s"


async def _log(args: GitLogArgs, checkout: _Checkout) -> ToolOutput:
    target = _target(checkout, args.path)
    if args.ref:
        await checkout.require_commit(args.ref)
    elif not await checkout.is_commit("HEAD"):
        return ToolOutput(
            output="No commits yet: the current branch has no history.", metadata={"commits": [], "count": 0}
        )
    raw = await checkout.run(
        "log",
        f"--max-count={args.max_count}",
        "-z",
        f"--format={_LOG_FORMAT}",
        args.ref or "HEAD",
        "--",
        *checkout.limit(target),
    )
    rows = [dict(zip(_LOG_FIELDS, item.split("\x1f"), strict=True)) for item in raw.split("\0") if item]
    lines = [f"{r['short']}  {r['author']}  {r['date']}  {r['subject']}" for r in rows]
    output = "\n".join(lines) or f"No commits{_scope_note(checkout, target)}."
    commits = [{key: row[key] for key in _LOG_FIELDS if key != "short"} for row in rows]
    return ToolOutput(output=output, metadata={"commits": commits, "count": len(commits)})


@tool(
    "git_log",
    family="git",
    lane="query",
    truncation_hint="ask for fewer commits with max_count",
    rule_subject=PATH,
)
async def git_log(args: GitLogArgs, ctx: ToolContext) -> ToolOutput:
    """Recent commits, newest first: short sha, author, date, subject; of one file or directory
    with path.
    """
    return await _in_repository(_log, args, ctx)


# --- git_commit -----------------------------------------------------------------------------


class GitCommitArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: Annotated[str, AfterValidator(_check_message)] = Field(min_length=1)
    paths: list[str] = Field(default_factory=list, description="Commit exactly these, new files too.")
    all: bool = Field(default=False, description="Stage all tracked changes (git commit -a).")
    author: Annotated[str, AfterValidator(_check_author)] | None = Field(
        default=None, description="'Name <email>', when git has no identity."
    )


async def _staged(checkout: _Checkout, specs: list[str]) -> list[_Change]:
    """What the index changes against HEAD (everything when HEAD does not exist yet)."""
    raw = await checkout.run("diff", "--cached", "--name-status", "-z", *_DIFF_SAFETY, "--", *specs)
    entries = iter(item for item in raw.split("\0") if item)
    changes = []
    for code in entries:
        first = next(entries)
        if code[0] in "RC":
            changes.append(_change(checkout, code[0], next(entries), first))
        else:
            changes.append(_change(checkout, code[0], first, None))
    return changes


async def _identity_env(checkout: _Checkout, author: str | None) -> dict[str, str]:
    """Extra environment making the commit possible: the author doubles as committer if git has none."""
    if await checkout.succeeds("var", "GIT_COMMITTER_IDENT"):
        return {}
    if author is None:
        raise ToolFailure(
            "git has no identity configured to commit with: pass author as 'Name <email>', or set "
            "`git config user.name` and `git config user.email`"
        )
    match = _AUTHOR.match(author)
    assert match is not None  # validated by GitCommitArgs
    return {"GIT_COMMITTER_NAME": match["name"], "GIT_COMMITTER_EMAIL": match["email"]}


def _exists(path: Path) -> bool:
    return os.path.lexists(path)


async def _submodules(checkout: _Checkout) -> list[str]:
    """The submodules in the workspace (repository paths). `git add` and a commit of named paths
    start git inside every submodule they cover, whatever --ignore-submodules says, and that git
    reads the submodule's own configuration, which safe_git has not neutralised: they leave
    submodules out (`_outside`)."""
    raw = await checkout.run("ls-files", "--stage", "-z", "--", checkout.spec(checkout.workspace))
    return [entry.split("\t", 1)[1] for entry in raw.split("\0") if entry.startswith("160000 ")]


def _refuse_submodules(checkout: _Checkout, targets: list[Path], submodules: list[str]) -> None:
    for target in targets:
        if target.relative_to(checkout.root).as_posix() in submodules:
            shown = relative_to_workspace(checkout.workspace, target)
            raise ToolFailure(f"{shown} is a submodule: git_commit does not stage submodules")


def _outside(submodules: list[str]) -> list[str]:
    return [f":(exclude,top,literal){path}" for path in submodules]


async def _stage(checkout: _Checkout, targets: list[Path], skip: list[str]) -> None:
    """Stage targets as they are on disk, except the pathspecs `skip`; a missing one is staged as
    deleted (a no-op if git has already forgotten it, such as the old name of a `git mv`)."""
    present = [checkout.spec(t) for t in targets if _exists(t)]
    missing = [checkout.spec(t) for t in targets if not _exists(t)]
    if present:
        await checkout.run("add", "--all", "--", *present, *skip)
    if missing:
        await checkout.run("rm", "--cached", "-r", "--quiet", "--ignore-unmatch", "--", *missing)


def _nothing_to_commit(args: GitCommitArgs) -> str:
    if args.paths and not args.all:
        return f"nothing to commit: no changes in {', '.join(args.paths)}"
    if args.all:
        return "nothing to commit: no tracked file in the workspace has changes (name new files in paths)"
    return "nothing to commit: nothing is staged; name the files to commit in paths, or pass all=true"


async def _commit(args: GitCommitArgs, checkout: _Checkout) -> ToolOutput:
    env = await _identity_env(checkout, args.author)
    targets = [_target(checkout, raw, argument="paths") for raw in args.paths]
    submodules = await _submodules(checkout)
    _refuse_submodules(checkout, targets, submodules)
    skip = _outside(submodules)
    if args.all:
        await checkout.run("add", "--update", "--", checkout.spec(checkout.workspace), *skip)
    await _stage(checkout, targets, skip)
    # Without paths git commits the index as it is (diff.ignoreSubmodules keeps it out of submodules).
    only = [] if args.all else [checkout.spec(t) for t in targets] + (skip if targets else [])
    files = await _staged(checkout, only)
    if not files:
        raise ToolFailure(_nothing_to_commit(args))
    author = [f"--author={args.author}"] if args.author else []
    await checkout.run("commit", "--quiet", f"--message={args.message}", *author, "--", *only, env=env)
    sha, short, subject = (await checkout.run("log", "-1", "--format=%H%x1f%h%x1f%s")).strip().split("\x1f")
    branch = (await checkout.run("rev-parse", "--abbrev-ref", "HEAD")).strip()
    summary = f"[{branch} {short}] {subject}\n{len(files)} file(s):"
    return ToolOutput(
        output="\n".join([summary, *(c.line() for c in files)]),
        metadata={"sha": sha, "branch": branch, "files": [c.as_dict() for c in files]},
    )


@tool("git_commit", family="git", lane="execute", rule_subject=RuleSubject("paths"))
async def git_commit(args: GitCommitArgs, ctx: ToolContext) -> ToolOutput:
    """Commit and return the sha: the given paths (other staged changes stay out), all tracked
    changes, or, with neither, what is staged. Check git_status first.
    """
    return await _in_repository(_commit, args, ctx)


TOOLS: list[Tool] = [git_status, git_diff, git_commit, git_log]
