"""The RPCs only the later A3S dialect has (a3s-string-dialect.md sections 3 and 4; faces/later_service.py
lists them by group), in the later dialect's messages (code_agent_later_pb2). service.py registers
`later_only_handlers` beside the shared RPCs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

import grpc
from google.protobuf.message import Message as ProtoMessage

from ...app import Application
from ...base.models import Todo
from ...proto import code_agent_later_pb2 as later
from .. import agent_service
from .. import later_service as groups
from .errors import decoding, rpc
from .later_agentic import LaterAgenticService
from .later_cron import LaterCronService
from .later_lsp import LaterLspService
from .later_memory import LaterMemoryService
from .later_planning import LaterPlanningService
from .later_providers import LaterProviderService
from .later_skills import LaterSkillsService

SERVICE = later.DESCRIPTOR.services_by_name["CodeAgentService"]


class LaterOnlyService:
    """The later-only RPCs a3s-agent serves: each a conversion around one application call."""

    def __init__(self, app: Application) -> None:
        self.app = app

    # --- session history and restore (4.1) --------------------------------------------------

    @rpc
    async def GetMessages(self, request: later.GetMessagesRequest, context: Any) -> later.GetMessagesResponse:
        offset = request.offset if request.HasField("offset") else 0
        limit = request.limit if request.HasField("limit") else None
        page = await self.app.history.conversation(
            request.session_id, offset, limit, agent_service.MAX_PAGE_BYTES
        )
        return later.GetMessagesResponse(**groups.messages_reply(page))

    @rpc
    async def RestoreSession(
        self, request: later.RestoreSessionRequest, context: Any
    ) -> later.RestoreSessionResponse:
        return later.RestoreSessionResponse(**await groups.restore_session(self.app, request.session_id))

    # --- todo tracking (4.3) -----------------------------------------------------------------

    @rpc
    async def GetTodos(self, request: later.GetTodosRequest, context: Any) -> later.GetTodosResponse:
        return later.GetTodosResponse(todos=_todos_to_pb(await self.app.todos.get(request.session_id)))

    @rpc
    async def SetTodos(self, request: later.SetTodosRequest, context: Any) -> later.SetTodosResponse:
        todos = [Todo(t.id, t.content, t.status, t.priority) for t in request.todos]
        stored = await self.app.todos.set(request.session_id, todos)
        return later.SetTodosResponse(success=True, todos=_todos_to_pb(stored))

    # --- MCP servers (4.7) -------------------------------------------------------------------

    @rpc
    async def RegisterMcpServer(
        self, request: later.RegisterMcpServerRequest, context: Any
    ) -> later.RegisterMcpServerResponse:
        config, transport = request.config, request.config.transport
        given = groups.McpServerConfig(
            config.name,
            (transport.stdio.command, list(transport.stdio.args)) if transport.HasField("stdio") else None,
            (transport.http.url, dict(transport.http.headers)) if transport.HasField("http") else None,
            dict(config.env),
            config.tool_timeout_secs,
            config.enabled,
        )
        return later.RegisterMcpServerResponse(**await groups.register_mcp_server(self.app, given))

    @rpc
    async def ConnectMcpServer(
        self, request: later.ConnectMcpServerRequest, context: Any
    ) -> later.ConnectMcpServerResponse:
        return later.ConnectMcpServerResponse(**await groups.connect_mcp_server(self.app, request.name))

    @rpc
    async def DisconnectMcpServer(
        self, request: later.DisconnectMcpServerRequest, context: Any
    ) -> later.DisconnectMcpServerResponse:
        return later.DisconnectMcpServerResponse(
            success=await groups.disconnect_mcp_server(self.app, request.name)
        )

    @rpc
    async def ListMcpServers(
        self, request: later.ListMcpServersRequest, context: Any
    ) -> later.ListMcpServersResponse:
        return later.ListMcpServersResponse(**groups.mcp_servers(self.app))

    @rpc
    async def GetMcpTools(self, request: later.GetMcpToolsRequest, context: Any) -> later.GetMcpToolsResponse:
        return later.GetMcpToolsResponse(**groups.mcp_tools(self.app, request.server_name))

    # --- observability (4.10) and queue statistics (4.12) ------------------------------------

    @rpc
    async def GetToolMetrics(
        self, request: later.GetToolMetricsRequest, context: Any
    ) -> later.GetToolMetricsResponse:
        metrics = await self.app.observability.tool_metrics(
            request.session_id or None, request.tool_name or None
        )
        return later.GetToolMetricsResponse(**asdict(metrics))

    @rpc
    async def GetCostSummary(
        self, request: later.GetCostSummaryRequest, context: Any
    ) -> later.GetCostSummaryResponse:
        summary = await self.app.observability.cost_summary(
            request.session_id or None,
            request.model or None,
            request.start_date or None,
            request.end_date or None,
        )
        return later.GetCostSummaryResponse(**asdict(summary))

    @rpc
    async def GetQueueStats(
        self, request: later.GetQueueStatsRequest, context: Any
    ) -> later.GetQueueStatsResponse:
        return later.GetQueueStatsResponse(
            **asdict(await self.app.observability.queue_stats(request.session_id))
        )


# --- conversions ---------------------------------------------------------------------------


def _todos_to_pb(todos: Sequence[Todo]) -> list[later.Todo]:
    return [later.Todo(id=t.id, content=t.content, status=t.status, priority=t.priority) for t in todos]


SERVICES: dict[groups.Group, type[Any]] = {
    groups.HISTORY: LaterOnlyService,
    groups.TODOS: LaterOnlyService,
    groups.MCP: LaterOnlyService,
    groups.OBSERVABILITY: LaterOnlyService,
    groups.LSP: LaterLspService,
    groups.MEMORY: LaterMemoryService,
    groups.CRON: LaterCronService,
    groups.SKILLS: LaterSkillsService,
    groups.PROVIDERS: LaterProviderService,
    groups.PLANNING: LaterPlanningService,
    groups.AGENTIC: LaterAgenticService,
}
"""The class serving each served group (later_service.SERVED): one method per RPC, over `app`."""


def later_only_handlers(app: Application) -> dict[str, grpc.RpcMethodHandler]:
    """Every later-only RPC by method name (requests decoded with the later dialect's classes;
    undecodable bytes are INVALID_ARGUMENT)."""
    services = {kind: kind(app) for kind in set(SERVICES.values())}
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for group in groups.SERVED:
        handlers.update(_handlers(services[SERVICES[group]], group.methods))
    return handlers


def _handlers(service: object, names: Iterable[str]) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers of the RPCs `names`, each the `service` method of its name."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for name in names:
        method = SERVICE.methods_by_name[name]
        request_type = getattr(later, method.input_type.name)
        behavior = decoding(getattr(service, name), request_type, streaming=method.server_streaming)
        kind = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[name] = kind(behavior, response_serializer=_serialize)
    return handlers


def _serialize(message: ProtoMessage) -> bytes:
    return message.SerializeToString()
