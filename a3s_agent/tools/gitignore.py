"""Walking a directory tree the way git sees it: `.gitignore` files honoured (nested ones too), `.git` skipped.

Each `.gitignore` applies to the directory holding it and everything below, with git's
precedence: the deepest file that has a matching pattern decides, and within one file the
last matching pattern wins (`!pattern` re-includes). Ignored directories are not entered,
so, as in git, nothing inside them can be re-included. Symlinks are reported, never followed:
the walk goes by directory descriptors, each directory opened with O_NOFOLLOW from its parent's,
so a directory swapped for a symlink while the walk runs is skipped, never entered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pathspec import GitIgnoreSpec

EntryKind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True)
class TreeEntry:
    path: Path  # absolute, not symlink-resolved: for showing and comparing (the walk goes by descriptors)
    rel: str  # posix path relative to the walk's start directory
    kind: EntryKind
    depth: int  # 1 for the start directory's own children
    nbytes: int = 0  # a file's size (a symlink's own), taken when the walk found it; 0 if it had vanished
    link: str = ""  # a symlink's target, as written in the link

    def size(self) -> int:
        """Bytes on disk for a file (a symlink's own size otherwise); 0 if it had vanished."""
        return self.nbytes


@dataclass(frozen=True)
class _Rules:
    base: str  # the directory holding the .gitignore, posix relative to the ignore root ("" = the root)
    spec: GitIgnoreSpec


_RuleStack = tuple[_Rules, ...]


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _read_gitignore(dir_fd: int) -> str:
    """The text of the directory's .gitignore; empty when it is missing, unreadable or a symlink
    (git does not follow those either, and the walk never reads outside the tree)."""
    try:
        fd = os.open(".gitignore", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        with open(fd, "rb") as handle:
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _with_gitignore_of(dir_fd: int, base: str, inherited: _RuleStack) -> _RuleStack:
    """`inherited` plus the rules of the directory's .gitignore, if it has any."""
    spec = GitIgnoreSpec.from_lines(_read_gitignore(dir_fd).splitlines())
    return (*inherited, _Rules(base, spec)) if len(spec) else inherited


def _is_ignored(rules: _RuleStack, rel_to_root: str, is_dir: bool) -> bool:
    for rule in reversed(rules):
        sub = rel_to_root[len(rule.base) + 1 :] if rule.base else rel_to_root
        verdict = rule.spec.check_file(f"{sub}/" if is_dir else sub).include
        if verdict is not None:
            return verdict
    return False


def _kind(entry: os.DirEntry[str]) -> EntryKind:
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"


def _described(entry: os.DirEntry[str], dir_fd: int, kind: EntryKind) -> tuple[int, str]:
    """The size and symlink target of an entry of the open directory `dir_fd`; (0, "") if it vanished."""
    if kind == "dir":
        return 0, ""
    try:
        size = entry.stat(follow_symlinks=False).st_size
        return size, os.readlink(entry.name, dir_fd=dir_fd) if kind == "symlink" else ""
    except OSError:
        return 0, ""


def _join(parent: str, child: str) -> str:
    return f"{parent}/{child}" if parent and child else parent or child


@dataclass(frozen=True)
class _Walk:
    start: Path
    root_prefix: str  # the start directory relative to the ignore root ("" when they are the same)
    include_hidden: bool
    details: bool  # take sizes and symlink targets (a syscall per entry)

    def children(
        self, dir_fd: int, rel: str, depth: int, inherited: _RuleStack
    ) -> Iterator[tuple[TreeEntry, _RuleStack]]:
        """The kept entries of the open directory, sorted by name, each with the rules for its own children."""
        rules = _with_gitignore_of(dir_fd, _join(self.root_prefix, rel), inherited)
        try:
            with os.scandir(dir_fd) as scan:
                found = sorted(scan, key=lambda e: e.name)
        except OSError:
            if depth == 1:
                raise  # the directory the caller asked for: let it say why it cannot be read
            return
        for item in found:
            if item.name == ".git" or (not self.include_hidden and item.name.startswith(".")):
                continue
            kind = _kind(item)
            item_rel = _join(rel, item.name)
            if _is_ignored(rules, _join(self.root_prefix, item_rel), kind == "dir"):
                continue
            size, link = _described(item, dir_fd, kind) if self.details else (0, "")
            yield TreeEntry(self.start / item_rel, item_rel, kind, depth, size, link), rules


def _open_start(root: Path, parts: tuple[str, ...]) -> tuple[int, _RuleStack]:
    """The start directory `root/parts` opened without following symlinks on the way, with the rules
    of the .gitignore files from `root` down to its parent."""
    fd = os.open(root, _DIRECTORY & ~os.O_NOFOLLOW)
    rules: _RuleStack = ()
    base = ""
    try:
        for part in parts:
            rules = _with_gitignore_of(fd, base, rules)
            inner = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd, base = inner, _join(base, part)
    except BaseException:
        os.close(fd)
        raise
    return fd, rules


def walk_tree(
    start: Path,
    *,
    root: Path | None = None,
    max_depth: int | None = None,
    include_hidden: bool = True,
    descend: Callable[[TreeEntry], bool] | None = None,
    details: bool = True,
) -> Iterator[TreeEntry]:
    """Entries under `start`, depth-first, each directory's entries sorted by name.

    `root` (default `start`) is where .gitignore files start to count; it must contain
    `start`, which is reached from it without following symlinks. `max_depth` 1 lists only
    `start`'s own entries. `descend(entry)` returning False keeps the walk out of that
    directory (the directory itself is still yielded). `details` false leaves sizes and symlink
    targets out (0 and ""). Unreadable subdirectories, and ones swapped for something else
    meanwhile, are skipped; an unreadable `start` raises OSError.
    """
    root = root or start
    parts = start.relative_to(root).parts
    walk = _Walk(start, "/".join(parts), include_hidden, details)
    start_fd, rules = _open_start(root, parts)
    stack = [(start_fd, walk.children(start_fd, "", 1, rules))]
    try:
        while stack:
            dir_fd, level = stack[-1]
            step = next(level, None)
            if step is None:
                os.close(stack.pop()[0])
                continue
            entry, rules = step
            yield entry
            if (
                entry.kind == "dir"
                and (max_depth is None or entry.depth < max_depth)
                and (descend is None or descend(entry))
            ):
                try:
                    inner = os.open(entry.path.name, _DIRECTORY, dir_fd=dir_fd)
                except OSError:  # unreadable, vanished, or swapped for a symlink: not entered
                    continue
                stack.append((inner, walk.children(inner, entry.rel, entry.depth + 1, rules)))
    finally:
        for dir_fd, _ in stack:
            os.close(dir_fd)
