"""Writing the protocol: commands as canonical text, the PROTOCOL instructions, command results,
and the four-section outbox document. No I/O happens here."""

from __future__ import annotations

from dataclasses import dataclass

from .commands import (
    RUN_COMMAND_TIMEOUT_SECONDS,
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

PROTOCOL_VERSION = "1.0"
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
