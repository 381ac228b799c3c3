"""list_files and search_files: a directory's entries, and the files whose paths match a glob;
what .gitignore ignores is left out of both."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from fnmatch import fnmatchcase
from itertools import islice, pairwise
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..gitignore import TreeEntry, walk_tree
from ..registry import PATH, ToolContext, ToolFailure, ToolOutput, tool
from ..workspace_paths import relative_to_workspace, workspace_root
from .access import locate

_MAX_ENTRIES = 1000
_MAX_BRACE_EXPANSIONS = 256


def _directory(workspace: Path, raw: str) -> Path:
    """The directory `raw` leads to, as a path under the resolved workspace with no symlinks in it."""
    with locate(workspace, raw) as place:
        try:
            info = os.stat(place.name, dir_fd=place.dir_fd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise ToolFailure(f"{raw} does not exist") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ToolFailure(f"{raw} is not a directory; use read_file to read a file")
    return workspace_root(workspace) / place.rel


def _shown_prefix(workspace: Path, start: Path) -> str:
    """What to put before paths found under `start` to show them relative to the workspace."""
    base = relative_to_workspace(workspace, start)
    return "" if base == "." else f"{base}/"


# list_files


class ListFilesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = "."
    recursive: bool = False
    max_depth: int | None = Field(None, ge=1, description="Levels to list; overrides recursive.")
    include_hidden: bool = False


def _listing_line(prefix: str, entry: TreeEntry) -> str:
    shown = prefix + entry.rel
    if entry.kind == "dir":
        return f"dir      {'-':>10}  {shown}/"
    if entry.kind == "symlink":
        return f"symlink  {'-':>10}  {shown} -> {entry.link}"
    return f"{entry.kind:<7}  {entry.size():>10}  {shown}"


def _list(workspace: Path, start: Path, max_depth: int | None, include_hidden: bool) -> ToolOutput:
    root = workspace_root(workspace)
    walk = walk_tree(start, root=root, max_depth=max_depth, include_hidden=include_hidden)
    entries = list(islice(walk, _MAX_ENTRIES + 1))
    truncated = len(entries) > _MAX_ENTRIES
    entries = entries[:_MAX_ENTRIES]
    prefix = _shown_prefix(root, start)
    lines = [_listing_line(prefix, entry) for entry in entries]
    dirs = sum(entry.kind == "dir" for entry in entries)
    if entries:
        lines.append(f"({len(entries)} entries, {dirs} of them directories)")
    else:
        lines.append("(no entries; hidden ones are listed only with include_hidden=true, ignored ones never)")
    if truncated:
        lines.append(
            f"(listing stopped at {_MAX_ENTRIES} entries; list a subdirectory or use a smaller max_depth)"
        )
    return ToolOutput(
        output="\n".join(lines),
        metadata={"count": len(entries), "dirs": dirs, "truncated": truncated},
    )


@tool("list_files", family="file", lane="query", rule_subject=PATH)
async def list_files(args: ListFilesArgs, ctx: ToolContext) -> ToolOutput:
    """List a directory's entries (type, size, path; 1000 at most) to see a project's layout: its
    own entries unless recursive or max_depth. Entries .gitignore ignores, .git and dot-names are
    left out. To find files by name, use search_files.
    """
    start = _directory(ctx.workspace, args.path)
    max_depth = args.max_depth if args.max_depth is not None else (None if args.recursive else 1)
    try:
        return await asyncio.to_thread(_list, ctx.workspace, start, max_depth, args.include_hidden)
    except OSError as exc:
        raise ToolFailure(f"cannot list {args.path}: {exc.strerror or exc}") from exc


# search_files


class SearchFilesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1, description='Glob on paths below path, e.g. "**/*.{ts,tsx}".')
    path: str = "."


def _expand_braces(pattern: str) -> list[str]:
    """`a{b,c{d,e}}f` -> [abf, acdf, acef]; braces without a top-level comma stay literal."""
    opening = pattern.find("{")
    while opening != -1:
        depth, commas = 0, []
        for at in range(opening, len(pattern)):
            char = pattern[at]
            depth += (char == "{") - (char == "}")
            if char == "," and depth == 1:
                commas.append(at)
            if depth == 0:
                break
        if depth == 0 and commas:
            cuts = [opening, *commas, at]
            head, tail = pattern[:opening], pattern[at + 1 :]
            options = [pattern[start + 1 : end] for start, end in pairwise(cuts)]
            return [expanded for option in options for expanded in _expand_braces(head + option + tail)]
        opening = pattern.find("{", opening + 1)
    return [pattern]


def _glob_segments(pattern: str) -> list[list[str]]:
    """Each brace alternative of `pattern` as path segments; absolute and `..` patterns are refused."""
    if pattern.startswith("/"):
        raise ToolFailure("pattern must be relative to path; put the directory in path instead")
    alternatives = _expand_braces(pattern)
    if len(alternatives) > _MAX_BRACE_EXPANSIONS:
        raise ToolFailure(f"pattern expands to more than {_MAX_BRACE_EXPANSIONS} alternatives")
    segmented = [[part for part in alt.split("/") if part not in ("", ".")] for alt in alternatives]
    if any(".." in segments for segments in segmented):
        raise ToolFailure("pattern may not contain '..'; search from a different path instead")
    return segmented


def _segment_matches(pattern: str, name: str) -> bool:
    """fnmatch on one path segment; wildcards do not match a leading dot, as in the shell."""
    return (pattern.startswith(".") or not name.startswith(".")) and fnmatchcase(name, pattern)


def _path_matches(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return _path_matches(pattern[1:], parts) or (
            bool(parts) and not parts[0].startswith(".") and _path_matches(pattern, parts[1:])
        )
    return bool(parts) and _segment_matches(pattern[0], parts[0]) and _path_matches(pattern[1:], parts[1:])


def _may_contain_matches(pattern: list[str], parts: list[str]) -> bool:
    """Whether a file below the directory `parts` could match `pattern`."""
    if not parts:
        return bool(pattern)
    if not pattern:
        return False
    if pattern[0] == "**":
        return _may_contain_matches(pattern[1:], parts) or (
            not parts[0].startswith(".") and _may_contain_matches(pattern, parts[1:])
        )
    return _segment_matches(pattern[0], parts[0]) and _may_contain_matches(pattern[1:], parts[1:])


def _matching_files(workspace: Path, start: Path, patterns: list[list[str]]) -> Iterator[str]:
    def descend(entry: TreeEntry) -> bool:
        parts = entry.rel.split("/")
        return any(_may_contain_matches(pattern, parts) for pattern in patterns)

    root = workspace_root(workspace)
    prefix = _shown_prefix(root, start)
    for entry in walk_tree(start, root=root, descend=descend, details=False):
        if entry.kind != "dir" and any(_path_matches(p, entry.rel.split("/")) for p in patterns):
            yield prefix + entry.rel


def _search(workspace: Path, start: Path, pattern: str, patterns: list[list[str]]) -> ToolOutput:
    found = sorted(islice(_matching_files(workspace, start, patterns), _MAX_ENTRIES + 1))
    truncated = len(found) > _MAX_ENTRIES
    found = found[:_MAX_ENTRIES]
    lines = list(found)
    if not found:
        lines.append(f"No files match {pattern!r} under {relative_to_workspace(workspace, start)}.")
        if "/" not in pattern:
            lines.append(f"The pattern only matches directly in that directory; try '**/{pattern}'.")
    if truncated:
        lines.append(f"(stopped at {_MAX_ENTRIES} files; use a narrower pattern or path)")
    return ToolOutput(output="\n".join(lines), metadata={"count": len(found), "truncated": truncated})


@tool("search_files", family="file", lane="query", rule_subject=PATH)
async def search_files(args: SearchFilesArgs, ctx: ToolContext) -> ToolOutput:
    """Find files by name: the paths matching a glob (1000 at most). "*.py" matches only directly
    in path, "**/*.py" at any depth; dot-names match only when spelled (".github/**"), ignored
    files never. To search inside files, use grep.
    """
    patterns = _glob_segments(args.pattern)
    start = _directory(ctx.workspace, args.path)
    try:
        return await asyncio.to_thread(_search, ctx.workspace, start, args.pattern, patterns)
    except OSError as exc:
        raise ToolFailure(f"cannot search {args.path}: {exc.strerror or exc}") from exc
