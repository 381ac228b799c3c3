"""The MCP server (the SDK's low-level Server): tools/list and tools/call over one Application.

A built-in tool runs as ExecuteTool without a session runs it: in the server's workspace, recorded
in no history. A tool the face does not offer is a protocol error (INVALID_PARAMS), as MCP asks
for an unknown tool; a call that fails is a result with isError, which the caller's model reads."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from ...app import Application
from ...base import telemetry
from ...base.errors import AgentError
from ..status import log_call
from .agent_task import TOOL as AGENT_TASK_TOOL
from .agent_task import run_agent_task
from .convert import error_result, result_of, tool_of
from .tools import AGENT_TASK, Offer
from .tracing import TracedRequests

SERVER_NAME = "a3s-agent"


def build_server(app: Application, offer: Offer) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [tool_of(tool) for tool in offer.builtins()]
        return types.ListToolsResult(tools=[*tools, *([AGENT_TASK_TOOL] if offer.agent_task else [])])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        started, outcome = time.perf_counter(), "INTERNAL"
        try:
            result = await _call(app, offer, ctx, params.name, params.arguments or {})
            outcome = "TOOL_ERROR" if result.is_error else "OK"
            return result
        except MCPError:
            outcome = "NOT_FOUND"
            raise
        except asyncio.CancelledError:
            outcome = "CANCELLED"
            raise
        finally:
            log_call(f"MCP tools/call {params.name}", "", started, outcome)

    server = Server(
        SERVER_NAME,
        version=app.lifecycle.info.version,
        instructions=f"The tools of the a3s coding agent, in its workspace; {AGENT_TASK} runs the agent on a task.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )

    def offered(name: str) -> bool:
        return offer.builtin(name) is not None or (name == AGENT_TASK and offer.agent_task)

    # Each request's span when tracing (tracing.py), else none: not the SDK's, on the global tracer.
    server.middleware = [TracedRequests(offered)] if telemetry.enabled() else []
    return server


async def _call(
    app: Application, offer: Offer, ctx: ServerRequestContext[Any], name: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    if name == AGENT_TASK and offer.agent_task:
        return await run_agent_task(
            app, arguments, lambda step, message: ctx.session.report_progress(step, None, message)
        )
    if offer.builtin(name) is None:
        raise MCPError(
            types.INVALID_PARAMS, f"unknown tool {name!r}: tools/list names the tools of this server"
        )
    try:
        return result_of(await app.tools.execute("", name, json.dumps(arguments)))
    except AgentError as exc:
        return error_result(exc)
