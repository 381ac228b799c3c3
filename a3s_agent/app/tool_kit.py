"""What a face needs to make tools of its own and run them as the built-in tools run: ACP's file
and shell tools that go through the editor share the built-in ones' arguments, checks and output
formats, and its plan tool is a tool like ours; coven reports the workspace's git state with git
run as the git tools run it (tools/safe_git.py).

Faces import these from here, never from tools/ (the contract "Faces see only the application
layer" in pyproject.toml); the tool types themselves are in app/types.py.
"""

from __future__ import annotations

from ..tools.builtin import builtin_tools
from ..tools.files import (
    MAX_WRITE_BYTES,
    EditFileArgs,
    ReadFileArgs,
    WriteFileArgs,
    apply_edit,
    check_edit,
    edit_output,
    read_text,
)
from ..tools.images import MAGIC_BYTES, looks_like_image
from ..tools.process import ProcessResult
from ..tools.registry import ToolContext, ToolRegistry, tool
from ..tools.safe_git import base_git
from ..tools.shell import BashArgs, command_output, output_cap
from ..tools.workspace_paths import relative_to_workspace, resolve_in_workspace

__all__ = [
    "MAGIC_BYTES",
    "MAX_WRITE_BYTES",
    "BashArgs",
    "EditFileArgs",
    "ProcessResult",
    "ReadFileArgs",
    "ToolContext",
    "ToolRegistry",
    "WriteFileArgs",
    "apply_edit",
    "base_git",
    "builtin_tools",
    "check_edit",
    "command_output",
    "edit_output",
    "looks_like_image",
    "output_cap",
    "read_text",
    "relative_to_workspace",
    "resolve_in_workspace",
    "tool",
]
