"""The MCP Tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) for agent_task: a
2026-07-28 client that declares it in a call's capabilities gets a task at once (`resultType:
"task"`) instead of waiting for the run; it polls `tasks/get` (status, the questions of an
`input_required` run, the CallToolResult once completed), answers with `tasks/update` and stops
the run with `tasks/cancel`. The SDK has no server side of the extension yet: these are its wire
messages, served as methods of the low-level server."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field, ValidationError

from .convert import problems
from .runs import KEEP_S, AgentRun, AgentRuns

TASKS = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS = 1000
TASK_ID_CHARS = 100

P = TypeVar("P", bound=types.RequestParams)


def declares_tasks(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the request's client takes a task for a long call."""
    capabilities = ctx.session.client_capabilities
    return (
        ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        and capabilities is not None
        and TASKS in (capabilities.extensions or {})
    )


class TaskParams(types.RequestParams):
    task_id: str = Field(min_length=1, max_length=TASK_ID_CHARS)


class UpdateTaskParams(TaskParams):
    input_responses: types.InputResponses


def created(run: AgentRun) -> dict[str, Any]:
    """The answer to the tools/call that started the run as a task."""
    return {**_task(run), "resultType": "task"}


def add_task_methods(server: Server[Any], runs: AgentRuns) -> None:
    """tasks/get, tasks/update and tasks/cancel, and the extension in the server's capabilities."""

    def run_of(ctx: ServerRequestContext[Any], params: TaskParams) -> AgentRun:
        run = runs.get(params.task_id)
        if run is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"taskId: no task {params.task_id!r} (a task is kept {KEEP_S:.0f} s after the last request about it)",
            )
        return run

    async def get(ctx: ServerRequestContext[Any], _: types.RequestParams) -> dict[str, Any]:
        return _detailed(run_of(ctx, _parsed(TaskParams, ctx)))

    async def update(ctx: ServerRequestContext[Any], _: types.RequestParams) -> dict[str, Any]:
        params = _parsed(UpdateTaskParams, ctx)
        run_of(ctx, params).answer(params.input_responses)
        return {}

    async def cancel(ctx: ServerRequestContext[Any], _: types.RequestParams) -> dict[str, Any]:
        run_of(ctx, _parsed(TaskParams, ctx)).cancel()
        return {}

    # Their params are parsed here rather than by the SDK, whose refusal names no field.
    server.add_request_handler("tasks/get", types.RequestParams, get)
    server.add_request_handler("tasks/update", types.RequestParams, update)
    server.add_request_handler("tasks/cancel", types.RequestParams, cancel)
    server.extensions[TASKS] = {}


def _parsed(model: type[P], ctx: ServerRequestContext[Any]) -> P:
    """The params of a task method of a request that may call it: one at 2026-07-28 declaring the
    extension."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        raise MCPError(types.METHOD_NOT_FOUND, "Method not found", ctx.method)
    if not declares_tasks(ctx):
        raise MCPError(
            MISSING_REQUIRED_CLIENT_CAPABILITY,
            f"{ctx.method} needs the {TASKS} extension in the request's client capabilities",
            {"requiredCapabilities": {"extensions": {TASKS: {}}}},
        )
    try:
        return model.model_validate(ctx.params or {}, by_name=False)
    except ValidationError as exc:
        raise MCPError(types.INVALID_PARAMS, f"{ctx.method}: {problems(exc)}") from None


def _task(run: AgentRun) -> dict[str, Any]:
    return {
        "taskId": run.id,
        "status": run.status,
        "statusMessage": run.note,
        "createdAt": _iso(run.created_at),
        "lastUpdatedAt": _iso(run.updated_at),
        "ttlMs": int((run.updated_at - run.created_at + KEEP_S) * 1000),
        "pollIntervalMs": POLL_INTERVAL_MS,
    }


def _detailed(run: AgentRun) -> dict[str, Any]:
    """A tasks/get answer: the task, with its questions, result or error as its status has them."""
    task = _task(run)
    status = task["status"]
    if status == "input_required":
        requests = run.input_requests()
        task["inputRequests"] = {
            key: request.model_dump(by_alias=True, mode="json", exclude_none=True)
            for key, request in requests.items()
        }
    elif status == "completed":
        result = run.result().model_dump(by_alias=True, mode="json", exclude_none=True)
        task["result"] = {**result, "resultType": "complete"}
    elif status == "failed":
        task["error"] = {"code": INTERNAL_ERROR, "message": f"the run failed: {run.task.exception()}"}
    return task


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
