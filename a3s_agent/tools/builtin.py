"""The built-in tools, in the order the A3S interface lists them."""

from __future__ import annotations

from . import code_search, files, git, quality, shell, symbols, user, web
from .registry import Tool, ToolRegistry


def builtin_tools() -> list[Tool]:
    return [
        *files.TOOLS,
        *code_search.TOOLS,
        *symbols.TOOLS,
        *quality.TOOLS,
        *shell.TOOLS,
        *git.TOOLS,
        *web.TOOLS,
        *user.TOOLS,
    ]


def builtin_registry() -> ToolRegistry:
    return ToolRegistry(builtin_tools())
