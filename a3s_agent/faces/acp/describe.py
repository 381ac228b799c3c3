"""A tool call as the editor shows it: its kind (for the icon), a title, the files it touches
(for follow-along), its raw input, and for edits the change as a diff."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from acp.schema import (
    ContentToolCallContent,
    FileEditToolCallContent,
    ImageContentBlock,
    TerminalToolCallContent,
    ToolCallLocation,
    ToolCallStart,
    ToolKind,
)

from ...app.checkpoints import FileTexts
from ...app.tool_kit import resolve_in_workspace
from ...app.types import Tool, ToolFailure
from ...base.jsontext import model_json
from ...base.models import Message, ToolCall
from .content import text_block

ToolContent = ContentToolCallContent | FileEditToolCallContent | TerminalToolCallContent

_KIND_BY_NAME: dict[str, ToolKind] = {
    "search_files": "search",
    "delete_file": "delete",
    "format_code": "edit",
    "update_plan": "think",
}
_KIND_BY_FAMILY: dict[tuple[str, str], ToolKind] = {
    ("file", "query"): "read",
    ("file", "execute"): "edit",
    ("code", "query"): "search",
    ("code", "execute"): "execute",
    ("command", "query"): "execute",
    ("command", "execute"): "execute",
    ("git", "query"): "read",
    ("git", "execute"): "execute",
    ("web", "query"): "fetch",
    ("web", "execute"): "fetch",
}
_SUBJECTS = ("command", "path", "pattern", "url", "query", "symbol", "language")
_MAX_TITLE = 120
_MAX_OLD_TEXT_BYTES = 1 << 20  # a bigger file's diff would be more than an editor shows anyway
MAX_SHOWN_OUTPUT = 50_000
"""Characters of a tool's output shown in the editor (the model gets all of it, up to its cap)."""


def parsed_arguments(call: ToolCall) -> Any:
    """The call's arguments as JSON, or their text as the model wrote it when that is not JSON."""
    try:
        return model_json(call.arguments or "{}")
    except ValueError:
        return call.arguments


def arguments_of(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as an object ({} when the model wrote something else)."""
    parsed = parsed_arguments(call)
    return parsed if isinstance(parsed, dict) else {}


def kind_of(name: str, tool: Tool | None) -> ToolKind:
    if name in _KIND_BY_NAME:
        return _KIND_BY_NAME[name]
    return _KIND_BY_FAMILY.get((tool.family, tool.lane), "other") if tool is not None else "other"


def title_of(name: str, arguments: dict[str, Any]) -> str:
    """The tool's name and what it works on: `bash pytest -q`, `read_file src/app.py`, `task
    explore: find the retry logic`."""
    subject = next((arguments[key] for key in _SUBJECTS if isinstance(arguments.get(key), str)), "")
    if name == "task" and isinstance(arguments.get("agent"), str):
        subject = f"{arguments['agent']}: {arguments.get('description') or ''}".removesuffix(": ")
    title = f"{name} {' '.join(subject.split())}".strip()
    return title if len(title) <= _MAX_TITLE else title[: _MAX_TITLE - 1] + "…"


def _absolute(workspace: Path, raw: str) -> str:
    return os.path.normpath(os.path.join(workspace, raw or "."))


def locations_of(name: str, arguments: dict[str, Any], workspace: Path) -> list[ToolCallLocation]:
    paths = arguments.get("paths") if name == "git_commit" else arguments.get("path")
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list):
        return []
    line = arguments.get("offset") if name == "read_file" else None
    start = line + 1 if isinstance(line, int) and line >= 0 else None
    return [ToolCallLocation(path=_absolute(workspace, p), line=start) for p in paths if isinstance(p, str)]


def diffs_of(name: str, arguments: dict[str, Any], workspace: Path, current_text: bool) -> list[ToolContent]:
    """The change an edit makes: edit_file's old and new text, write_file's new content (over what
    the file holds now, with `current_text`; nothing for a new file)."""
    path = arguments.get("path")
    if not isinstance(path, str):
        return []
    if name == "edit_file":
        old, new = arguments.get("old_string"), arguments.get("new_string")
        if isinstance(old, str) and isinstance(new, str):
            return [_diff(_absolute(workspace, path), old, new)]
    if name == "write_file" and arguments.get("encoding", "utf-8") == "utf-8":
        content = arguments.get("content")
        if isinstance(content, str):
            old = _current_text(workspace, path) if current_text else None
            return [_diff(_absolute(workspace, path), old, content)]
    return []


def _diff(path: str, old: str | None, new: str) -> FileEditToolCallContent:
    return FileEditToolCallContent(type="diff", path=path, old_text=old, new_text=new)


def _current_text(workspace: Path, raw: str) -> str | None:
    """The text of the file `raw` names inside the workspace, if it is one of sensible size."""
    try:
        path = resolve_in_workspace(workspace, raw)
        if not path.is_file() or path.stat().st_size > _MAX_OLD_TEXT_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (ToolFailure, OSError, UnicodeDecodeError):
        return None


def shown_output(result: Message) -> list[ContentToolCallContent]:
    """A finished call's result message as the editor shows it: its text, and its images."""
    shown = [output_content(result.content)] if result.content else []
    for item in result.attachments:
        if item.kind == "image":
            data = base64.b64encode(item.content).decode("ascii")
            image = ImageContentBlock(type="image", data=data, mime_type=item.mime_type or "image/png")
            shown.append(ContentToolCallContent(type="content", content=image))
    return shown


def output_content(text: str) -> ContentToolCallContent:
    shown = text if len(text) <= MAX_SHOWN_OUTPUT else text[:MAX_SHOWN_OUTPUT] + "\n[… shortened for display]"
    return ContentToolCallContent(type="content", content=text_block(shown))


def started(
    call: ToolCall, tool: Tool | None, workspace: Path, *, current_text: bool = True
) -> ToolCallStart:
    """The first report of a call: pending, with its diff when it is an edit (`current_text`: see
    diffs_of)."""
    arguments = arguments_of(call)
    return ToolCallStart(
        session_update="tool_call",
        tool_call_id=call.id,
        title=title_of(call.name, arguments),
        kind=kind_of(call.name, tool),
        status="pending",
        content=diffs_of(call.name, arguments, workspace, current_text) or None,
        locations=locations_of(call.name, arguments, workspace) or None,
        raw_input=parsed_arguments(call),
    )


def review_of(checkpoint: int, files: list[FileTexts], workspace: Path) -> ToolCallStart:
    """What a prompt's turn changed, as one completed edit with a diff per text file (old and new
    text from the checkpoint the turn began at and the tree it left): the editor's review of the
    turn, whatever tool made the change (a `bash` command as well as an edit)."""
    return ToolCallStart(
        session_update="tool_call",
        tool_call_id=f"a3s-changes-{checkpoint}",
        title=f"Files changed: {len(files)}",
        kind="edit",
        status="completed",
        content=[_diff(_absolute(workspace, f.path), f.old, f.new or "") for f in files],
        locations=[ToolCallLocation(path=_absolute(workspace, f.path)) for f in files],
    )
