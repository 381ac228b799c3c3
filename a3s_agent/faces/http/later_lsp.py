"""The later dialect's LSP group over HTTP, as faces/grpc/later_lsp.py serves it over gRPC: the
language-server types of app/lsp.py have the proto's field names, so a reply is their fields."""

from __future__ import annotations

from dataclasses import asdict

from ...app import Application
from .convert import Given, Plain
from .rpc_table import Handlers

HANDLERS = Handlers()


@HANDLERS.rpc("StartLspServer")
async def _start(app: Application, request: Given) -> Plain:
    info = await app.lsp.start(request["language"], request["root_uri"])
    return {
        "success": True,
        "message": f"{info.name} serves {info.language} for {info.workspace}",
        "server_info": asdict(info),
    }


@HANDLERS.rpc("StopLspServer")
async def _stop(app: Application, request: Given) -> Plain:
    return {"success": await app.lsp.stop(request["language"])}


@HANDLERS.rpc("ListLspServers")
async def _list(app: Application, request: Given) -> Plain:
    return {"servers": [asdict(s) for s in app.lsp.servers()]}


@HANDLERS.rpc("LspHover")
async def _hover(app: Application, request: Given) -> Plain:
    hover = await app.lsp.hover(request["file_path"], request["line"], request["column"])
    return {"found": False} if hover is None else {"found": True, **asdict(hover)}


@HANDLERS.rpc("LspDefinition")
async def _definition(app: Application, request: Given) -> Plain:
    found = await app.lsp.definition(request["file_path"], request["line"], request["column"])
    return {"locations": [asdict(f) for f in found]}


@HANDLERS.rpc("LspReferences")
async def _references(app: Application, request: Given) -> Plain:
    found = await app.lsp.references(
        request["file_path"], request["line"], request["column"], request["include_declaration"]
    )
    return {"locations": [asdict(f) for f in found]}


@HANDLERS.rpc("LspSymbols")
async def _symbols(app: Application, request: Given) -> Plain:
    return {"symbols": [asdict(s) for s in await app.lsp.symbols(request["query"], request["limit"])]}


@HANDLERS.rpc("LspDiagnostics")
async def _diagnostics(app: Application, request: Given) -> Plain:
    return {"diagnostics": [asdict(d) for d in await app.lsp.diagnostics(request["file_path"])]}
