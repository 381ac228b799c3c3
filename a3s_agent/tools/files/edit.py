"""edit_file: replace a string in a text file, reporting the diff; and rewrite_text_file, how
edit_file, edit_lines and the formatters rewrite a text file in place."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ..atomic import write_atomically_at
from ..beneath import Located
from ..edit_diff import replacement_diff
from ..lsp.for_model import with_new_errors
from ..registry import PATH, ToolContext, ToolFailure, ToolOutput, tool
from .access import locate, missing, regular


class EditFileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    old_string: str
    new_string: str
    replace_all: bool = False


def _like_file_line_endings(text: str, old: str, new: str) -> tuple[str, str]:
    """old and new with CRLF line endings when only that makes old match a CRLF file."""
    if old in text or "\r\n" not in text or "\n" not in old:
        return old, new

    def crlf(value: str) -> str:
        return value.replace("\r\n", "\n").replace("\n", "\r\n")

    return crlf(old), crlf(new)


def _occurrence_lines(text: str, needle: str) -> list[int]:
    lines: list[int] = []
    at = text.find(needle)
    while at != -1:
        lines.append(text.count("\n", 0, at) + 1)
        at = text.find(needle, at + len(needle))
    return lines


def _replaced(text: str, old: str, new: str, replace_all: bool, shown: str) -> tuple[str, int]:
    """The text after the edit and the number of replacements made."""
    count = text.count(old)
    if count == 0:
        raise ToolFailure(
            f"old_string was not found in {shown}; read the file with read_file and copy the text "
            "exactly, including indentation and line breaks (without the line-number prefix)"
        )
    if count > 1 and not replace_all:
        lines = _occurrence_lines(text, old)
        raise ToolFailure(
            f"old_string occurs {count} times in {shown} (at lines {', '.join(map(str, lines[:20]))}); "
            "include more surrounding text to make it unique, or pass replace_all=true",
            occurrences=count,
            lines=lines,
        )
    return text.replace(old, new, -1 if replace_all else 1), count


def _read_entry(place: Located, shown: str) -> tuple[bytes, int]:
    """The bytes and permission bits of the regular file `place` names (never through a symlink)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(place.name, flags, dir_fd=place.dir_fd)
    except FileNotFoundError as exc:
        raise missing(shown) from exc
    except OSError as exc:
        raise ToolFailure(f"cannot read {shown}: {exc.strerror or exc}") from exc
    with open(fd, "rb") as handle:
        mode = stat.S_IMODE(regular(os.fstat(fd), shown).st_mode)
        try:
            return handle.read(), mode
        except OSError as exc:
            raise ToolFailure(f"cannot read {shown}: {exc.strerror or exc}") from exc


def rewrite_text_file(
    workspace: Path, raw: str, change: Callable[[str], str], tool_name: str, missing: str | None = None
) -> tuple[str, str, str]:
    """Rewrite the UTF-8 text file `raw` as `change` says, atomically and keeping its permissions, on
    the directory descriptor it was found in (a symlink swapped meanwhile cannot redirect the write).
    `missing` words the failure for a file that is not there. Returns the path as shown, the text
    before and after."""
    with locate(workspace, raw) as place:
        try:
            data, mode = _read_entry(place, raw)
        except ToolFailure as exc:
            if missing and isinstance(exc.__cause__, FileNotFoundError):
                raise ToolFailure(missing) from exc
            raise
        try:
            before = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolFailure(f"{raw} is not utf-8 text; {tool_name} only edits text files") from exc
        after = change(before)
        try:
            write_atomically_at(place.dir_fd, place.name, after.encode("utf-8"), mode)
        except OSError as exc:
            raise ToolFailure(f"cannot write {raw}: {exc.strerror or exc}") from exc
    return place.rel, before, after


def check_edit(args: EditFileArgs) -> None:
    """Refuse an edit that cannot change anything, before the file is read."""
    if not args.old_string:
        raise ToolFailure(
            "old_string is empty; give the exact text to replace (use write_file to create a file)"
        )
    if args.old_string == args.new_string:
        raise ToolFailure("old_string and new_string are identical; there is nothing to change")


def apply_edit(before: str, args: EditFileArgs, shown: str) -> tuple[str, int]:
    """The text after the edit (line endings as the file's) and the number of replacements."""
    old, new = _like_file_line_endings(before, args.old_string, args.new_string)
    return _replaced(before, old, new, args.replace_all, shown)


def edit_output(shown: str, before: str, args: EditFileArgs, count: int) -> ToolOutput:
    """What an edit of `before` (made by apply_edit, `count` replacements) reports: the diff."""
    old, new = _like_file_line_endings(before, args.old_string, args.new_string)
    return ToolOutput(
        output=f"Edited {shown}: {count} replacement(s)\n{replacement_diff(before, old, new, count, shown)}",
        metadata={"path": shown, "replacements": count},
    )


def _edit(workspace: Path, raw: str, args: EditFileArgs) -> ToolOutput:
    """Apply the edit on disk and report it (the diff made here, off the event loop too)."""
    counted: list[int] = []

    def replace(before: str) -> str:
        after, count = apply_edit(before, args, raw)
        counted.append(count)
        return after

    shown, before, _ = rewrite_text_file(workspace, raw, replace, "edit_file")
    return edit_output(shown, before, args, counted[0])


@tool("edit_file", family="file", lane="execute", rule_subject=PATH)
async def edit_file(args: EditFileArgs, ctx: ToolContext) -> ToolOutput:
    """Change part of a file: replace old_string with new_string; returns the diff. The way to edit
    an existing file. old_string is copied from read_file's output (without the line numbers) and
    must match exactly, whitespace included, and once: add neighbouring lines to make it unique,
    or set replace_all. An empty new_string deletes.
    """
    check_edit(args)
    return await with_new_errors(await asyncio.to_thread(_edit, ctx.workspace, args.path, args), ctx)
