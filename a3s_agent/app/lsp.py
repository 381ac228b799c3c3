"""Language servers over the API (A3S's StartLspServer, LspHover, ...): which workspace a request
means, and the server of that workspace and language (tools/lsp/) that answers it.

A3S's LSP requests name no session. A server's workspace is StartLspServer's `root_uri` (a
directory in the workspace root; empty: the server's workspace), and a file's is the deepest of
the server's workspace, the sessions' workspaces and the running servers' roots that holds it: a
file outside all of them is refused. A relative `file_path` is taken from the server's workspace.
Servers for a file's language start on demand.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from ..base.errors import FailedPrecondition, InvalidArgument
from ..core.sessions.manager import existing_directory, inside_root
from ..runtime import Runtime
from ..tools.lsp.types import Diagnostic, Hover, Location, Position, Range, ServerInfo, Symbol

if TYPE_CHECKING:  # lsprotocol is imported once a server starts
    from ..tools.lsp.client import LanguageServer

__all__ = ["Diagnostic", "Hover", "Location", "Lsp", "Position", "Range", "ServerInfo", "Symbol"]

DEFAULT_SYMBOLS = 20
MAX_SYMBOLS = 1000
MAX_DIAGNOSTICS = 1000
MAX_PATH_CHARS = 4096


class Lsp:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def start(self, language: str, root_uri: str) -> ServerInfo:
        """The server of `language` for `root_uri`, started unless it runs. InvalidArgument for a
        root outside the workspace root, FailedPrecondition naming what to install for a language
        without a server, Unavailable when it does not start."""
        servers = self._rt.lsp
        found = servers.catalog.language(language)
        server = await servers.server(self._root(root_uri), found)
        return server.info()

    async def stop(self, language: str) -> bool:
        """Stop the servers of `language` (in every workspace); whether any ran."""
        servers = self._rt.lsp
        return await servers.stop(servers.catalog.language(language)) > 0

    def servers(self) -> list[ServerInfo]:
        return self._rt.lsp.servers()

    async def hover(self, file_path: str, line: int, column: int) -> Hover | None:
        server, rel = await self._server_for(file_path)
        return await server.hover(rel, line, column)

    async def definition(self, file_path: str, line: int, column: int) -> list[Location]:
        server, rel = await self._server_for(file_path)
        return await server.definition(rel, line, column)

    async def references(
        self, file_path: str, line: int, column: int, include_declaration: bool
    ) -> list[Location]:
        server, rel = await self._server_for(file_path)
        return await server.references(rel, line, column, include_declaration)

    async def symbols(self, query: str, limit: int) -> list[Symbol]:
        """Symbols matching `query` from every running server (`limit` 0: DEFAULT_SYMBOLS);
        FailedPrecondition when none runs."""
        running = self._rt.lsp.all()
        if not running:
            raise FailedPrecondition(
                "no language server is running: start one (StartLspServer) or ask about a file first"
            )
        limit = min(limit or DEFAULT_SYMBOLS, MAX_SYMBOLS)
        found: list[Symbol] = []
        for server in running:
            found += await server.symbols(query, limit - len(found))
            if len(found) >= limit:
                break
        return found

    async def diagnostics(self, file_path: str | None) -> list[Diagnostic]:
        """One file's diagnostics, after its server has seen its current content; without a file,
        what every running server reports for the files it has open (each sent its current
        content first)."""
        if file_path is not None:
            server, rel = await self._server_for(file_path)
            return await server.diagnostics(rel)
        found: list[Diagnostic] = []
        for server in self._rt.lsp.all():
            found += await server.all_diagnostics()
        return found[:MAX_DIAGNOSTICS]

    # --- where -------------------------------------------------------------------------------

    def _root(self, root_uri: str) -> Path:
        """The directory `root_uri` names (a file:// URI or a path); the server's workspace when empty."""
        if not root_uri.strip():
            return self._rt.workspace
        path = _path_of(root_uri, "root_uri")
        directory = existing_directory(path, "root_uri")
        if directory == self._rt.workspace:
            return directory
        return inside_root(directory, self._rt.settings.resolved_workspace_root, "root_uri")

    async def _server_for(self, file_path: str) -> tuple[LanguageServer, str]:
        """The server (started if need be) for the file, and the file relative to its workspace."""
        if not file_path.strip():
            raise InvalidArgument("file_path is required")
        path = _resolved(self._rt.workspace, _path_of(file_path, "file_path"))
        servers = self._rt.lsp
        language, _ = servers.catalog.of_file(path, "file_path")
        workspaces = [
            self._rt.workspace,
            *map(Path, self._rt.sessions.workspaces()),
            *(Path(info.workspace) for info in servers.servers() if info.language == language.name),
        ]
        holding = [w.resolve() for w in workspaces if path.is_relative_to(w.resolve())]
        if not holding:
            raise InvalidArgument(
                f"file_path {file_path[:300]!r} is outside the workspace {self._rt.workspace}"
                " (and every session's workspace)"
            )
        workspace = max(holding, key=lambda w: len(w.parts))
        server = await servers.server(workspace, language)
        return server, server.relative(path)


def _resolved(workspace: Path, path: Path) -> Path:
    """`path` (relative ones from `workspace`) absolute, `..` and symlinks resolved."""
    return Path(os.path.normpath(workspace / path)).resolve()


def _path_of(value: str, field: str) -> Path:
    """A path, or the path of a file:// URI; InvalidArgument naming `field` for anything else."""
    if len(value) > MAX_PATH_CHARS or "\x00" in value:
        raise InvalidArgument(f"{field} is longer than {MAX_PATH_CHARS} characters or holds a NUL byte")
    if "://" not in value:
        return Path(value)
    parsed = urlparse(value)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        raise InvalidArgument(f"{field} {value[:300]!r} must be a file:// URI on this machine or a path")
    return Path(unquote(parsed.path))
