"""read_file: a text file's lines numbered as by `cat -n`, an image, or the raw bytes in base64."""

from __future__ import annotations

import asyncio
import base64
import os
from functools import partial
from itertools import islice
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...base.models import Attachment
from ..images import MAGIC_BYTES, MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, image_of, looks_like_image
from ..registry import PATH, ToolContext, ToolFailure, ToolOutput, tool
from ..workspace_paths import open_in_workspace
from .access import missing, regular

_SNIFF_BYTES = 8192
_MAX_LINE_CHARS = 2000
_WHOLE_READ_BYTES = 1 << 16
_INLINE_READ_BYTES = 1 << 20  # bigger files are read in a worker thread (writes always go to one)
_MAX_WINDOW_BYTES = 4 << 20  # more than any output budget shows; bounds memory on huge lines
_FOOTER_ROOM = 300  # bytes of the output budget kept for read_file's footer


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
        raise missing(raw) from exc
    except OSError as exc:
        raise ToolFailure(f"cannot access {raw}: {exc.strerror or exc}") from exc
    try:
        regular(os.fstat(fd), raw)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


@tool(
    "read_file",
    family="file",
    lane="query",
    truncation_hint="read a smaller range with offset and limit",
    rule_subject=PATH,
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
