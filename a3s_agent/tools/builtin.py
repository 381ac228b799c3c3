"""The built-in tools, in the order the A3S interface lists them, then ours (todo); edit_lines,
offered only to text-protocol models, is not listed."""

from __future__ import annotations

from . import code_search, files, git, line_edits, quality, shell, symbols, todo, user, web
from .registry import Tool, ToolRegistry


def builtin_tools() -> list[Tool]:
    return [
        *files.TOOLS,
        *line_edits.TOOLS,
        *code_search.TOOLS,
        *symbols.TOOLS,
        *quality.TOOLS,
        *shell.TOOLS,
        *git.TOOLS,
        *web.TOOLS,
        *user.TOOLS,
        *todo.TOOLS,
    ]


def builtin_registry() -> ToolRegistry:
    return ToolRegistry(builtin_tools())
