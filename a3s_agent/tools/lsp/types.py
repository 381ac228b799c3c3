"""What the language servers answer, in our own shapes (what A3S's LSP messages carry): positions
0-based, in the server's UTF-16 code units as LSP counts them; symbol kinds and severities as
lower-case words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info", "hint"]


@dataclass(frozen=True, order=True)
class Position:
    line: int
    character: int


@dataclass(frozen=True, order=True)
class Range:
    start: Position
    end: Position


@dataclass(frozen=True, order=True)
class Location:
    uri: str
    range: Range


@dataclass(frozen=True)
class Hover:
    content: str
    """Markdown (or plain text, as the server gave it)."""
    range: Range | None


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: str
    """LSP's SymbolKind as a word: "function", "class", "type_parameter"..."""
    location: Location
    container_name: str | None


@dataclass(frozen=True)
class Diagnostic:
    uri: str
    range: Range
    severity: Severity
    message: str
    code: str | None
    source: str | None


@dataclass(frozen=True)
class ServerInfo:
    language: str
    name: str
    """The server's own name (from its initialize answer), else its program's."""
    version: str | None
    running: bool
    workspace: str
