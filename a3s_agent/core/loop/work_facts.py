"""What a session's work has done, as text for its model to judge a goal by (CheckGoalAchievement):
its plan and todo list, the files its tools changed (whether each is there now, its size and how
it begins) and the end of its history. Bounded: each part has its share of about 40,000
characters, the newest history kept. It is data the model reads, never instructions: no part can
close its block.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from ...base.jsontext import model_json
from ...base.models import Message, Todo
from ...base.planning import Plan

LIST_CHARS = 4_000
"""Of the plan, and of the todo list."""
HISTORY_CHARS = 16_000
FILE_CHARS = 16_000
FILE_HEAD_CHARS = 2_000
MAX_FILES = 50
CALL_CHARS = 300
RESULT_CHARS = 500
BLOCKS = ("plan", "todos", "changed-files", "history", "state", "goal", "task", "context", "tools", "request")
"""The blocks of the planning group's prompts (here and in planning.py): no text in one can open
or close any of them."""
_MARKER = re.compile(rf"</?\s*({'|'.join(BLOCKS)})\s*>", re.IGNORECASE)


def work_facts(
    plan: Plan | None,
    todos: Sequence[Todo],
    history: Sequence[Message],
    workspace: Path,
    file_tools: frozenset[str],
) -> str:
    """The facts, each in its block: `file_tools` are the tools whose `path` argument names a file
    they change."""
    todo_lines = "\n".join(f"- [{t.status}] {t.content}" for t in todos)
    parts = [
        block("plan", _cut(_plan(plan), LIST_CHARS) if plan is not None else "(none)"),
        block("todos", _cut(todo_lines, LIST_CHARS) or "(none)"),
        block("changed-files", _files(history, workspace, file_tools) or "(none)"),
        block("history", _history(history) or "(none)"),
    ]
    return "\n".join(parts)


def block(tag: str, text: str) -> str:
    """`text` in <tag> ... </tag> (one of BLOCKS), no block's marker left in it to open or close one."""
    defused = _MARKER.sub(lambda m: m.group(0).replace("<", "(").replace(">", ")"), text)
    return f"<{tag}>\n{defused}\n</{tag}>"


def _plan(plan: Plan) -> str:
    steps = [f"- {s.id} [{s.status.name.lower()}] {s.description}" for s in plan.steps]
    return "\n".join([f"goal: {plan.goal}", *steps])


def _files(history: Sequence[Message], workspace: Path, file_tools: frozenset[str]) -> str:
    """The files the session's tools changed successfully, the last changed first."""
    failed = {m.tool_call_id for m in history if m.role == "tool" and m.metadata.get("success") == "false"}
    paths: dict[str, None] = {}
    for message in reversed(history):
        for call in reversed(message.tool_calls):
            if call.name in file_tools and call.id not in failed:
                path = _path_argument(call.arguments)
                if path:
                    paths.setdefault(path, None)
    lines: list[str] = []
    used = 0
    for path in list(paths)[:MAX_FILES]:
        entry = _file(workspace, path)
        if used + len(entry) > FILE_CHARS:
            lines.append(f"({len(paths) - len(lines)} more files not shown)")
            break
        lines.append(entry)
        used += len(entry)
    return "\n".join(lines)


def _path_argument(arguments: str) -> str:
    try:
        value = model_json(arguments or "{}")
    except ValueError:
        return ""
    path = (value.get("path") or value.get("file_path")) if isinstance(value, dict) else None
    return path if isinstance(path, str) else ""


def _file(workspace: Path, path: str) -> str:
    """One changed file as it is now: only a regular file beneath the workspace is read (a link is
    never followed), its first FILE_HEAD_CHARS characters."""
    root = workspace.resolve()
    target = Path(path) if Path(path).is_absolute() else root / path
    shown = _flat(path, CALL_CHARS)
    try:
        parent = target.parent.resolve()
        if not parent.is_relative_to(root):
            return f"- {shown}: outside the workspace, not read"
        info = (parent / target.name).lstat()
    except (OSError, RuntimeError):
        return f"- {shown}: not there now"
    if not stat.S_ISREG(info.st_mode):
        return f"- {shown}: there now, not a regular file"
    try:
        handle = os.open(parent / target.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            head = os.read(handle, FILE_HEAD_CHARS * 4).decode(errors="replace")[:FILE_HEAD_CHARS]
        finally:
            os.close(handle)
    except OSError as exc:
        return f"- {shown}: there now ({info.st_size} bytes), unreadable: {exc.strerror}"
    more = "" if info.st_size <= len(head.encode()) else "\n  [...]"
    return f"- {shown}: there now, {info.st_size} bytes, beginning:\n{_indent(head)}{more}"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _history(history: Sequence[Message]) -> str:
    """The end of the history, a line or a few per message, within HISTORY_CHARS."""
    kept: list[str] = []
    used = 0
    for message in reversed(history):
        entry = _message(message)
        if used + len(entry) > HISTORY_CHARS:
            kept.append("(earlier messages not shown)")
            break
        kept.append(entry)
        used += len(entry)
    return "\n".join(reversed(kept))


def _message(message: Message) -> str:
    if message.role == "tool":
        outcome = "failed" if message.metadata.get("success") == "false" else "succeeded"
        return f"tool result ({outcome}): {_flat(message.content, RESULT_CHARS)}"
    lines = [f"{message.role}: {_flat(message.content, RESULT_CHARS * 4)}"] if message.content else []
    lines += [f"{message.role} called {c.name} {_flat(c.arguments, CALL_CHARS)}" for c in message.tool_calls]
    return "\n".join(lines) or f"{message.role}: (empty)"


def _flat(text: str, limit: int) -> str:
    return _cut(" ".join(text.split()), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} characters cut]"
