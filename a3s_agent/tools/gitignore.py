"""Walking a directory tree the way git sees it: `.gitignore` files honoured (nested ones too), `.git` skipped.

Each `.gitignore` applies to the directory holding it and everything below, with git's
precedence: the deepest file that has a matching pattern decides, and within one file the
last matching pattern wins (`!pattern` re-includes). Ignored directories are not entered,
so, as in git, nothing inside them can be re-included. Symlinks are reported, never followed.
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
    path: Path  # absolute, not symlink-resolved
    rel: str  # posix path relative to the walk's start directory
    kind: EntryKind
    depth: int  # 1 for the start directory's own children

    def size(self) -> int:
        """Bytes on disk for a file (a symlink's own size otherwise); 0 if it has vanished."""
        try:
            return self.path.lstat().st_size
        except OSError:
            return 0


@dataclass(frozen=True)
class _Rules:
    base: str  # the directory holding the .gitignore, posix relative to the ignore root ("" = the root)
    spec: GitIgnoreSpec


_RuleStack = tuple[_Rules, ...]


def _read_gitignore(directory: Path) -> str:
    """The text of `directory/.gitignore`; empty when it is missing, unreadable or a symlink
    (git does not follow those either, and the walk never reads outside the tree)."""
    try:
        fd = os.open(directory / ".gitignore", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as handle:
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _with_gitignore_of(directory: Path, base: str, inherited: _RuleStack) -> _RuleStack:
    """`inherited` plus the rules of `directory/.gitignore`, if it has any."""
    spec = GitIgnoreSpec.from_lines(_read_gitignore(directory).splitlines())
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


def _join(parent: str, child: str) -> str:
    return f"{parent}/{child}" if parent and child else parent or child


@dataclass(frozen=True)
class _Walk:
    root_prefix: str  # the start directory relative to the ignore root ("" when they are the same)
    include_hidden: bool

    def children(
        self, directory: Path, rel: str, depth: int, inherited: _RuleStack
    ) -> Iterator[tuple[TreeEntry, _RuleStack]]:
        """The kept entries of one directory, sorted by name, each with the rules for its own children."""
        rules = _with_gitignore_of(directory, _join(self.root_prefix, rel), inherited)
        try:
            with os.scandir(directory) as scan:
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
            yield TreeEntry(Path(item.path), item_rel, kind, depth), rules


def _ancestor_rules(root: Path, start: Path) -> _RuleStack:
    """The rules of the .gitignore files from `root` down to `start`'s parent."""
    rules: _RuleStack = ()
    directory, base = root, ""
    for part in start.relative_to(root).parts:
        rules = _with_gitignore_of(directory, base, rules)
        directory, base = directory / part, _join(base, part)
    return rules


def walk_tree(
    start: Path,
    *,
    root: Path | None = None,
    max_depth: int | None = None,
    include_hidden: bool = True,
    descend: Callable[[TreeEntry], bool] | None = None,
) -> Iterator[TreeEntry]:
    """Entries under `start`, depth-first, each directory's entries sorted by name.

    `root` (default `start`) is where .gitignore files start to count; it must contain
    `start`. `max_depth` 1 lists only `start`'s own entries. `descend(entry)` returning
    False keeps the walk out of that directory (the directory itself is still yielded).
    Unreadable subdirectories are skipped; an unreadable `start` raises OSError.
    """
    root = root or start
    prefix = start.relative_to(root).as_posix()
    walk = _Walk("" if prefix == "." else prefix, include_hidden)
    stack = [walk.children(start, "", 1, _ancestor_rules(root, start))]
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            continue
        entry, rules = step
        yield entry
        if (
            entry.kind == "dir"
            and (max_depth is None or entry.depth < max_depth)
            and (descend is None or descend(entry))
        ):
            stack.append(walk.children(entry.path, entry.rel, entry.depth + 1, rules))
