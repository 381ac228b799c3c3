"""The CodingAgent text protocol's commands, its parse errors, and the paths a command may name.

A model without function calling (or a human relaying a web chat through outbox/inbox
files) answers with command blocks such as

    [CREATE_FILE path="src/app.py"]
    print("hello")
    [/CREATE_FILE]

parser.py reads them from a reply, renderer.py writes them and the outbox document, and
tag_mode.py and relay.py carry them out as tool calls. No I/O happens here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

RUN_COMMAND_TIMEOUT_SECONDS = 30
REJECTED_OUTSIDE_WORKSPACE = "REJECTED: Path is outside workspace"


# Commands


@dataclass(frozen=True)
class CreateFile:
    tag: ClassVar[str] = "CREATE_FILE"
    path: str
    content: str


@dataclass(frozen=True)
class EditFile:
    """Replace lines start_line..end_line (1-indexed, inclusive) with `content`."""

    tag: ClassVar[str] = "EDIT_FILE"
    path: str
    start_line: int
    end_line: int
    content: str


@dataclass(frozen=True)
class DeleteFile:
    tag: ClassVar[str] = "DELETE_FILE"
    path: str


@dataclass(frozen=True)
class ReadFile:
    tag: ClassVar[str] = "READ_FILE"
    path: str


@dataclass(frozen=True)
class RunCommand:
    tag: ClassVar[str] = "RUN_COMMAND"
    command: str


@dataclass(frozen=True)
class Message:
    tag: ClassVar[str] = "MESSAGE"
    text: str


@dataclass(frozen=True)
class Done:
    tag: ClassVar[str] = "DONE"
    summary: str


Command = CreateFile | EditFile | DeleteFile | ReadFile | RunCommand | Message | Done


@dataclass(frozen=True)
class ParseError:
    """A malformed block: `message` says what is wrong, `line` (1-based) where the block starts."""

    message: str
    line: int


# Paths


def check_path(path: str) -> str | None:
    """None for a usable workspace-relative path, else the REJECTED message to report.

    A lexical check (empty, NUL, absolute or drive paths, any `..` component); the tool
    sandbox still resolves symlinks when the command runs.
    """
    if not path.strip():
        return "REJECTED: Path is empty"
    if "\x00" in path:
        return "REJECTED: Path contains a NUL character"
    if path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", path):
        return f"{REJECTED_OUTSIDE_WORKSPACE} (absolute paths are not allowed)"
    if ".." in re.split(r"[/\\]", path):
        return f"{REJECTED_OUTSIDE_WORKSPACE} (.. is not allowed)"
    return None
