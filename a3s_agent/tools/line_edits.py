"""edit_lines: replace a range of lines of a text file, the tool the text protocol's EDIT_FILE calls.

Offered only to models speaking the CodingAgent text protocol (tag tool mode and the relay);
a model with function calling edits with edit_file. `apply_line_edit` gives the range its
semantics and does no I/O.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .files import rewrite_text_file
from .registry import PATH, Tool, ToolContext, ToolFailure, ToolOutput, tool


def _lines_with_endings(text: str) -> list[str]:
    """Lines split on "\\n" only (as read_file numbers them), each keeping its ending."""
    parts = text.split("\n")
    lines = [f"{part}\n" for part in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines


def _check_line_range(start_line: int, end_line: int, line_count: int) -> None:
    if start_line < 1:
        raise ValueError(f"start_line must be 1 or more (lines are numbered from 1), not {start_line}")
    if start_line > end_line:
        raise ValueError(f"start_line ({start_line}) is after end_line ({end_line})")
    if end_line > line_count:
        raise ValueError(
            f"line range {start_line}-{end_line} is outside the file, which has {line_count} "
            f"line{'' if line_count == 1 else 's'}"
        )


def apply_line_edit(original: str, start_line: int, end_line: int, replacement: str) -> str:
    """EDIT_FILE: `original` with lines start_line..end_line (1-indexed, inclusive) replaced.

    Every replacement line ends with a newline, in the file's style ("\\r\\n" when its first
    line ends so); an empty replacement deletes the lines. Raises ValueError when the range
    is invalid or not inside the file.
    """
    lines = _lines_with_endings(original)
    _check_line_range(start_line, end_line, len(lines))
    newline = "\r\n" if lines[0].endswith("\r\n") else "\n"
    new_lines = [
        line.removesuffix("\n").removesuffix("\r") + newline for line in _lines_with_endings(replacement)
    ]
    return "".join(lines[: start_line - 1] + new_lines + lines[end_line:])


class EditLinesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Path relative to the workspace root.")
    start_line: int = Field(ge=1, description="First line to replace, numbered from 1.")
    end_line: int = Field(ge=1, description="Last line to replace (inclusive).")
    content: str = Field(description="The new lines; empty deletes the range.")


def _edit_lines(workspace: Path, args: EditLinesArgs) -> str:
    """The line edit on disk; returns the path as shown."""

    def replace_lines(original: str) -> str:
        try:
            return apply_line_edit(original, args.start_line, args.end_line, args.content)
        except ValueError as exc:
            raise ToolFailure(f"'{args.path}': {exc}") from exc

    missing = f"File '{args.path}' not found"  # the text protocol's wording
    return rewrite_text_file(workspace, args.path, replace_lines, "edit_lines", missing)[0]


@tool("edit_lines", family="file", lane="execute", text_protocol_only=True, rule_subject=PATH)
async def edit_lines(args: EditLinesArgs, ctx: ToolContext) -> ToolOutput:
    """Replace lines start_line..end_line (numbered from 1, inclusive) of a text file with `content`.

    The replacement may have more or fewer lines than the range; empty content deletes the
    lines. New lines end like the file's own (CRLF files stay CRLF). The file is rewritten
    atomically and keeps its permissions. Example:
    {"path": "src/app.py", "start_line": 3, "end_line": 4, "content": "    return a + b\\n"}
    """
    shown = await asyncio.to_thread(_edit_lines, ctx.workspace, args)
    return ToolOutput(
        output=f"Replaced lines {args.start_line}-{args.end_line} of {shown}",
        metadata={"path": shown, "start_line": args.start_line, "end_line": args.end_line},
    )


TOOLS: list[Tool] = [edit_lines]
