"""The built-in tools, in the order the spec lists them."""

from __future__ import annotations

from .registry import Tool, ToolRegistry


def builtin_tools() -> list[Tool]:
    return []


def builtin_registry() -> ToolRegistry:
    return ToolRegistry(builtin_tools())
