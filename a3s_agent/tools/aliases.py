"""A3S Code's names for the built-in tools and their arguments, accepted as ours.

A3S Code calls its tools `read`, `write`, `edit`, `bash`, `grep`, `glob` and `ls`, and names some
arguments differently (`file_path`, `timeout` in milliseconds, grep's `-i`). A client, a model
trained on A3S Code or a permission rule that uses those names reaches our tool with our names:
ExecuteTool and the model's calls find the tool by its alias, every built-in tool's arguments are
renamed before validation, and permission rules and CheckPermission see the renamed arguments.
A name that is a tool of its own (a skill's `read`) stays that tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeVar

from ..base.errors import InvalidArgument

# A3S Code's tool name -> ours, where they differ (`bash` and `grep` are the same).
TOOL_NAMES: Final[Mapping[str, str]] = {
    "read": "read_file",
    "write": "write_file",
    "edit": "edit_file",
    "glob": "search_files",
    "ls": "list_files",
}

# Our tool -> {A3S Code's argument name: ours}. old_string, new_string, replace_all, content,
# offset, limit, pattern, path, glob, context and command are the same in both.
ARGUMENT_NAMES: Final[Mapping[str, Mapping[str, str]]] = {
    "read_file": {"file_path": "path"},
    "write_file": {"file_path": "path"},
    "edit_file": {"file_path": "path"},
    "bash": {"timeout": "timeout_ms"},
    "grep": {"-i": "case_insensitive"},
}

T = TypeVar("T")


def our_tool_name(name: str) -> str:
    """The built-in tool an A3S Code name stands for; any other name unchanged."""
    return TOOL_NAMES.get(name, name)


def find_tool(tools: Mapping[str, T], name: str) -> T | None:
    """The tool `name` calls among `tools`: its own, else the one its A3S Code name stands for."""
    found = tools.get(name)
    return found if found is not None else tools.get(our_tool_name(name))


def our_arguments(tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """`arguments` of our tool `tool` with A3S Code's argument names renamed to ours; the same
    argument given under both names with different values is InvalidArgument."""
    renamed = dict(arguments)
    for alias, ours in ARGUMENT_NAMES.get(tool, {}).items():
        if alias not in renamed:
            continue
        value = renamed.pop(alias)
        if ours in renamed and renamed[ours] != value:
            raise InvalidArgument(
                f"arguments for {tool}: {alias!r} (A3S Code's name for {ours!r}) and {ours!r} differ;"
                " give one of them"
            )
        renamed[ours] = value
    return renamed
