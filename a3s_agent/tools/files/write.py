"""write_file and delete_file: a file written whole, atomically, or one file or symlink deleted."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..atomic import write_atomically_at
from ..beneath import Located
from ..lsp.for_model import with_new_errors
from ..registry import PATH, ToolContext, ToolFailure, ToolOutput, tool
from ..workspace_paths import locate_in_workspace
from .access import locate, regular

MAX_WRITE_BYTES = 50_000_000  # one write; a bigger file is a build artefact, not an edit


def _file_stat(place: Located, shown: str) -> os.stat_result | None:
    """The stat of the regular file `place` names, None when nothing is there."""
    try:
        info = os.stat(place.name, dir_fd=place.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ToolFailure(f"cannot access {shown}: {exc.strerror or exc}") from exc
    return regular(info, shown)


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


@tool("write_file", family="file", lane="execute", rule_subject=PATH)
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
    written = ToolOutput(
        output=f"{'Created' if created else 'Overwrote'} {shown} ({len(data)} bytes)",
        metadata={"path": shown, "bytes": len(data), "created": created},
    )
    return await with_new_errors(written, ctx)


class DeleteFileArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str


@tool("delete_file", family="file", lane="execute", rule_subject=PATH)
async def delete_file(args: DeleteFileArgs, ctx: ToolContext) -> ToolOutput:
    """Delete one file or symlink (not its target); directories are refused. There is no undo."""
    with locate(ctx.workspace, args.path, follow_final=False) as place:
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
