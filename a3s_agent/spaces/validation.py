"""Checking operations messages against protocol 1.0: its validation rules and its JSON Schema.

A malformed message as a whole raises MessageInvalid; a malformed operation is reported by
`operation_problems` so the run can skip it with an `error` event and go on with the rest.
The schema lets operations carry fields it does not name, so unknown fields are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ..base.errors import InvalidArgument

PROTOCOL_VERSION: Final = "1.0"
OPERATION_TYPES: Final = ("message", "createFile", "readFile", "editFile", "deleteFile", "shell")
ENCODINGS: Final = ("utf-8", "base64")
MAX_PATH_CHARS: Final = 255
MAX_CONTENT_BYTES: Final = 10 * 1024 * 1024
MAX_MESSAGE_CHARS: Final = 100_000
MAX_COMMAND_CHARS: Final = 4096
MIN_TIMEOUT_MS: Final = 1000
MAX_TIMEOUT_MS: Final = 3_600_000


class MessageInvalid(InvalidArgument):
    """The operations message as a whole is malformed (not an operation inside it)."""


@dataclass(frozen=True)
class Problem:
    """One way an operation breaks the rules: the field at fault ('' for the whole operation)."""

    field: str
    message: str


def check_message(message: Any) -> list[Any]:
    """The operations of a well-formed operations message; MessageInvalid names the fault otherwise."""
    if not isinstance(message, dict):
        raise MessageInvalid(f"the operations message must be a JSON object, not {_json_type(message)}")
    if "protocolVersion" not in message:
        raise MessageInvalid(f'protocolVersion is required (use "{PROTOCOL_VERSION}")')
    if message["protocolVersion"] != PROTOCOL_VERSION:
        raise MessageInvalid(
            f'protocolVersion must be "{PROTOCOL_VERSION}", not {message["protocolVersion"]!r}'
        )
    if "operations" not in message:
        raise MessageInvalid("operations is required: a list of operations")
    operations = message["operations"]
    if not isinstance(operations, list):
        raise MessageInvalid(f"operations must be a list, not {_json_type(operations)}")
    return operations


def path_problem(path: str) -> str | None:
    """The spec's isValidPath: relative, no `..` anywhere, no NUL, at most 255 characters."""
    if path.startswith("/"):
        return "must be relative (no leading '/')"
    if ".." in path:
        return "must not contain '..'"
    if "\0" in path:
        return "must not contain a NUL byte"
    if len(path) > MAX_PATH_CHARS:
        return f"must be at most {MAX_PATH_CHARS} characters (got {len(path)})"
    return None


def operation_problems(operation: Any) -> list[Problem]:
    """Every way `operation` breaks the rules, in field order; empty when it is valid."""
    if not isinstance(operation, dict):
        return [Problem("", f"an operation must be a JSON object, not {_json_type(operation)}")]
    kind = operation.get("type")
    if not isinstance(kind, str) or kind not in OPERATION_TYPES:
        shown = "missing" if "type" not in operation else repr(kind)
        return [Problem("type", f"type must be one of {', '.join(OPERATION_TYPES)} ({shown})")]
    problems: list[Problem] = []
    if "id" in operation and not isinstance(operation["id"], str):
        problems.append(Problem("id", f"id must be a string, not {_json_type(operation['id'])}"))
    for name, (check, required) in _FIELDS[kind].items():
        if name not in operation:
            if required:
                problems.append(Problem(name, f"{name} is required for {kind}"))
            continue
        fault = check(operation[name])
        if fault is not None:
            problems.append(Problem(name, f"{name} {fault}"))
    return problems


# --- field checks: each returns what is wrong, or None ---------------------------------------------

Check = Callable[[Any], str | None]


def _string(value: Any, max_chars: int | None = None) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, not {_json_type(value)}"
    if max_chars is not None and len(value) > max_chars:
        return f"must be at most {max_chars} characters (got {len(value)})"
    return None


def _message_content(value: Any) -> str | None:
    return _string(value, MAX_MESSAGE_CHARS)


def _command(value: Any) -> str | None:
    return _string(value, MAX_COMMAND_CHARS)


def _path(value: Any) -> str | None:
    return _string(value) or path_problem(value)


def _file_content(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, not {_json_type(value)}"
    # A character is 1 to 4 UTF-8 bytes: encode only when the length alone does not decide.
    if len(value) * 4 <= MAX_CONTENT_BYTES:
        return None
    if len(value) > MAX_CONTENT_BYTES or len(value.encode("utf-8", "surrogatepass")) > MAX_CONTENT_BYTES:
        return f"must be at most {MAX_CONTENT_BYTES} bytes (10 MB) of UTF-8"
    return None


def _encoding(value: Any) -> str | None:
    if isinstance(value, str) and value in ENCODINGS:
        return None
    return f"must be one of {', '.join(ENCODINGS)} (got {value!r})"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, not {_json_type(value)}"


def _timeout(value: Any) -> str | None:
    # JSON Schema's integer includes 60000.0; booleans are not numbers.
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral:
        return f"must be an integer number of milliseconds, not {_json_type(value)}"
    if not MIN_TIMEOUT_MS <= value <= MAX_TIMEOUT_MS:
        return f"must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS} ms (got {value})"
    return None


def _env(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be an object of strings, not {_json_type(value)}"
    for key, item in value.items():
        if not isinstance(item, str):
            return f"value of {key!r} must be a string, not {_json_type(item)}"
    return None


def _edits(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"must be a list of edits, not {_json_type(value)}"
    for index, edit in enumerate(value):
        if not isinstance(edit, dict):
            return f"[{index}] must be an object with oldContent and newContent, not {_json_type(edit)}"
        for name in ("oldContent", "newContent"):
            if name not in edit:
                return f"[{index}].{name} is required"
            if not isinstance(edit[name], str):
                return f"[{index}].{name} must be a string, not {_json_type(edit[name])}"
    return None


# Per operation type: field -> (check, required). `type` and `id` are checked for every type.
_FIELDS: Final[dict[str, dict[str, tuple[Check, bool]]]] = {
    "message": {"content": (_message_content, True)},
    "createFile": {
        "path": (_path, True),
        "content": (_file_content, True),
        "encoding": (_encoding, False),
        "overwrite": (_boolean, False),
    },
    "readFile": {"path": (_path, True), "encoding": (_encoding, False)},
    "editFile": {"path": (_path, True), "edits": (_edits, True)},
    "deleteFile": {"path": (_path, True)},
    "shell": {
        "command": (_command, True),
        "cwd": (_path, False),
        "timeout": (_timeout, False),
        "env": (_env, False),
    },
}


def _json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
