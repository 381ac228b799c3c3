"""agent_task for a 2026-07-28 client that can answer questions (it declared elicitation): when a
tool call of the run waits for confirmation, the call answers `input_required` with the question
(a form: approved, reason) and a requestState naming the run, which goes on waiting; the client's
retry of the same call carries the answers and the state, and follows the run to its next question
or its end. The SDK seals the requestState (RequestStateBoundary): what comes back is what we sent.

A 2025 client (and a 2026 one that cannot answer) keeps the call as it was: the run's confirmations
wait for another face or time out as the session's confirmation policy says."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from mcp import types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ...base.errors import AgentError
from .agent_task import CANCEL_WAIT_S, Report
from .convert import error_result, text_result
from .runs import KEEP_S, AgentRun, AgentRuns


def can_answer(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the request's client takes questions in an `input_required` result."""
    capabilities = ctx.session.client_capabilities
    return (
        ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        and capabilities is not None
        and capabilities.elicitation is not None
    )


async def agent_task_in_rounds(
    runs: AgentRuns, params: types.CallToolRequestParams, report: Report
) -> types.CallToolResult | types.InputRequiredResult:
    if params.request_state is not None:
        run = runs.get(params.request_state)
        if run is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"requestState: its agent_task run is no longer kept (a run is kept {KEEP_S:.0f} s after"
                " the last request about it); call agent_task again without it",
            )
        run.answer(params.input_responses or {})
    else:
        try:
            run = runs.start(params.arguments or {})
        except AgentError as exc:  # too many runs kept
            return error_result(exc)
    await _settle(runs, run, report)
    if not run.task.done():
        return types.InputRequiredResult(input_requests=run.input_requests(), request_state=run.id)
    runs.drop(run.id)
    if run.task.cancelled():
        return text_result("CANCELLED: the run was cancelled", error=True)
    return run.result()


async def _settle(runs: AgentRuns, run: AgentRun, report: Report) -> None:
    """The run's next question or end; a request that goes away stops the run, as a cancelled
    agent_task call always did (its tools killed and its end written before the call ends)."""
    try:
        await run.settle(report)
    except BaseException:
        runs.drop(run.id)
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT_S):
            await asyncio.wait({run.task})
        raise
