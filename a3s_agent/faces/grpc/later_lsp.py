"""The later dialect's LSP group (a3s-string-dialect.md 4.8): each RPC a conversion around one call
of `app.lsp`. Errors are statuses: a language without a server FAILED_PRECONDITION naming what to
install, a bad path or position INVALID_ARGUMENT naming the field, a server that does not answer
UNAVAILABLE."""

from __future__ import annotations

from typing import Any

from ...app import Application
from ...app.lsp import Diagnostic, Location, Range, ServerInfo
from ...proto import code_agent_later_pb2 as later
from .errors import rpc


class LaterLspService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def StartLspServer(
        self, request: later.StartLspServerRequest, context: Any
    ) -> later.StartLspServerResponse:
        info = await self.app.lsp.start(request.language, request.root_uri)
        return later.StartLspServerResponse(
            success=True,
            message=f"{info.name} serves {info.language} for {info.workspace}",
            server_info=_server_to_pb(info),
        )

    @rpc
    async def StopLspServer(
        self, request: later.StopLspServerRequest, context: Any
    ) -> later.StopLspServerResponse:
        return later.StopLspServerResponse(success=await self.app.lsp.stop(request.language))

    @rpc
    async def ListLspServers(
        self, request: later.ListLspServersRequest, context: Any
    ) -> later.ListLspServersResponse:
        return later.ListLspServersResponse(servers=[_server_to_pb(s) for s in self.app.lsp.servers()])

    @rpc
    async def LspHover(self, request: later.LspHoverRequest, context: Any) -> later.LspHoverResponse:
        hover = await self.app.lsp.hover(request.file_path, request.line, request.column)
        if hover is None:
            return later.LspHoverResponse(found=False)
        found_range = _range_to_pb(hover.range) if hover.range is not None else None
        return later.LspHoverResponse(found=True, content=hover.content, range=found_range)

    @rpc
    async def LspDefinition(
        self, request: later.LspDefinitionRequest, context: Any
    ) -> later.LspDefinitionResponse:
        found = await self.app.lsp.definition(request.file_path, request.line, request.column)
        return later.LspDefinitionResponse(locations=[_location_to_pb(f) for f in found])

    @rpc
    async def LspReferences(
        self, request: later.LspReferencesRequest, context: Any
    ) -> later.LspReferencesResponse:
        found = await self.app.lsp.references(
            request.file_path, request.line, request.column, request.include_declaration
        )
        return later.LspReferencesResponse(locations=[_location_to_pb(f) for f in found])

    @rpc
    async def LspSymbols(self, request: later.LspSymbolsRequest, context: Any) -> later.LspSymbolsResponse:
        found = await self.app.lsp.symbols(request.query, request.limit)
        return later.LspSymbolsResponse(
            symbols=[
                later.LspSymbol(
                    name=s.name,
                    kind=s.kind,
                    location=_location_to_pb(s.location),
                    container_name=s.container_name,
                )
                for s in found
            ]
        )

    @rpc
    async def LspDiagnostics(
        self, request: later.LspDiagnosticsRequest, context: Any
    ) -> later.LspDiagnosticsResponse:
        file_path = request.file_path if request.HasField("file_path") else None
        found = await self.app.lsp.diagnostics(file_path)
        return later.LspDiagnosticsResponse(diagnostics=[_diagnostic_to_pb(d) for d in found])


def _server_to_pb(info: ServerInfo) -> later.LspServerInfo:
    return later.LspServerInfo(
        language=info.language, name=info.name, version=info.version, running=info.running
    )


def _range_to_pb(found: Range) -> later.LspRange:
    return later.LspRange(
        start=later.LspPosition(line=found.start.line, character=found.start.character),
        end=later.LspPosition(line=found.end.line, character=found.end.character),
    )


def _location_to_pb(found: Location) -> later.LspLocation:
    return later.LspLocation(uri=found.uri, range=_range_to_pb(found.range))


def _diagnostic_to_pb(found: Diagnostic) -> later.LspDiagnostic:
    return later.LspDiagnostic(
        uri=found.uri,
        range=_range_to_pb(found.range),
        severity=found.severity,
        message=found.message,
        code=found.code,
        source=found.source,
    )
