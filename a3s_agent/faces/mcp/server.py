"""The MCP server (the SDK's low-level Server): tools/list and tools/call over one Application.

A built-in tool runs as ExecuteTool without a session runs it: in the server's workspace, recorded
in no history. A tool the face does not offer is a protocol error (INVALID_PARAMS), as MCP asks
for an unknown tool; a call that fails is a result with isError, which the caller's model reads.
agent_task answers a 2026-07-28 client as it can take it: a task (tasks_extension.py), rounds of
`input_required` (rounds.py), or the result at the end of the call, as for a 2025 client."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import HandlerResult
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError

from ...app import Application
from ...base import telemetry
from ...base.errors import AgentError
from ..status import log_call
from .agent_task import TOOL as AGENT_TASK_TOOL
from .agent_task import run_agent_task
from .convert import error_result, result_of, tool_of
from .rounds import agent_task_in_rounds, can_answer
from .runs import KEEP_S, AgentRuns
from .tasks_extension import add_task_methods, created, declares_tasks
from .tools import AGENT_TASK, Offer
from .tracing import TracedRequests

SERVER_NAME = "a3s-agent"


def build_server(app: Application, offer: Offer, runs: AgentRuns) -> Server[Any]:
    """`runs` keeps the agent_task runs that outlive their call (rounds, tasks)."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [tool_of(tool) for tool in offer.builtins()]
        return types.ListToolsResult(tools=[*tools, *([AGENT_TASK_TOOL] if offer.agent_task else [])])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> HandlerResult:
        started, outcome = time.perf_counter(), "INTERNAL"
        try:
            result = await _call(app, offer, runs, ctx, params)
            outcome = "TOOL_ERROR" if isinstance(result, types.CallToolResult) and result.is_error else "OK"
            return result
        except MCPError:
            outcome = "NOT_FOUND"
            raise
        except asyncio.CancelledError:
            outcome = "CANCELLED"
            raise
        finally:
            log_call(f"MCP tools/call {params.name}", "", started, outcome)

    server: Server[Any] = Server(
        SERVER_NAME,
        version=app.lifecycle.info.version,
        instructions=f"The tools of the a3s coding agent, in its workspace; {AGENT_TASK} runs the agent on a task.",
        on_list_tools=list_tools,
    )
    server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)

    def offered(name: str) -> bool:
        return offer.builtin(name) is not None or (name == AGENT_TASK and offer.agent_task)

    # Each request's span when tracing (tracing.py), else none: not the SDK's, on the global tracer.
    server.middleware = [TracedRequests(offered)] if telemetry.enabled() else []
    server.middleware.append(  # seals the requestState of input_required rounds (rounds.py)
        RequestStateBoundary(RequestStateSecurity.ephemeral(ttl=KEEP_S), default_audience=SERVER_NAME)
    )
    add_task_methods(server, runs)
    return server


async def _call(
    app: Application,
    offer: Offer,
    runs: AgentRuns,
    ctx: ServerRequestContext[Any],
    params: types.CallToolRequestParams,
) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
    name, arguments = params.name, params.arguments or {}
    if name == AGENT_TASK and offer.agent_task:
        return await _agent_task(app, runs, ctx, params)
    if offer.builtin(name) is None:
        raise MCPError(
            types.INVALID_PARAMS, f"unknown tool {name!r}: tools/list names the tools of this server"
        )
    try:
        return result_of(await app.tools.execute("", name, json.dumps(arguments)))
    except AgentError as exc:
        return error_result(exc)


async def _agent_task(
    app: Application, runs: AgentRuns, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
    """As the client can take it: a task, rounds of questions, or the result at the end of the call."""
    if declares_tasks(ctx):
        try:
            return created(runs.start(params.arguments or {}))
        except AgentError as exc:
            return error_result(exc)

    async def report(step: float, message: str) -> None:
        await ctx.session.report_progress(step, None, message)

    if can_answer(ctx):
        return await agent_task_in_rounds(runs, params, report)
    return await run_agent_task(app, params.arguments or {}, report)
