"""The file tools: read, write, edit, delete, list and find files inside the workspace."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import stat
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from functools import partial
from itertools import islice, pairwise
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..base.models import Attachment
from .atomic import write_atomically_at
from .beneath import Located
from .edit_diff import replacement_diff
from .gitignore import TreeEntry, walk_tree
from .images import MAGIC_BYTES, MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, image_of, looks_like_image
from .registry import Tool, ToolContext, ToolFailure, ToolOutput, tool
from .sandbox import locate_in_workspace, open_in_workspace, relative_to_workspace, workspace_root

MAX_WRITE_BYTES = 50_000_000  # one write; a bigger file is a build artefact, not an edit
_SNIFF_BYTES = 8192
_MAX_LINE_CHARS = 2000
_WHOLE_READ_BYTES = 1 << 16
_INLINE_READ_BYTES = 1 << 20  # bigger files are read in a worker thread (writes always go to one)
_MAX_WINDOW_BYTES = 4 << 20  # more than any output budget shows; bounds memory on huge lines
_FOOTER_ROOM = 300  # bytes of the output budget kept for read_file's footer
_MAX_ENTRIES = 1000
_MAX_BRACE_EXPANSIONS = 256


# Shared helpers
#
# Every path is resolved beneath the workspace on descriptors (sandbox.py): a file is read from
# the descriptor that opened it, and written, replaced and deleted by name inside the directory
# descriptor the path led to, so a symlink swapped in meanwhile never leads a call out.


def _missing(shown: str) -> ToolFailure:
    return ToolFailure(f"{shown} does not exist; use list_files or search_files to find the right path")


def _regular(info: os.stat_result, shown: str) -> os.stat_result:
    """`info` when it is a regular file's; directories and devices fail."""
    if stat.S_ISDIR(info.st_mode):
        raise ToolFailure(f"{shown} is a directory; use list_files to see what it contains")
    if not stat.S_ISREG(info.st_mode):
        raise ToolFailure(f"{shown} is not a regular file")
    return info


def _locate(workspace: Path, raw: str, *, follow_final: bool = True) -> Located:
    """locate_in_workspace, its failures worded for the model."""
    try:
        return locate_in_workspace(workspace, raw, follow_final=follow_final)
    except FileNotFoundError as exc:
        raise _missing(raw) from exc
    except OSError as exc:
        raise ToolFailure(f"cannot access {raw}: {exc.strerror or exc}") from exc


def _file_stat(place: Located, shown: str) -> os.stat_result | None:
    """The stat of the regular file `place` names, None when nothing is there."""
    try:
        info = os.stat(place.name, dir_fd=place.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ToolFailure(f"cannot access {shown}: {exc.strerror or exc}") from exc
    return _regular(info, shown)


def _directory(workspace: Path, raw: str) -> Path:
    """The directory `raw` leads to, as a path under the resolved workspace with no symlinks in it."""
    with _locate(workspace, raw) as place:
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


# read_file


class ReadFileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    offset: int = Field(0, ge=0, description="0-based line to start from.")
    limit: int = Field(2000, ge=1, le=100_000, description="Lines to return at most.")
    encoding: Literal["utf-8", "ascii", "base64"] = "utf-8"


def _decoded_lines(window: list[bytes], encoding: str, first: int, shown: str) -> list[str]:
    """The window's lines as text without their line endings; undecodable bytes fail, naming the line."""
    data = b"".join(window)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        number = first + data.count(b"\n", 0, exc.start)
        raise ToolFailure(
            f"{shown} is not {encoding} text (line {number}: {exc.reason}); "
            'use encoding="base64" to read its raw bytes'
        ) from exc
    lines = text.removesuffix("\n").split("\n")
    return [line.removesuffix("\r") for line in lines] if "\r" in text else lines


def _count_remaining_lines(handle: BinaryIO) -> int:
    count, last = 0, b"\n"
    for chunk in iter(partial(handle.read, 1 << 20), b""):
        count += chunk.count(b"\n")
        last = chunk[-1:]
    return count + (last != b"\n")


def _line_window(handle: BinaryIO, offset: int, limit: int, size: int) -> tuple[list[bytes], int]:
    """Lines offset..offset+limit of an open file (fewer past _MAX_WINDOW_BYTES), and its line count."""
    if size <= _WHOLE_READ_BYTES:  # small files (most reads): one read and a split beat line iteration
        parts = handle.read().split(b"\n")
        lines = [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
        return lines[offset : offset + limit], len(lines)
    skipped = sum(1 for _ in islice(handle, offset))
    window: list[bytes] = []
    taken = 0
    for line in islice(handle, limit):
        window.append(line)
        taken += len(line)
        if taken >= _MAX_WINDOW_BYTES:
            break
    return window, skipped + len(window) + _count_remaining_lines(handle)


def _cut(text: str) -> str:
    return f"{text[:_MAX_LINE_CHARS]}... [line cut: {len(text)} characters]"


def _leading_lines_within(lines: list[str], budget: int) -> list[str]:
    """The first lines whose joined output fits in `budget` bytes (always at least one)."""
    used = 0
    for count, line in enumerate(lines):
        used += len(line.encode("utf-8")) + 1
        if used > budget:
            return lines[: max(count, 1)]
    return lines


def _numbered(texts: list[str], first: int, budget: int) -> tuple[list[str], int]:
    """`cat -n` lines within `budget` bytes, and how many of the shown lines had to be cut."""
    long_lines = max(map(len, texts)) > _MAX_LINE_CHARS
    shown = [_cut(text) if len(text) > _MAX_LINE_CHARS else text for text in texts] if long_lines else texts
    lines = [f"{number:>6}\t{text}" for number, text in enumerate(shown, first)]
    if len("\n".join(lines).encode("utf-8")) > budget:
        lines = _leading_lines_within(lines, budget)
    return lines, sum(len(text) > _MAX_LINE_CHARS for text in texts[: len(lines)]) if long_lines else 0


def read_text(handle: BinaryIO, shown: str, args: ReadFileArgs, size: int, budget: int) -> ToolOutput:
    try:
        if b"\0" in handle.read(_SNIFF_BYTES):
            raise ToolFailure(f'{shown} is a binary file; use encoding="base64" to read its raw bytes')
        handle.seek(0)
        window, total = _line_window(handle, args.offset, args.limit, size)
    except OSError as exc:
        raise ToolFailure(f"cannot read {shown}: {exc.strerror or exc}") from exc
    if total == 0:
        return ToolOutput(output="(empty file)", metadata={"total_lines": 0, "lines": 0, "bytes": size})
    if args.offset >= total:
        raise ToolFailure(f"offset {args.offset} is past the end of {shown}, which has {total} lines")
    texts = _decoded_lines(window, args.encoding, args.offset + 1, shown)
    lines, cut = _numbered(texts, args.offset + 1, budget - _FOOTER_ROOM)
    last = args.offset + len(lines)
    footer = f"(lines {args.offset + 1}-{last} of {total}"
    footer += f"; use offset={last} to read more)" if last < total else ")"
    if cut:
        footer += f"\n({cut} line(s) longer than {_MAX_LINE_CHARS} characters were cut)"
    return ToolOutput(
        output="\n".join([*lines, footer]),
        metadata={
            "total_lines": total,
            "lines": len(lines),
            "bytes": size,
            "truncated": last < total or cut > 0,
        },
    )


def _read_base64(handle: BinaryIO, shown: str, size: int, budget: int) -> ToolOutput:
    max_bytes = budget * 3 // 4
    if size > max_bytes:
        raise ToolFailure(f"{shown} has {size} bytes; base64 reads are limited to {max_bytes} bytes")
    try:
        data = handle.read()
    except OSError as exc:
        raise ToolFailure(f"cannot read {shown}: {exc.strerror or exc}") from exc
    return ToolOutput(output=base64.b64encode(data).decode("ascii"), metadata={"bytes": len(data)})


def _read_image(handle: BinaryIO, shown: str, size: int) -> ToolOutput | None:
    """The image the file holds, described, and attached when a model may be shown it; None when the
    file is no image (its header does not parse: read_file reads it as any other file)."""
    try:
        data = handle.read(MAX_IMAGE_BYTES + 1)  # a bigger image is described from its start
    except OSError as exc:
        raise ToolFailure(f"cannot read {shown}: {exc.strerror or exc}") from exc
    image = image_of(data)
    if image is None:
        handle.seek(0)
        return None
    output = f"{shown} is a {image.format} image, {image.width}x{image.height} pixels, {size} bytes."
    attachments = []
    if image.fits(len(data)):  # (what was read: a file growing meanwhile is cut at the bound)
        attachments.append(Attachment(kind="image", name=shown, mime_type=image.mime_type, content=data))
    else:
        output += (
            f" It is too large to be shown: images up to {MAX_IMAGE_BYTES} bytes and {MAX_IMAGE_SIDE}"
            " pixels a side are."
        )
    metadata = {
        "bytes": size,
        "mime_type": image.mime_type,
        "width": image.width,
        "height": image.height,
        "image_attached": bool(attachments),
    }
    return ToolOutput(output=output, metadata=metadata, attachments=attachments)


def _open_file(workspace: Path, raw: str) -> BinaryIO:
    """The regular file `raw` leads to, open for reading (O_NONBLOCK: a FIFO is refused, not waited on)."""
    try:
        fd = open_in_workspace(workspace, raw, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        raise _missing(raw) from exc
    except OSError as exc:
        raise ToolFailure(f"cannot access {raw}: {exc.strerror or exc}") from exc
    try:
        _regular(os.fstat(fd), raw)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


@tool(
    "read_file",
    family="file",
    lane="query",
    truncation_hint="read a smaller range with offset and limit",
)
async def read_file(args: ReadFileArgs, ctx: ToolContext) -> ToolOutput:
    """Read a file you know the path of. Text comes numbered as by `cat -n` (number, tab, line); the
    numbers are not part of the file, so leave them out of edit_file's old_string. A footer tells
    how to read on past `limit` lines. PNG, JPEG, GIF and WebP images come back as images; other
    binary files only with encoding "base64" (whole file, up to 75 KB). To find files use
    search_files or list_files; to find text, grep.
    """
    with _open_file(ctx.workspace, args.path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if args.encoding == "base64":
            return _read_base64(handle, args.path, size, ctx.max_output_bytes)
        if looks_like_image(handle.read(MAGIC_BYTES)):
            handle.seek(0)
            image = await asyncio.to_thread(_read_image, handle, args.path, size)
            if image is not None:
                return image
        handle.seek(0)
        if size > _INLINE_READ_BYTES:
            return await asyncio.to_thread(read_text, handle, args.path, args, size, ctx.max_output_bytes)
        return read_text(handle, args.path, args, size, ctx.max_output_bytes)


# write_file


class WriteFileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = Field("utf-8", description="base64: content is binary data.")
    overwrite: bool = Field(True, description="false: fail if the file exists.")


def _content_bytes(content: str, encoding: str) -> bytes:
    if encoding == "utf-8":
        return content.encode("utf-8")
    try:
        return base64.b64decode("".join(content.split()), validate=True)
    except binascii.Error as exc:
        raise ToolFailure(f"content is not valid base64: {exc}") from exc


def _write(workspace: Path, raw: str, data: bytes, overwrite: bool) -> tuple[str, bool]:
    """Write `data` where `raw` leads; the path written as shown, and whether the file is new."""
    try:
        place = locate_in_workspace(workspace, raw, create_parents=True)
    except OSError as exc:
        raise ToolFailure(f"cannot write {raw}: {exc.strerror or exc}") from exc
    with place:
        existing = _file_stat(place, raw)
        if existing is not None and not overwrite:
            raise ToolFailure(
                f"{raw} already exists; pass overwrite=true to replace it, "
                "or use edit_file to change part of it"
            )
        try:
            mode = None if existing is None else stat.S_IMODE(existing.st_mode)
            write_atomically_at(place.dir_fd, place.name, data, mode)
        except OSError as exc:
            raise ToolFailure(f"cannot write {raw}: {exc.strerror or exc}") from exc
    return place.rel, existing is None


@tool("write_file", family="file", lane="execute")
async def write_file(args: WriteFileArgs, ctx: ToolContext) -> ToolOutput:
    """Create a new file, or replace a file's whole content, atomically (parent directories are
    created). To change part of an existing file use edit_file instead.
    """
    data = _content_bytes(args.content, args.encoding)
    if len(data) > MAX_WRITE_BYTES:
        raise ToolFailure(f"content is {len(data)} bytes; write_file writes at most {MAX_WRITE_BYTES} bytes")
    # On a worker thread whatever the size: the write is synced to disk (twice), which a busy disk
    # can make take seconds, and the event loop serves every other session meanwhile.
    shown, created = await asyncio.to_thread(_write, ctx.workspace, args.path, data, args.overwrite)
    return ToolOutput(
        output=f"{'Created' if created else 'Overwrote'} {shown} ({len(data)} bytes)",
        metadata={"path": shown, "bytes": len(data), "created": created},
    )


# edit_file


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
        raise _missing(shown) from exc
    except OSError as exc:
        raise ToolFailure(f"cannot read {shown}: {exc.strerror or exc}") from exc
    with open(fd, "rb") as handle:
        mode = stat.S_IMODE(_regular(os.fstat(fd), shown).st_mode)
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
    with _locate(workspace, raw) as place:
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


@tool("edit_file", family="file", lane="execute")
async def edit_file(args: EditFileArgs, ctx: ToolContext) -> ToolOutput:
    """Change part of a file: replace old_string with new_string; returns the diff. The way to edit
    an existing file. old_string is copied from read_file's output (without the line numbers) and
    must match exactly, whitespace included, and once: add neighbouring lines to make it unique,
    or set replace_all. An empty new_string deletes.
    """
    check_edit(args)
    return await asyncio.to_thread(_edit, ctx.workspace, args.path, args)


# delete_file


class DeleteFileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str


@tool("delete_file", family="file", lane="execute")
async def delete_file(args: DeleteFileArgs, ctx: ToolContext) -> ToolOutput:
    """Delete one file or symlink (not its target); directories are refused. There is no undo."""
    with _locate(ctx.workspace, args.path, follow_final=False) as place:
        try:
            info = os.stat(place.name, dir_fd=place.dir_fd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise ToolFailure(f"{args.path} does not exist") from exc
        if stat.S_ISDIR(info.st_mode):
            raise ToolFailure(f"{args.path} is a directory; delete_file only deletes files")
        try:
            os.unlink(place.name, dir_fd=place.dir_fd)
        except OSError as exc:
            raise ToolFailure(f"cannot delete {args.path}: {exc.strerror or exc}") from exc
    shown = place.rel
    kind = "symlink" if stat.S_ISLNK(info.st_mode) else "file"
    return ToolOutput(
        output=f"Deleted {shown}",
        metadata={"path": shown, "kind": kind, "bytes": info.st_size},
    )


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


@tool("list_files", family="file", lane="query")
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


@tool("search_files", family="file", lane="query")
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


TOOLS: list[Tool] = [read_file, write_file, edit_file, delete_file, list_files, search_files]
