"""The later dialect's session history, todo, MCP server and observability RPCs over HTTP, as
faces/grpc/later_only.py serves them over gRPC (what both compute alike is in app/history.py and
faces/later_service.py)."""

from __future__ import annotations

from dataclasses import asdict

from ...app import Application
from ...base.models import Todo
from .. import agent_service
from .. import later_service as groups
from .convert import Given, Plain
from .rpc_table import Handlers

HANDLERS = Handlers()

# --- session history and restore (4.1) ------------------------------------------------------


@HANDLERS.rpc("GetMessages")
async def _get_messages(app: Application, request: Given) -> Plain:
    page = await app.history.conversation(
        request["session_id"], request["offset"] or 0, request["limit"], agent_service.MAX_PAGE_BYTES
    )
    return groups.messages_reply(page)


@HANDLERS.rpc("RestoreSession")
async def _restore_session(app: Application, request: Given) -> Plain:
    return await groups.restore_session(app, request["session_id"])


# --- todo tracking (4.3) ---------------------------------------------------------------------


@HANDLERS.rpc("GetTodos")
async def _get_todos(app: Application, request: Given) -> Plain:
    return {"todos": [asdict(t) for t in await app.todos.get(request["session_id"])]}


@HANDLERS.rpc("SetTodos")
async def _set_todos(app: Application, request: Given) -> Plain:
    todos = [Todo(t["id"], t["content"], t["status"], t["priority"]) for t in request["todos"]]
    stored = await app.todos.set(request["session_id"], todos)
    return {"success": True, "todos": [asdict(t) for t in stored]}


# --- MCP servers (4.7) -----------------------------------------------------------------------


@HANDLERS.rpc("RegisterMcpServer")
async def _register_mcp_server(app: Application, request: Given) -> Plain:
    config = request["config"] or {}
    transport = config.get("transport") or {}
    stdio, http = transport.get("stdio"), transport.get("http")
    given = groups.McpServerConfig(
        config.get("name", ""),
        (stdio["command"], list(stdio["args"])) if stdio is not None else None,
        (http["url"], dict(http["headers"])) if http is not None else None,
        dict(config.get("env", {})),
        config.get("tool_timeout_secs", 0),
        config.get("enabled", False),
    )
    return await groups.register_mcp_server(app, given)


@HANDLERS.rpc("ConnectMcpServer")
async def _connect_mcp_server(app: Application, request: Given) -> Plain:
    return await groups.connect_mcp_server(app, request["name"])


@HANDLERS.rpc("DisconnectMcpServer")
async def _disconnect_mcp_server(app: Application, request: Given) -> Plain:
    return {"success": await groups.disconnect_mcp_server(app, request["name"])}


@HANDLERS.rpc("ListMcpServers")
async def _list_mcp_servers(app: Application, request: Given) -> Plain:
    return groups.mcp_servers(app)


@HANDLERS.rpc("GetMcpTools")
async def _get_mcp_tools(app: Application, request: Given) -> Plain:
    return groups.mcp_tools(app, request["server_name"])


# --- observability (4.10) and queue statistics (4.12) -----------------------------------------


@HANDLERS.rpc("GetToolMetrics")
async def _get_tool_metrics(app: Application, request: Given) -> Plain:
    metrics = await app.observability.tool_metrics(
        request["session_id"] or None, request["tool_name"] or None
    )
    return asdict(metrics)


@HANDLERS.rpc("GetCostSummary")
async def _get_cost_summary(app: Application, request: Given) -> Plain:
    summary = await app.observability.cost_summary(
        request["session_id"] or None,
        request["model"] or None,
        request["start_date"] or None,
        request["end_date"] or None,
    )
    return asdict(summary)


@HANDLERS.rpc("GetQueueStats")
async def _get_queue_stats(app: Application, request: Given) -> Plain:
    return asdict(await app.observability.queue_stats(request["session_id"]))
