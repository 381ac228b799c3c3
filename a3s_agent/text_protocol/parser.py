"""Parsing replies: the command blocks of a model's reply, malformed blocks as ParseError items.

`parse_response` never raises, so the model can be told what to fix. Bodies: CREATE_FILE and
EDIT_FILE keep every body line verbatim, each ending with "\\n" (CRLF is read as LF), so an
empty body is "" and a single blank line is "\\n". RUN_COMMAND, MESSAGE and DONE bodies are
stripped of surrounding whitespace.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable
from typing import NamedTuple

from .commands import (
    Command,
    CreateFile,
    DeleteFile,
    Done,
    EditFile,
    Message,
    ParseError,
    ReadFile,
    RunCommand,
)

_TAG_START = re.compile(r"\[([A-Z][A-Z0-9_]*)(?=[\s\]]|$)")
_TAG_LINE = re.compile(r'\[([A-Z][A-Z0-9_]*)((?:\s(?:"[^"]*"|[^"\]])*)?)\]')
_CLOSING_LINE = re.compile(r"\[/([A-Z][A-Z0-9_]*)\]")
_ATTRIBUTE = re.compile(r'(\w+)\s*=\s*"([^"]*)"')
_WHOLE_NUMBER = re.compile(r"[0-9]+")
_PLACEHOLDERS = {"path": "relative/path", "start_line": "N", "end_line": "M"}


class _Malformed(Exception):
    """Raised inside the parser only; becomes a ParseError."""


def _path(tag: str, attributes: dict[str, str]) -> str:
    path = attributes["path"]
    if not path.strip():
        raise _Malformed(f"{tag} has an empty path attribute")
    return path


def _line_number(attributes: dict[str, str], key: str) -> int:
    value = attributes[key].strip()
    if not _WHOLE_NUMBER.fullmatch(value):
        raise _Malformed(f'EDIT_FILE {key} must be a whole number, not "{attributes[key]}"')
    number = int(value)
    if number < 1:
        raise _Malformed(f"EDIT_FILE {key} must be 1 or more (lines are numbered from 1), not {number}")
    return number


def _file_content(body: list[str]) -> str:
    return "".join(f"{line}\n" for line in body)


def _text(body: list[str]) -> str:
    return "\n".join(body).strip()


def _create_file(attributes: dict[str, str], body: list[str]) -> Command:
    return CreateFile(_path(CreateFile.tag, attributes), _file_content(body))


def _edit_file(attributes: dict[str, str], body: list[str]) -> Command:
    path = _path(EditFile.tag, attributes)
    start, end = _line_number(attributes, "start_line"), _line_number(attributes, "end_line")
    if start > end:
        raise _Malformed(f"EDIT_FILE start_line ({start}) is after end_line ({end})")
    return EditFile(path, start, end, _file_content(body))


def _delete_file(attributes: dict[str, str], _body: list[str]) -> Command:
    return DeleteFile(_path(DeleteFile.tag, attributes))


def _read_file(attributes: dict[str, str], _body: list[str]) -> Command:
    return ReadFile(_path(ReadFile.tag, attributes))


def _run_command(_attributes: dict[str, str], body: list[str]) -> Command:
    command = _text(body)
    if not command:
        raise _Malformed("RUN_COMMAND has no command in its body")
    return RunCommand(command)


def _message(_attributes: dict[str, str], body: list[str]) -> Command:
    return Message(_text(body))


def _done(_attributes: dict[str, str], body: list[str]) -> Command:
    return Done(_text(body))


class _Syntax(NamedTuple):
    attributes: tuple[str, ...]
    has_body: bool
    build: Callable[[dict[str, str], list[str]], Command]


_SYNTAX: dict[str, _Syntax] = {
    CreateFile.tag: _Syntax(("path",), True, _create_file),
    EditFile.tag: _Syntax(("path", "start_line", "end_line"), True, _edit_file),
    DeleteFile.tag: _Syntax(("path",), False, _delete_file),
    ReadFile.tag: _Syntax(("path",), False, _read_file),
    RunCommand.tag: _Syntax((), True, _run_command),
    Message.tag: _Syntax((), True, _message),
    Done.tag: _Syntax((), True, _done),
}


def _usage(tag: str) -> str:
    """The syntax of a command, for error messages."""
    syntax = _SYNTAX[tag]
    attributes = "".join(f' {key}="{_PLACEHOLDERS[key]}"' for key in syntax.attributes)
    opening = f"[{tag}{attributes}]"
    return f"{opening} ... [/{tag}] (each tag on its own line)" if syntax.has_body else opening


class _Reply:
    """A reply's lines (without their CR) and where each closing tag stands alone on a line."""

    def __init__(self, text: str) -> None:
        self.lines = [line.removesuffix("\r") for line in text.split("\n")]
        self._closings: dict[str, list[int]] = {}
        for index, line in enumerate(self.lines):
            closing = _CLOSING_LINE.fullmatch(line.strip())
            if closing:
                self._closings.setdefault(closing.group(1), []).append(index)

    def closing_after(self, index: int, tag: str) -> int | None:
        """The first line after `index` that closes `tag` (indexed once: many unclosed tags stay linear)."""
        positions = self._closings.get(tag, [])
        found = bisect_right(positions, index)
        return positions[found] if found < len(positions) else None


def _build(tag: str, attributes: dict[str, str], body: list[str], line: int) -> Command | ParseError:
    syntax = _SYNTAX[tag]
    missing = [key for key in syntax.attributes if key not in attributes]
    if missing:
        names = " and ".join(missing)
        noun = "attribute" if len(missing) == 1 else "attributes"
        return ParseError(f"{tag} is missing the {names} {noun}; write {_usage(tag)}", line)
    try:
        return syntax.build(attributes, body)
    except _Malformed as exc:
        return ParseError(str(exc), line)


def _parse_unknown(reply: _Reply, index: int, tag: str, trimmed: str) -> tuple[ParseError | None, int]:
    """A whole-line tag with an upper-snake-case name (e.g. [WRITE_FILE ...]) is an unknown command.

    Other bracketed text ([NOTE], [1, 2]) is prose. A closed unknown block is skipped whole.
    """
    if "_" not in tag or not _TAG_LINE.fullmatch(trimmed):
        return None, index + 1
    known = ", ".join(_SYNTAX)
    error = ParseError(f"unknown command {tag}; the commands are {known}", index + 1)
    closing = reply.closing_after(index, tag)
    return error, (index + 1 if closing is None else closing + 1)


def _parse_at(reply: _Reply, index: int) -> tuple[Command | ParseError | None, int]:
    """The item starting on line `index` (None for prose) and the index to continue from."""
    trimmed = reply.lines[index].strip()
    start = _TAG_START.match(trimmed)
    if start is None:
        return None, index + 1
    tag, line = start.group(1), index + 1
    if tag not in _SYNTAX:
        return _parse_unknown(reply, index, tag, trimmed)
    opening = _TAG_LINE.fullmatch(trimmed)
    if opening is None:
        message = f"{tag}: the opening tag must end with ']' and stand alone on its line; write {_usage(tag)}"
        return ParseError(message, line), index + 1
    attributes = dict(_ATTRIBUTE.findall(opening.group(2)))
    if not _SYNTAX[tag].has_body:
        return _build(tag, attributes, [], line), index + 1
    closing = reply.closing_after(index, tag)
    if closing is None:
        message = f"{tag} block opened on line {line} has no closing [/{tag}] line (it must stand alone on its line)"
        return ParseError(message, line), index + 1
    return _build(tag, attributes, reply.lines[index + 1 : closing], line), closing + 1


def parse_response(text: str) -> list[Command | ParseError]:
    """The command blocks of a reply, in order; malformed blocks become ParseError items.

    Text outside blocks is ignored. After an unclosed block, parsing resumes on the line
    after its opening tag; a block with bad attributes is skipped up to its closing tag.
    """
    reply = _Reply(text)
    items: list[Command | ParseError] = []
    index = 0
    while index < len(reply.lines):
        item, index = _parse_at(reply, index)
        if item is not None:
            items.append(item)
    return items
