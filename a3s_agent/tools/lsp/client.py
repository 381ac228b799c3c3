"""One language server for one workspace and language: the LSP handshake, the documents it has
open (each synced from disk before it is asked about it, so answers and diagnostics are about the
file's current content), and its answers in our shapes (types.py).

Files are read beneath the workspace on descriptors (tools/workspace_paths.py): a symlink cannot
lead a request out of it. Every wait is bounded and every answer cut to a size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp

from ...base.errors import InvalidArgument, Unavailable
from ..sandbox import Place
from ..workspace_paths import open_in_workspace, relative_to_workspace, workspace_root
from . import connection
from .catalog import Language
from .types import Diagnostic, Hover, Location, Position, Range, ServerInfo, Severity, Symbol

START_TIMEOUT_S = 60.0
"""The handshake (a server indexing a large workspace may take a while to answer it)."""
REQUEST_TIMEOUT_S = 30.0
DIAGNOSTICS_WAIT_S = 15.0
"""How long a file's diagnostics are awaited after the server was sent its content."""
QUIET_S = 1.0
"""A server that does not say which version of a file its diagnostics are for: how long it must
publish nothing more for the file before the last it published counts as the file's."""
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_OPEN_DOCUMENTS = 200
"""Documents kept open in one server; the least recently used is closed past it."""
MAX_LOCATIONS = 1000
MAX_SYMBOLS = 1000
MAX_DIAGNOSTICS = 1000
MAX_KEPT_DIAGNOSTICS = 10_000
"""Diagnostics one server's client keeps (of the files it reported on last)."""
MAX_HOVER_CHARS = 64 * 1024
MAX_MESSAGE_CHARS = 2000
"""A diagnostic's message, cut to this."""

_SEVERITIES: dict[int, Severity] = {1: "error", 2: "warning", 3: "info", 4: "hint"}


@dataclass
class _Document:
    uri: str
    text: str
    version: int
    synced_at: int  # the server's event count when it was last sent this content


@dataclass
class _Published:
    at: int  # the server's event count when they arrived
    when: float  # and the time
    version: int | None
    diagnostics: list[Diagnostic]


class LanguageServer:
    """A running server of `language` for `workspace` (started by `start`)."""

    def __init__(self, language: Language, workspace: Path, env: Mapping[str, str]) -> None:
        self.language = language
        self.workspace = workspace_root(workspace)
        self.env = dict(env)
        self.name = Path(language.candidates[0].argv[0]).name
        self.version: str | None = None
        self.last_used = time.monotonic()
        self._running: connection.Running | None = None
        self._documents: OrderedDict[str, _Document] = OrderedDict()  # by workspace-relative path
        self._published: dict[str, _Published] = {}  # by URI, the most recently reported last
        self._kept = 0  # diagnostics in _published
        self._events = 0
        self._changed = asyncio.Condition()
        self._syncing = asyncio.Lock()

    # --- lifetime -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the server (contained, sandboxed for the workspace with the network off) and
        complete the handshake; FailedPrecondition when it is not installed, Unavailable when it
        does not start or answer."""
        argv = self.language.server()
        self.name = Path(argv[0]).name
        place = Place(self.workspace, None, network="off")
        try:
            self._running = await connection.start(
                self.name, argv, cwd=self.workspace, place=place, env=self.env, on_notification=self._notified
            )
        except OSError as exc:
            raise Unavailable(f"cannot start language server {self.name}: {exc.strerror or exc}") from exc
        folder = {"uri": self.workspace.as_uri(), "name": self.workspace.name or "/"}
        self._connection.workspace_folders = [folder]
        try:
            answer = await self._connection.request(
                lsp.INITIALIZE, _initialize_params(self.workspace), lsp.InitializeResponse, START_TIMEOUT_S
            )
            self._connection.said_hello = True
            await self._connection.notify(lsp.INITIALIZED, {})
        except BaseException:
            await self.stop()
            raise
        info = answer.result.server_info
        if info is not None:
            self.name, self.version = info.name, info.version
            self._connection.name = info.name

    @property
    def _connection(self) -> connection.Connection:
        if self._running is None:
            raise Unavailable(f"language server {self.name} is not running")
        return self._running.connection

    @property
    def running(self) -> bool:
        return self._running is not None and not self._running.connection.ended.is_set()

    async def stop(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            await running.stop()

    def info(self) -> ServerInfo:
        return ServerInfo(self.language.name, self.name, self.version, self.running, str(self.workspace))

    # --- questions about a position ---------------------------------------------------------

    async def hover(self, rel: str, line: int, column: int) -> Hover | None:
        params = lsp.HoverParams(await self._at(rel, line, column), lsp.Position(line, column))
        answer = await self._ask(lsp.TEXT_DOCUMENT_HOVER, params, lsp.HoverResponse)
        if answer.result is None:
            return None
        content = _markdown(answer.result.contents)[:MAX_HOVER_CHARS]
        return Hover(content, _range(answer.result.range)) if content.strip() else None

    async def definition(self, rel: str, line: int, column: int) -> list[Location]:
        params = lsp.DefinitionParams(await self._at(rel, line, column), lsp.Position(line, column))
        answer = await self._ask(lsp.TEXT_DOCUMENT_DEFINITION, params, lsp.DefinitionResponse)
        result = answer.result
        found: Sequence[lsp.Location | lsp.LocationLink] = (
            [result] if isinstance(result, lsp.Location) else result or []
        )
        return _locations(found)

    async def references(self, rel: str, line: int, column: int, include_declaration: bool) -> list[Location]:
        params = lsp.ReferenceParams(
            context=lsp.ReferenceContext(include_declaration),
            text_document=await self._at(rel, line, column),
            position=lsp.Position(line, column),
        )
        answer = await self._ask(lsp.TEXT_DOCUMENT_REFERENCES, params, lsp.ReferencesResponse)
        return _locations(answer.result or [])

    async def symbols(self, query: str, limit: int) -> list[Symbol]:
        """The workspace's symbols matching `query` (as the server matches: often fuzzily)."""
        params = lsp.WorkspaceSymbolParams(query=query)
        answer = await self._ask(lsp.WORKSPACE_SYMBOL, params, lsp.WorkspaceSymbolResponse)
        found: Sequence[lsp.SymbolInformation | lsp.WorkspaceSymbol] = answer.result or []
        return [_symbol(item) for item in found[: min(limit, MAX_SYMBOLS)]]

    # --- diagnostics ----------------------------------------------------------------------------

    async def diagnostics(self, rel: str, wait_s: float = DIAGNOSTICS_WAIT_S) -> list[Diagnostic]:
        """The file's diagnostics once the server has published them for its current content,
        waiting up to `wait_s` (after that, the last it published). (Servers publish them: this
        client does not offer to ask for them, LSP 3.17's pull diagnostics.)"""
        document = await self._sync(rel)
        await self._published_for(document, time.monotonic() + wait_s)
        published = self._published.get(document.uri)
        return published.diagnostics if published is not None else []

    async def all_diagnostics(self) -> list[Diagnostic]:
        """What the server last published for every file it has open (each sent its current
        content first) and for files it reported on its own."""
        deadline = time.monotonic() + DIAGNOSTICS_WAIT_S
        for rel in list(self._documents):
            try:
                document = await self._sync(rel)
            except (InvalidArgument, OSError):  # gone or grown too big since: closed
                await self._close(rel)
                continue
            await self._published_for(document, deadline)
        found = [d for published in self._published.values() for d in published.diagnostics]
        return found[:MAX_DIAGNOSTICS]

    def _keep(self, uri: str, published: _Published) -> None:
        """Keep a file's diagnostics as the newest; past MAX_KEPT_DIAGNOSTICS in all (a server
        reports on files it was not asked about too), the files reported on longest ago go."""
        old = self._published.pop(uri, None)
        self._kept += len(published.diagnostics) - (len(old.diagnostics) if old else 0)
        self._published[uri] = published
        while self._kept > MAX_KEPT_DIAGNOSTICS and len(self._published) > 1:
            oldest = next(iter(self._published))
            self._kept -= len(self._published.pop(oldest).diagnostics)

    async def _published_for(self, document: _Document, deadline: float) -> None:
        """Wait (until `deadline` at most) for the server to publish the document's diagnostics for
        its current content: those of its version where the server says which version it saw;
        else the last of those it publishes after it was sent the content, once it has published
        none for QUIET_S (typescript-language-server publishes a file's syntax errors first, its
        type errors a moment later)."""
        async with self._changed:
            while self.running:
                now, quiet_until = time.monotonic(), deadline
                published = self._published.get(document.uri)
                if published is not None and published.version is not None:
                    if published.version >= document.version:
                        return
                elif published is not None and published.at > document.synced_at:
                    quiet_until = published.when + QUIET_S
                    if now >= quiet_until:
                        return
                if now >= deadline:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(quiet_until, deadline) - now)

    async def _notified(self, method: str, params: Any) -> None:
        if method != lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS:
            return
        message = connection.CONVERTER.structure(params, lsp.PublishDiagnosticsParams)
        self._events += 1
        found = [_diagnostic(message.uri, d) for d in message.diagnostics[:MAX_DIAGNOSTICS]]
        self._keep(message.uri, _Published(self._events, time.monotonic(), message.version, found))
        async with self._changed:
            self._changed.notify_all()

    # --- documents ------------------------------------------------------------------------------

    async def _at(self, rel: str, line: int, column: int) -> lsp.TextDocumentIdentifier:
        """The document, synced, after checking the position lies in it."""
        document = await self._sync(rel)
        _check_position(document.text, line, column, rel)
        return lsp.TextDocumentIdentifier(document.uri)

    async def _sync(self, rel: str) -> _Document:
        """Open the file in the server, or send its new content if it changed since."""
        self.last_used = time.monotonic()
        async with self._syncing:
            text = await asyncio.to_thread(_read_text, self.workspace, rel)
            document = self._documents.get(rel)
            if document is not None and document.text == text:
                self._documents.move_to_end(rel)
                return document
            self._events += 1
            if document is None:
                uri = (self.workspace / rel).as_uri()
                document = _Document(uri, text, 1, self._events)
                language_id = self.language.extensions.get(Path(rel).suffix.lower(), self.language.name)
                item = lsp.TextDocumentItem(uri, language_id, 1, text)
                await self._connection.notify(lsp.TEXT_DOCUMENT_DID_OPEN, lsp.DidOpenTextDocumentParams(item))
                self._documents[rel] = document
                while len(self._documents) > MAX_OPEN_DOCUMENTS:
                    await self._close(next(iter(self._documents)))
            else:
                document.text, document.version, document.synced_at = text, document.version + 1, self._events
                change = lsp.TextDocumentContentChangeWholeDocument(text)
                params = lsp.DidChangeTextDocumentParams(
                    lsp.VersionedTextDocumentIdentifier(document.version, document.uri), [change]
                )
                await self._connection.notify(lsp.TEXT_DOCUMENT_DID_CHANGE, params)
                self._documents.move_to_end(rel)
            return document

    async def _close(self, rel: str) -> None:
        document = self._documents.pop(rel, None)
        if document is not None:
            params = lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(document.uri))
            await self._connection.notify(lsp.TEXT_DOCUMENT_DID_CLOSE, params)

    async def _ask(self, method: str, params: Any, answer: type[connection.Answer]) -> connection.Answer:
        self.last_used = time.monotonic()
        try:
            return await self._connection.request(method, params, answer, REQUEST_TIMEOUT_S)
        finally:
            self.last_used = time.monotonic()

    def relative(self, path: Path) -> str:
        return relative_to_workspace(self.workspace, path)


def _initialize_params(workspace: Path) -> lsp.InitializeParams:
    """What we tell a server we are and can do: plain text sync, markdown hovers, link-less
    definitions, versioned diagnostics, hierarchical symbols not asked for."""
    capabilities = lsp.ClientCapabilities(
        workspace=lsp.WorkspaceClientCapabilities(
            configuration=True,
            workspace_folders=True,
            symbol=lsp.WorkspaceSymbolClientCapabilities(),
        ),
        text_document=lsp.TextDocumentClientCapabilities(
            synchronization=lsp.TextDocumentSyncClientCapabilities(did_save=False),
            hover=lsp.HoverClientCapabilities(
                content_format=[lsp.MarkupKind.Markdown, lsp.MarkupKind.PlainText]
            ),
            definition=lsp.DefinitionClientCapabilities(link_support=False),
            references=lsp.ReferenceClientCapabilities(),
            publish_diagnostics=lsp.PublishDiagnosticsClientCapabilities(version_support=True),
        ),
        window=lsp.WindowClientCapabilities(work_done_progress=False),
        general=lsp.GeneralClientCapabilities(position_encodings=[lsp.PositionEncodingKind.Utf16]),
    )
    return lsp.InitializeParams(
        capabilities=capabilities,
        process_id=None,  # ours is not in its sandbox's pid namespace (it would exit, taking us for dead)
        client_info=lsp.ClientInfo("a3s-agent"),
        root_uri=workspace.as_uri(),
        root_path=str(workspace),
        workspace_folders=[lsp.WorkspaceFolder(workspace.as_uri(), workspace.name or "/")],
    )


def _read_text(workspace: Path, rel: str) -> str:
    """The file's text, read beneath the workspace; InvalidArgument for one that is not there,
    too large or not text."""
    try:
        fd = open_in_workspace(workspace, rel, os.O_RDONLY | os.O_CLOEXEC, field="file_path")
    except OSError as exc:
        raise InvalidArgument(f"file_path {rel!r}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InvalidArgument(
            f"file_path {rel!r} is over {MAX_FILE_BYTES} bytes, more than a language server is sent"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"file_path {rel!r} is not UTF-8 text") from None


def _check_position(text: str, line: int, column: int, rel: str) -> None:
    """A 0-based line and column (UTF-16 code units, as LSP counts) inside the text."""
    lines = text.split("\n")
    if line >= len(lines):
        raise InvalidArgument(f"line {line} is past the end of {rel} (lines 0 to {len(lines) - 1}, 0-based)")
    width = len(lines[line].rstrip("\r").encode("utf-16-le")) // 2
    if column > width:
        raise InvalidArgument(
            f"column {column} is past the end of line {line} of {rel} ({width} characters, 0-based)"
        )


def _markdown(contents: Any) -> str:
    """Hover contents (MarkupContent, a MarkedString or a list of them) as markdown."""
    if isinstance(contents, lsp.MarkupContent):
        return contents.value
    if isinstance(contents, str):
        return contents
    if isinstance(contents, lsp.MarkedStringWithLanguage):
        return f"```{contents.language}\n{contents.value}\n```"
    if isinstance(contents, Sequence):
        return "\n\n".join(_markdown(part) for part in contents)
    return ""


def _range(found: lsp.Range | None) -> Range | None:
    if found is None:
        return None
    return Range(
        Position(found.start.line, found.start.character), Position(found.end.line, found.end.character)
    )


_ORIGIN = Range(Position(0, 0), Position(0, 0))


def _locations(found: Sequence[lsp.Location | lsp.LocationLink]) -> list[Location]:
    locations = []
    for item in found[:MAX_LOCATIONS]:
        if isinstance(item, lsp.LocationLink):
            locations.append(Location(item.target_uri, _range(item.target_selection_range) or _ORIGIN))
        else:
            locations.append(Location(item.uri, _range(item.range) or _ORIGIN))
    return locations


def _symbol(found: lsp.SymbolInformation | lsp.WorkspaceSymbol) -> Symbol:
    where = found.location
    found_range = _range(where.range) if isinstance(where, lsp.Location) else None
    return Symbol(
        name=found.name,
        kind=_kind(found.kind),
        location=Location(where.uri, found_range or _ORIGIN),
        container_name=found.container_name or None,
    )


def _kind(kind: lsp.SymbolKind) -> str:
    """ "function", "enum_member", "type_parameter"... (a number the protocol does not name: "unknown")."""
    try:
        name = lsp.SymbolKind(kind).name
    except ValueError:
        return "unknown"
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def _diagnostic(uri: str, found: lsp.Diagnostic) -> Diagnostic:
    message = (
        found.message
        if len(found.message) <= MAX_MESSAGE_CHARS
        else found.message[:MAX_MESSAGE_CHARS] + "..."
    )
    return Diagnostic(
        uri=uri,
        range=_range(found.range) or _ORIGIN,
        severity=_SEVERITIES.get(int(found.severity or 1), "error"),
        message=message,
        code=None if found.code is None else str(found.code),
        source=found.source,
    )
