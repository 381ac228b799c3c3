"""A server span per MCP request (MCP's semantic conventions), under the W3C trace context of its
`_meta`: the SDK's middleware in place of its own, which writes to the process's global tracer
and names spans after what the caller sent. Installed only when tracing is on (base/telemetry.py);
off, neither runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp import types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError

from ...base import telemetry

METHODS = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "logging/setLevel",
        "server/discover",
        "subscriptions/listen",
    }
)
"""MCP's request methods: a span is named after one of these, or `_OTHER` (a name the caller made up)."""


class TracedRequests:
    """The middleware: `offered(name)` says whether a tool is this server's, whose name a
    tools/call span may then carry."""

    def __init__(self, offered: Callable[[str], bool]) -> None:
        self._offered = offered

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.request_id is None:  # a notification: nothing answers it
            return await call_next(ctx)
        method = ctx.method if ctx.method in METHODS else "_OTHER"
        attributes = {"mcp.method.name": method}
        name = method
        if method == "tools/call":
            attributes["gen_ai.operation.name"] = "execute_tool"
            tool = (ctx.params or {}).get("name")
            if isinstance(tool, str) and self._offered(tool):
                attributes["gen_ai.tool.name"] = tool
                name = f"tools/call {tool}"
        carrier = {key: value for key, value in (ctx.meta or {}).items() if isinstance(value, str)}
        with telemetry.span(name, attributes, kind="server", carrier=carrier) as span:
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                telemetry.note({"rpc.response.status_code": str(exc.error.code)})
                raise
            if isinstance(result, types.CallToolResult) and result.is_error and span is not None:
                telemetry.note({"error.type": "tool_error"})
            return result
