"""The CodingAgent text protocol: tag commands parsed from model replies, and the outbox document.

A model without function calling (or a human relaying a web chat through outbox/inbox
files) answers with command blocks such as

    [CREATE_FILE path="src/app.py"]
    print("hello")
    [/CREATE_FILE]

`parse_response` turns a reply into commands, and malformed blocks into `ParseError`
items (never exceptions) so the model can be told what to fix. `render` writes the
canonical text of a command, `render_outbox` the four-section outbox file, and
`apply_line_edit` gives EDIT_FILE its line-range semantics. No I/O happens here.

Bodies: CREATE_FILE and EDIT_FILE keep every body line verbatim, each ending with "\\n"
(CRLF is read as LF), so an empty body is "" and a single blank line is "\\n".
RUN_COMMAND, MESSAGE and DONE bodies are stripped of surrounding whitespace.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

PROTOCOL_VERSION = "1.0"
RUN_COMMAND_TIMEOUT_SECONDS = 30
MAX_OUTPUT_CHARS = 4000

SECTION_HEADER = "=== HEADER ==="
SECTION_PROTOCOL = "=== PROTOCOL ==="
SECTION_CONTEXT = "=== CONTEXT ==="
SECTION_PROMPT = "=== PROMPT ==="

CONTINUATION_PROMPT = (
    "Continue working on the task based on the results above. "
    "If the task is complete, send [DONE] with a summary."
)
PARSE_ERROR_LABEL = "PARSE_ERROR"
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


# Parsing

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


# Rendering commands


def _attribute(key: str, value: str) -> str:
    if '"' in value or "\n" in value or "\r" in value:
        raise ValueError(f"{key} {value!r} cannot be written as an attribute (no quotes or line breaks)")
    return f' {key}="{value}"'


def _rendered_path(path: str) -> str:
    if not path.strip():
        raise ValueError("path is empty")
    return _attribute("path", path)


def _block(tag: str, attributes: str, body: str) -> str:
    closing = f"[/{tag}]"
    if any(line.strip() == closing for line in body.split("\n")):
        raise ValueError(f"the body of {tag} has a line {closing}, which would end the block early")
    if body and not body.endswith("\n"):
        body += "\n"
    return f"[{tag}{attributes}]\n{body}{closing}"


def _rendered_range(command: EditFile) -> str:
    if not 1 <= command.start_line <= command.end_line:
        raise ValueError(f"invalid line range {command.start_line}-{command.end_line}")
    return _attribute("start_line", str(command.start_line)) + _attribute("end_line", str(command.end_line))


def render(command: Command) -> str:
    """The canonical text of a command (no trailing newline); parse_response reads it back.

    A body without a final newline gets one. Raises ValueError for a command the syntax
    cannot express: an empty path, quotes or line breaks in a path, a body line that is the
    block's closing tag, an invalid line range, an empty RUN_COMMAND.
    """
    match command:
        case CreateFile(path, content):
            return _block(command.tag, _rendered_path(path), content)
        case EditFile(path, _, _, content):
            return _block(command.tag, _rendered_path(path) + _rendered_range(command), content)
        case DeleteFile(path) | ReadFile(path):
            return f"[{command.tag}{_rendered_path(path)}]"
        case RunCommand(text) if not text.strip():
            raise ValueError("RUN_COMMAND needs a command")
        case RunCommand(text) | Message(text) | Done(text):
            return _block(command.tag, "", text)
    raise TypeError(f"not a command: {command!r}")


# Paths and line edits


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


# The PROTOCOL section: identical in every outbox, and the system prompt of tag tool mode

PROTOCOL_INSTRUCTIONS = f"""\
You are a coding agent working in a project workspace. You act only through the commands \
below: the agent carries them out in the order you write them and reports the results in \
its next message, together with the workspace files and any file contents you asked for.

## Commands

Write each command as a block. The opening tag starts a line of its own. A closing tag \
must stand alone on its line, exactly as shown. Attribute values go in double quotes. \
Text outside command blocks (explanations, plans) is ignored, so it is fine to think out \
loud between commands.

### CREATE_FILE - create a file, or overwrite it
[CREATE_FILE path="src/hello.py"]
def greet(name):
    return f"Hello, {{name}}!"
[/CREATE_FILE]
The body is the whole file, kept exactly as written, indentation included.

### EDIT_FILE - replace a range of lines in an existing file
[EDIT_FILE path="src/hello.py" start_line="2" end_line="2"]
    return f"Hi, {{name}}!"
[/EDIT_FILE]
Lines are numbered from 1 and the range includes both start_line and end_line. The \
replacement may have more or fewer lines than the range; an empty body deletes the lines. \
Edits run one after another, so when you edit one file several times in a reply, start \
with the edit lowest in the file.

### DELETE_FILE - delete a file (no body, no closing tag)
[DELETE_FILE path="src/old.py"]

### READ_FILE - ask for a file's contents (no body, no closing tag)
[READ_FILE path="src/hello.py"]
The contents appear under "## Requested File Contents" in the next message.

### RUN_COMMAND - run a shell command
[RUN_COMMAND]
python -m pytest -q
[/RUN_COMMAND]
The command runs with /bin/sh -c (cmd.exe /c on Windows) in the workspace root and is \
stopped after {RUN_COMMAND_TIMEOUT_SECONDS} seconds. Its stdout and stderr are captured; \
at most the first {MAX_OUTPUT_CHARS} characters come back. A non-zero exit code is reported \
as a failure.

### MESSAGE - show a message to the user
[MESSAGE]
Tests pass; next I will add the command-line interface.
[/MESSAGE]

### DONE - finish the task
[DONE]
Added greet() in src/hello.py with its tests.
[/DONE]
The body summarises what was done. The session ends after DONE.

## Paths
1. Every path is relative to the workspace root and uses forward slashes, e.g. src/hello.py.
2. Absolute paths and paths containing .. are rejected.
3. CREATE_FILE creates missing parent directories.

## Rules
1. You may send several commands in one reply; they run in the order written.
2. Before editing a file you have not seen, READ_FILE it so your line numbers match; the \
contents arrive in the next message, so make the edit in your next reply.
3. Read the results of your commands in the next message and fix whatever failed. A \
malformed command is reported as a {PARSE_ERROR_LABEL} result; correct it and send it again.
4. When the task is fully complete, and only then, send DONE with a summary."""


# The outbox


def truncate_output(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """`text` cut to its first `limit` characters, with a note saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[output truncated: first {limit} of {len(text)} characters shown]"


def _hanging(text: str, indent: str) -> str:
    """Indent every line but the first, so multi-line text stays inside its entry."""
    return text.replace("\n", f"\n{indent}")


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one command, as listed under "## Previous Command Results"."""

    command_label: str
    ok: bool
    message: str
    output: str = ""

    @classmethod
    def from_parse_error(cls, error: ParseError) -> CommandResult:
        return cls(PARSE_ERROR_LABEL, False, f"line {error.line}: {error.message}")

    def format(self) -> str:
        """`[OK] LABEL: message` or `[FAILED] ...`, then `  Output: ...` when there is output."""
        status = "OK" if self.ok else "FAILED"
        text = _hanging(f"[{status}] {self.command_label}: {self.message}", "  ")
        output = self.output.strip()
        if output:
            text += "\n" + _hanging(f"  Output: {truncate_output(output)}", "    ")
        return text


def _header(session: str, sequence: int, task: str) -> str:
    return f"{SECTION_HEADER}\nSession: {session}\nSequence: {sequence}\nTask: {' '.join(task.split())}"


def _workspace_files(files: list[tuple[str, int]]) -> str:
    listing = [f"  {path} ({size} bytes)" for path, size in files] or ["(empty workspace)"]
    return "\n".join(["## Workspace Files", *listing])


def _previous_results(results: list[CommandResult]) -> str:
    entries = [result.format() for result in results] or ["(no commands were found in the previous response)"]
    return "\n".join(["## Previous Command Results", *entries])


def _requested_file(path: str, content: str) -> str:
    body = content if not content or content.endswith("\n") else f"{content}\n"
    return f"--- {path} ---\n{body}--- end {path} ---"


def _requested_files(requested_files: list[tuple[str, str]]) -> str:
    blocks = [_requested_file(path, content) for path, content in requested_files]
    return "\n".join(["## Requested File Contents", *blocks])


def _context(
    files: list[tuple[str, int]],
    results: list[CommandResult],
    requested_files: list[tuple[str, str]],
    continuation: bool,
) -> str:
    parts = [_workspace_files(files)]
    if results or continuation:
        parts.append(_previous_results(results))
    if requested_files:
        parts.append(_requested_files(requested_files))
    return SECTION_CONTEXT + "\n" + "\n\n".join(parts)


def render_outbox(
    session: str,
    sequence: int,
    task: str,
    files: list[tuple[str, int]],
    results: list[CommandResult],
    requested_files: list[tuple[str, str]],
    continuation: bool,
) -> str:
    """The outbox document: HEADER, PROTOCOL, CONTEXT and PROMPT, separated by blank lines.

    `files` are (path, size in bytes), `requested_files` (path, contents) for the files
    the previous reply asked for with READ_FILE. The prompt is the task on the first turn
    and CONTINUATION_PROMPT when `continuation` is set; the results section appears from
    the second turn on (or whenever there are results).
    """
    prompt = CONTINUATION_PROMPT if continuation else task.strip()
    sections = [
        _header(session, sequence, task),
        f"{SECTION_PROTOCOL}\n{PROTOCOL_INSTRUCTIONS}",
        _context(files, results, requested_files, continuation),
        f"{SECTION_PROMPT}\n{prompt}",
    ]
    return "\n\n".join(sections) + "\n"
