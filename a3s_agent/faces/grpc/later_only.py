"""The RPCs only the later A3S dialect has (a3s-string-dialect.md sections 3 and 4): those a3s-agent
serves, in the later dialect's messages (code_agent_later_pb2), and a refusal naming the group for
every other one. service.py registers `later_only_handlers` beside the shared RPCs."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import asdict
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message as ProtoMessage

from ...app import Application
from ...app.history import HistoryPage
from ...app.mcp_servers import McpToolInfo
from ...base.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ...base.models import Attachment, Todo
from ...proto import code_agent_later_pb2 as later
from ..agent_service import MAX_REQUEST_MESSAGE_SIZE
from ..status import log_call
from . import later_cron, later_lsp, later_memory, later_planning, later_providers, later_skills
from .errors import decoding, rpc
from .later_cron import LaterCronService
from .later_lsp import LaterLspService
from .later_memory import LaterMemoryService
from .later_planning import LaterPlanningService
from .later_providers import LaterProviderService
from .later_skills import LaterSkillsService

SERVICE = later.DESCRIPTOR.services_by_name["CodeAgentService"]
SERVED = (
    "GetMessages", "RestoreSession", "GetTodos", "SetTodos", "RegisterMcpServer", "ConnectMcpServer",
    "DisconnectMcpServer", "ListMcpServers", "GetMcpTools", "GetToolMetrics", "GetCostSummary",
    "GetQueueStats",
)  # fmt: skip

ALL_SERVED = (
    *SERVED, *later_lsp.METHODS, *later_memory.METHODS, *later_cron.METHODS, *later_skills.METHODS,
    *later_providers.METHODS, *later_planning.METHODS,
)  # fmt: skip
"""Every later-only RPC served: SERVED here and the groups in modules of their own."""

MAX_PAGE_BYTES = MAX_REQUEST_MESSAGE_SIZE
"""The most one GetMessages reply carries (bytes of its messages), the bound a request's messages
have, below gRPC's 64 MiB: a page that would hold more ends early with `has_more` set, and the
client asks again from offset + len(messages). A single message over it has its texts cut."""

_IN_BAND = (InvalidArgument, FailedPrecondition, NotFound, ResourceExhausted, Unavailable)
"""What the MCP group answers with success=false and the reason, as A3S does, not a status."""


class LaterOnlyService:
    """The later-only RPCs a3s-agent serves: each a conversion around one application call."""

    def __init__(self, app: Application) -> None:
        self.app = app

    # --- session history and restore (4.1) --------------------------------------------------

    @rpc
    async def GetMessages(self, request: later.GetMessagesRequest, context: Any) -> later.GetMessagesResponse:
        offset = request.offset if request.HasField("offset") else 0
        limit = request.limit if request.HasField("limit") else None
        page = await self.app.history.page(request.session_id, offset, limit)
        messages = _fitting((_message_to_pb(page, i) for i in range(len(page.messages))), MAX_PAGE_BYTES)
        cut_short = len(messages) < len(page.messages)
        return later.GetMessagesResponse(
            messages=messages,
            total_count=page.total,
            has_more=cut_short or (limit is not None and offset + limit < page.total),
        )

    @rpc
    async def RestoreSession(
        self, request: later.RestoreSessionRequest, context: Any
    ) -> later.RestoreSessionResponse:
        if not request.session_id:
            raise InvalidArgument("session_id is required")
        try:
            count = await self.app.history.restore(request.session_id)
        except NotFound as exc:
            return later.RestoreSessionResponse(
                success=False, session_id=request.session_id, message=str(exc)
            )
        return later.RestoreSessionResponse(
            success=True,
            session_id=request.session_id,
            message=f"session {request.session_id} restored with {count} messages",
        )

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
        config = request.config
        if not config.transport.WhichOneof("transport"):
            raise InvalidArgument("config.transport is required: stdio (a command) or http (a url)")
        try:
            names = await self.app.mcp_servers.register(config.name, _server_entry(config), config.enabled)
        except _IN_BAND as exc:
            return later.RegisterMcpServerResponse(success=False, message=str(exc))
        done = f"connected, {len(names)} tools" if config.enabled else "not connected (enabled is false)"
        return later.RegisterMcpServerResponse(
            success=True, message=f"registered MCP server {config.name}: {done}"
        )

    @rpc
    async def ConnectMcpServer(
        self, request: later.ConnectMcpServerRequest, context: Any
    ) -> later.ConnectMcpServerResponse:
        try:
            names = await self.app.mcp_servers.connect(request.name)
        except _IN_BAND as exc:
            return later.ConnectMcpServerResponse(success=False, message=str(exc))
        return later.ConnectMcpServerResponse(
            success=True, message=f"connected to MCP server {request.name}", tool_names=names
        )

    @rpc
    async def DisconnectMcpServer(
        self, request: later.DisconnectMcpServerRequest, context: Any
    ) -> later.DisconnectMcpServerResponse:
        try:
            await self.app.mcp_servers.disconnect(request.name)
        except _IN_BAND:
            return later.DisconnectMcpServerResponse(success=False)
        return later.DisconnectMcpServerResponse(success=True)

    @rpc
    async def ListMcpServers(
        self, request: later.ListMcpServersRequest, context: Any
    ) -> later.ListMcpServersResponse:
        return later.ListMcpServersResponse(
            servers=[
                later.McpServerInfo(
                    name=s.name,
                    connected=s.connected,
                    enabled=s.enabled,
                    tool_count=s.tool_count,
                    error=s.error or None,
                )
                for s in self.app.mcp_servers.servers()
            ]
        )

    @rpc
    async def GetMcpTools(self, request: later.GetMcpToolsRequest, context: Any) -> later.GetMcpToolsResponse:
        server = request.server_name if request.HasField("server_name") and request.server_name else None
        return later.GetMcpToolsResponse(tools=[_tool_to_pb(t) for t in self.app.mcp_servers.tools(server)])

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


# --- GetMessages' conversion -----------------------------------------------------------------


def _message_to_pb(page: HistoryPage, position: int) -> later.ConversationMessage:
    """Our message as A3S's: a tool's result is a user message with a tool_result block, an
    assistant's calls are tool_use blocks after its text; attachments are named in a text block."""
    message = page.messages[position]
    blocks: list[later.ContentBlock] = []
    if message.role == "tool":
        failed = message.metadata.get("success") == "false"
        result = later.ToolResultContent(
            tool_use_id=message.tool_call_id, content=message.content, is_error=failed
        )
        blocks.append(later.ContentBlock(tool_result=result))
    elif message.content:
        blocks.append(_text(message.content))
    blocks += [
        later.ContentBlock(tool_use=later.ToolUseContent(id=c.id, name=c.name, arguments=c.arguments))
        for c in message.tool_calls
    ]
    blocks += [_text(_attachment_note(attachment)) for attachment in message.attachments]
    return later.ConversationMessage(
        id=f"msg_{page.offset + position}",
        role="user" if message.role == "tool" else message.role,
        content=blocks or [_text("")],
        timestamp=page.updated_at,
    )


def _text(text: str) -> later.ContentBlock:
    return later.ContentBlock(text=later.TextContent(text=text))


def _attachment_note(attachment: Attachment) -> str:
    what = attachment.name or attachment.url or attachment.mime_type
    return f"[{attachment.kind} attachment: {what}, {len(attachment.content)} bytes]"


def _fitting(messages: Iterable[later.ConversationMessage], budget: int) -> list[later.ConversationMessage]:
    """The first messages whose encoded size fits `budget`, at least one (its texts cut to fit);
    converted as they are taken, so a long history past the bound is never converted."""
    kept: list[later.ConversationMessage] = []
    used = 0
    for message in messages:
        size = message.ByteSize() + 8  # the field's tag and length
        if used + size > budget:
            if not kept:
                kept.append(_cut(message, budget))
            break
        kept.append(message)
        used += size
    return kept


_TEXT_FIELDS = {"text": "text", "tool_use": "arguments", "tool_result": "content"}
"""The field of each kind of ContentBlock that holds its (possibly long) text."""


def _cut(message: later.ConversationMessage, budget: int) -> later.ConversationMessage:
    """`message` with each block's text cut to its share of `budget` (UTF-8 bytes), marked."""
    share = max(budget // (2 * len(message.content)), 1)
    for block in message.content:
        kind = block.WhichOneof("block") or "text"
        inner, field = getattr(block, kind), _TEXT_FIELDS[kind]
        text: str = getattr(inner, field)
        if len(text.encode()) > share:
            kept = text.encode()[:share].decode(errors="ignore")
            cut = len(text) - len(kept)
            setattr(inner, field, f"{kept}\n[{cut} characters cut: more than one reply carries]")
    return message


# --- other conversions -----------------------------------------------------------------------


def _todos_to_pb(todos: Sequence[Todo]) -> list[later.Todo]:
    return [later.Todo(id=t.id, content=t.content, status=t.status, priority=t.priority) for t in todos]


def _server_entry(config: later.McpServerConfigProto) -> dict[str, Any]:
    """A registered server in the mcpServers shape tools/mcp/config.py checks."""
    entry: dict[str, Any] = {}
    if config.transport.HasField("stdio"):
        entry.update(command=config.transport.stdio.command, args=list(config.transport.stdio.args))
        if config.env:
            entry["env"] = dict(config.env)
    else:
        if config.env:
            raise InvalidArgument(f"{config.name}: env is for stdio servers; an http server takes headers")
        entry.update(url=config.transport.http.url, headers=dict(config.transport.http.headers))
    if config.tool_timeout_secs:
        entry["timeout_ms"] = config.tool_timeout_secs * 1000
    return entry


def _tool_to_pb(tool: McpToolInfo) -> later.McpToolInfo:
    return later.McpToolInfo(
        full_name=tool.full_name,
        server_name=tool.server_name,
        tool_name=tool.tool_name,
        description=tool.description,
        input_schema=json.dumps(tool.input_schema),
    )


# --- the groups a3s-agent does not serve -----------------------------------------------------

NOT_SERVED: dict[str, tuple[str, ...]] = {
    "server-side agentic loop and delegation": (
        "AgenticGenerate", "StreamAgenticGenerate", "Delegate", "StreamDelegate",
    ),
}  # fmt: skip
"""A3S's later-only RPC groups a3s-agent answers UNIMPLEMENTED, by group (spec section 3)."""

_STREAMING = frozenset({"StreamAgenticGenerate", "StreamDelegate"})


def refusal(method: str) -> str:
    """Why `method` (one of NOT_SERVED's) answers UNIMPLEMENTED."""
    group, members = next((g, m) for g, m in NOT_SERVED.items() if method in m)
    return f"{method}: A3S's {group} group ({', '.join(members)}) is not served by a3s-agent"


def _refusing(method: str) -> grpc.RpcMethodHandler:
    """UNIMPLEMENTED naming the group; the request's bytes are not read."""
    message = refusal(method)

    async def refuse(raw: bytes, context: grpc.aio.ServicerContext) -> NoReturn:
        log_call(method, "", time.perf_counter(), grpc.StatusCode.UNIMPLEMENTED.name)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)
        raise AssertionError("unreachable: abort raises")

    async def refuse_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await refuse(raw, context)
        yield b""  # pragma: no cover - makes this an async generator

    if method in _STREAMING:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    return grpc.unary_unary_rpc_method_handler(refuse)


def later_only_handlers(app: Application) -> dict[str, grpc.RpcMethodHandler]:
    """Every later-only RPC by method name: the served ones (requests decoded with the later
    dialect's classes; undecodable bytes are INVALID_ARGUMENT) and the refused ones."""
    handlers = _unary_handlers(LaterOnlyService(app), SERVED)
    handlers.update(_unary_handlers(LaterLspService(app), later_lsp.METHODS))
    handlers.update(_unary_handlers(LaterMemoryService(app), later_memory.METHODS))
    handlers.update(_unary_handlers(LaterCronService(app), later_cron.METHODS))
    handlers.update(_unary_handlers(LaterSkillsService(app), later_skills.METHODS))
    handlers.update(_unary_handlers(LaterProviderService(app), later_providers.METHODS))
    handlers.update(_unary_handlers(LaterPlanningService(app), later_planning.METHODS))
    for members in NOT_SERVED.values():
        handlers.update({name: _refusing(name) for name in members})
    return handlers


def _unary_handlers(service: object, names: Iterable[str]) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers of the RPCs `names`, each the `service` method of its name."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for name in names:
        request_type = getattr(later, SERVICE.methods_by_name[name].input_type.name)
        behavior = decoding(getattr(service, name), request_type, streaming=False)
        handlers[name] = grpc.unary_unary_rpc_method_handler(behavior, response_serializer=_serialize)
    return handlers


def _serialize(message: ProtoMessage) -> bytes:
    return message.SerializeToString()
