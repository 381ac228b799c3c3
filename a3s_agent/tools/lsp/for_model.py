"""What the model's tools take from a language server that runs for their workspace: the errors a
file has after edit_file or write_file changed it, and find_definition / find_references answered
by the server (which knows scopes and imports) instead of by tree-sitter's parse, which stays the
fallback when no server runs, none answers in time, or it finds nothing.

Nothing here starts a server: an edit does not wait for one to start and index the workspace.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from ...base.errors import AgentError
from ..registry import ToolContext, ToolFailure, ToolOutput
from ..workspace_paths import open_in_workspace, workspace_root
from .catalog import ALIASES
from .types import Location, Symbol

if TYPE_CHECKING:
    from .client import LanguageServer

log = logging.getLogger(__name__)

EDIT_WAIT_S = 10.0
"""After an edit: how long the file's diagnostics are awaited before the result goes without them."""
MAX_ERRORS_SHOWN = 20
MAX_DEFINITIONS = 20
"""Definitions whose references find_references asks for (a name defined in many places)."""
MAX_SOURCE_BYTES = 2_000_000
MAX_LINE_CHARS = 200


async def with_new_errors(result: ToolOutput, ctx: ToolContext) -> ToolOutput:
    """`result` of a successful edit or write of the file in its metadata's `path`, with the errors
    a language server running for that file's language reports in it now (at most
    MAX_ERRORS_SHOWN listed; metadata `lsp_errors` counts them all)."""
    rel = result.metadata.get("path")
    if ctx.lsp is None or not result.success or not isinstance(rel, str):
        return result
    server = ctx.lsp.running_for_file(ctx.workspace, PurePath(rel))
    if server is None:
        return result
    try:
        found = await server.diagnostics(rel, EDIT_WAIT_S)
    except (AgentError, OSError) as exc:
        log.info("no diagnostics from %s after the change of %s: %s", server.name, rel, exc)
        return result
    errors = [d for d in found if d.severity == "error"]
    result.metadata["lsp_errors"] = len(errors)
    if not errors:
        result.output += f"\n\n{server.name} reports no errors in {rel}."
        return result
    lines = [
        f"{rel}:{d.range.start.line + 1}:{d.range.start.character + 1}: {_one_line(d.message)}"
        + (f" [{d.code}]" if d.code else "")
        for d in errors[:MAX_ERRORS_SHOWN]
    ]
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"[and {len(errors) - MAX_ERRORS_SHOWN} more]")
    result.output += f"\n\n{server.name} reports {len(errors)} error(s) in {rel} now:\n" + "\n".join(lines)
    return result


def _one_line(message: str) -> str:
    return " ".join(message.split())


# --- code navigation ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Site:
    """A place in a file as find_definition and find_references show it: 1-based line and column."""

    path: str
    line: int
    column: int
    kind: str
    text: str
    character: int = field(default=0, compare=False)
    """The column as LSP counts it (0-based, in UTF-16 code units)."""


@dataclass
class Found:
    server: str
    sites: list[Site]
    truncated: bool = False


def servers_for(ctx: ToolContext, target: str, language: str | None) -> list[LanguageServer]:
    """The running servers that know `target` (a workspace-relative file or directory) in
    `language` (a tree-sitter language name, or any)."""
    if ctx.lsp is None:
        return []
    suffix = PurePath(target).suffix
    if suffix:
        server = ctx.lsp.running_for_file(ctx.workspace, PurePath(target))
        return [server] if server is not None else []
    running = ctx.lsp.running_in(ctx.workspace)
    if language is None:
        return running
    wanted = ALIASES.get(language, language)
    return [server for server in running if server.language.name == wanted]


async def definitions(servers: Sequence[LanguageServer], symbol: str, target: str) -> Found | None:
    """The definitions of `symbol` under `target` the first server that knows any of them
    reports (workspace symbols named exactly so); None when none does."""
    for server in servers:
        sites = await _definition_sites(server, symbol)
        inside = [site for site in sites if _under(site.path, target)]
        if inside:
            return Found(server.name, sorted(inside))
    return None


async def references(
    servers: Sequence[LanguageServer], symbol: str, target: str, include_definition: bool, limit: int
) -> Found | None:
    """The uses under `target` of what `symbol` names where it is defined (in the whole
    workspace), as the first server that knows a definition reports them; None when none does."""
    for server in servers:
        sites = await _definition_sites(server, symbol)
        if not sites:
            continue
        locations: set[Location] = set()
        try:
            for site in sites[:MAX_DEFINITIONS]:
                locations.update(
                    await server.references(site.path, site.line - 1, site.character, include_definition)
                )
        except (AgentError, OSError) as exc:
            log.info("%s could not list the references of %s: %s", server.name, symbol, exc)
            return None
        found = sorted(s for s in await _sites(server, locations, "") if _under(s.path, target))
        return Found(server.name, found[:limit], truncated=len(found) > limit)
    return None


async def _definition_sites(server: LanguageServer, symbol: str) -> list[Site]:
    try:
        symbols = await server.symbols(symbol, 1000)
    except (AgentError, OSError) as exc:
        log.info("%s could not look up %s: %s", server.name, symbol, exc)
        return []
    named = [found for found in symbols if found.name == symbol]
    return await _sites(server, [s.location for s in named], symbol, {s.location: s for s in named})


async def _sites(
    server: LanguageServer,
    locations: Iterable[Location],
    name: str,
    symbols: dict[Location, Symbol] | None = None,
) -> list[Site]:
    """The locations in the workspace as sites (the line's text read from the file, the column
    moved onto `name` where a server's range starts before it)."""
    by_file: dict[str, list[Location]] = {}
    for location in locations:
        rel = _relative(server.workspace, location.uri)
        if rel is not None:
            by_file.setdefault(rel, []).append(location)
    return await asyncio.to_thread(_read_sites, server.workspace, by_file, name, symbols or {})


def _read_sites(
    workspace: Path, by_file: dict[str, list[Location]], name: str, symbols: dict[Location, Symbol]
) -> list[Site]:
    sites = []
    for rel, locations in by_file.items():
        lines = _lines(workspace, rel)
        if lines is None:
            continue
        for location in locations:
            start = location.range.start
            if start.line >= len(lines):
                continue
            text = lines[start.line]
            column = _code_points(text, start.character)
            if name and (at := text.find(name, column)) >= 0:
                column = at
            symbol = symbols.get(location)
            shown = text.strip()
            if len(shown) > MAX_LINE_CHARS:
                shown = shown[:MAX_LINE_CHARS] + "…"
            kind = symbol.kind if symbol else ""
            sites.append(Site(rel, start.line + 1, column + 1, kind, shown, _utf16_units(text[:column])))
    return sites


def _lines(workspace: Path, rel: str) -> list[str] | None:
    try:
        fd = open_in_workspace(workspace, rel, os.O_RDONLY | os.O_CLOEXEC)
    except (ToolFailure, OSError):
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        return None
    return data.decode("utf-8", errors="replace").split("\n")


def _code_points(text: str, utf16_units: int) -> int:
    """The character index of a UTF-16 offset into `text` (LSP's columns)."""
    units = 0
    for index, char in enumerate(text):
        if units >= utf16_units:
            return index
        units += 2 if ord(char) > 0xFFFF else 1
    return len(text)


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _relative(workspace: Path, uri: str) -> str | None:
    """A file:// URI beneath the workspace as a workspace-relative path; None for anything else."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    path = PurePath(os.path.normpath(unquote(parsed.path)))
    root = workspace_root(workspace)
    if not path.is_relative_to(root):
        return None
    return path.relative_to(root).as_posix()


def _under(path: str, target: str) -> bool:
    return target == "." or path == target or path.startswith(target.rstrip("/") + "/")
