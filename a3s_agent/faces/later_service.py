"""What the later A3S dialect's own RPCs (a3s-string-dialect.md sections 3 and 4) say the same way
over gRPC (faces/grpc/later_only.py) and HTTP (faces/http/later.py): the groups, every one of
which each face serves and GetCapabilities.features names; and what both faces compute alike
from the application's answers (the texts of the replies, the wire's enum values as the domain's). No protobuf here: the HTTP face may not import it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from ..app import Application
from ..app.agentic import Failed, Finished, Item, PlanMade, Progress, Reflected, Step, StepFinished, Told
from ..app.cron import CronExecution, CronJob, ExecutionStatus, JobType
from ..app.history import Conversation, TextBlock, ToolResultBlock, ToolUseBlock
from ..app.types import Event, EventType, NoticeEvent, TextEvent, ToolCallEvent, ToolOutput, ToolResultEvent
from ..base.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ..base.memories import Memory, MemoryType
from ..base.models import DEFAULT_PROVIDER, ToolCall, Usage
from ..base.planning import Goal, Plan
from ..base.providers import DefaultModel, ModelSpec, ProviderList, ProviderView


@dataclass(frozen=True)
class Group:
    """A group of later-only RPCs, as spec section 3 groups them."""

    name: str
    """As a refusal names it: "A3S's <name> group"."""
    methods: tuple[str, ...]
    feature: str = ""
    """What GetCapabilities.features lists while the group is served; "" for none."""


HISTORY = Group("session history", ("GetMessages", "RestoreSession"))
TODOS = Group("todo tracking", ("GetTodos", "SetTodos"))
MCP = Group(
    "MCP servers",
    ("RegisterMcpServer", "ConnectMcpServer", "DisconnectMcpServer", "ListMcpServers", "GetMcpTools"),
)
OBSERVABILITY = Group("observability", ("GetToolMetrics", "GetCostSummary", "GetQueueStats"))
LSP = Group(
    "LSP",
    (
        "StartLspServer", "StopLspServer", "ListLspServers", "LspHover", "LspDefinition", "LspReferences",
        "LspSymbols", "LspDiagnostics",
    ),
    "lsp",
)  # fmt: skip
MEMORY = Group(
    "memory",
    (
        "StoreMemory", "RetrieveMemory", "SearchMemories", "GetMemoryStats", "ClearMemories",
        "DeleteMemory", "SummarizeMemories",
    ),
    "memory",
)  # fmt: skip
CRON = Group(
    "scheduled jobs",
    (
        "ListCronJobs", "CreateCronJob", "GetCronJob", "UpdateCronJob", "PauseCronJob", "ResumeCronJob",
        "DeleteCronJob", "GetCronHistory", "RunCronJob", "ParseCronSchedule",
    ),
    "cron",
)  # fmt: skip
"""Served always; its feature is listed only while the operator has enabled scheduling."""
SKILLS = Group(
    "skills additions",
    ("GetClaudeCodeSkills", "GetSkill", "SearchSkills", "InstallSkill", "LoadSkillsFromDir"),
    "skill_sources",
)
PROVIDERS = Group(
    "provider configuration",
    (
        "ListProviders", "GetProvider", "AddProvider", "UpdateProvider", "RemoveProvider",
        "SetDefaultModel", "GetDefaultModel",
    ),
    "providers",
)  # fmt: skip
PLANNING = Group(
    "planning and goal tracking", ("CreatePlan", "GetPlan", "ExtractGoal", "CheckGoalAchievement"), "planning"
)
AGENTIC = Group(
    "server-side agentic loop and delegation",
    ("AgenticGenerate", "StreamAgenticGenerate", "Delegate", "StreamDelegate"),
    "agentic",
)

SERVED = (HISTORY, TODOS, MCP, OBSERVABILITY, LSP, MEMORY, CRON, SKILLS, PROVIDERS, PLANNING, AGENTIC)
"""Every group of the later dialect's own RPCs: both faces serve each of their RPCs
(tests/test_http_later.py)."""
SERVED_METHODS = tuple(name for group in SERVED for name in group.methods)


def served_features(cron: bool) -> list[str]:
    """The features of the served groups (CRON's only while scheduling is enabled)."""
    return [group.feature for group in SERVED if group.feature and (cron or group is not CRON)]


# --- session history -------------------------------------------------------------------------


def messages_reply(page: Conversation) -> dict[str, Any]:
    """GetMessagesResponse's fields."""
    return {
        "messages": [
            {**asdict(m), "content": [{_BLOCKS[type(b)]: asdict(b)} for b in m.content]}
            for m in page.messages
        ],
        "total_count": page.total,
        "has_more": page.has_more,
    }


_BLOCKS = {TextBlock: "text", ToolUseBlock: "tool_use", ToolResultBlock: "tool_result"}
"""ContentBlock's field of each kind of block."""


async def restore_session(app: Application, session_id: str) -> dict[str, Any]:
    """RestoreSessionResponse's fields: a session that cannot be restored is `success` false and
    why, as A3S answers; an empty id is InvalidArgument."""
    if not session_id:
        raise InvalidArgument("session_id is required")
    try:
        count = await app.history.restore(session_id)
    except NotFound as exc:
        return {"success": False, "session_id": session_id, "message": str(exc)}
    message = f"session {session_id} restored with {count} messages"
    return {"success": True, "session_id": session_id, "message": message}


# --- MCP servers -----------------------------------------------------------------------------

_IN_BAND = (InvalidArgument, FailedPrecondition, NotFound, ResourceExhausted, Unavailable)
"""What the MCP group answers with success=false and the reason, as A3S does, not a status."""


@dataclass(frozen=True)
class McpServerConfig:
    """McpServerConfigProto: a stdio server's (command, args), or an http one's (url, headers)."""

    name: str
    stdio: tuple[str, list[str]] | None
    http: tuple[str, dict[str, str]] | None
    env: dict[str, str]
    tool_timeout_secs: int
    enabled: bool


async def register_mcp_server(app: Application, config: McpServerConfig) -> dict[str, Any]:
    """RegisterMcpServerResponse's fields; a config without a transport is InvalidArgument."""
    if config.stdio is None and config.http is None:
        raise InvalidArgument("config.transport is required: stdio (a command) or http (a url)")
    try:
        names = await app.mcp_servers.register(config.name, _mcp_entry(config), config.enabled)
    except _IN_BAND as exc:
        return {"success": False, "message": str(exc)}
    done = f"connected, {len(names)} tools" if config.enabled else "not connected (enabled is false)"
    return {"success": True, "message": f"registered MCP server {config.name}: {done}"}


def _mcp_entry(config: McpServerConfig) -> dict[str, Any]:
    """A registered server in the mcpServers shape tools/mcp/config.py checks."""
    entry: dict[str, Any] = {}
    if config.stdio is not None:
        entry.update(command=config.stdio[0], args=config.stdio[1])
        if config.env:
            entry["env"] = config.env
    elif config.http is not None:
        if config.env:
            raise InvalidArgument(f"{config.name}: env is for stdio servers; an http server takes headers")
        entry.update(url=config.http[0], headers=config.http[1])
    if config.tool_timeout_secs:
        entry["timeout_ms"] = config.tool_timeout_secs * 1000
    return entry


def mcp_servers(app: Application) -> dict[str, Any]:
    """ListMcpServersResponse's fields."""
    return {"servers": [{**asdict(s), "error": s.error or None} for s in app.mcp_servers.servers()]}


def mcp_tools(app: Application, server_name: str | None) -> dict[str, Any]:
    """GetMcpToolsResponse's fields: every server's tools, or `server_name`'s."""
    tools = app.mcp_servers.tools(server_name or None)
    return {"tools": [{**asdict(t), "input_schema": json.dumps(t.input_schema)} for t in tools]}


async def connect_mcp_server(app: Application, name: str) -> dict[str, Any]:
    """ConnectMcpServerResponse's fields."""
    try:
        names = await app.mcp_servers.connect(name)
    except _IN_BAND as exc:
        return {"success": False, "message": str(exc)}
    return {"success": True, "message": f"connected to MCP server {name}", "tool_names": names}


async def disconnect_mcp_server(app: Application, name: str) -> bool:
    """DisconnectMcpServerResponse's success."""
    try:
        await app.mcp_servers.disconnect(name)
    except _IN_BAND:
        return False
    return True


# --- memory and scheduled jobs: what the wire's messages hold -----------------------------------
# A message's fields as a dict by proto field name (an enum by its value's name or number, None for
# an absent optional field): protobuf's constructors take it as it is, codec.encode too.


def memory_type(number: int) -> MemoryType:
    """The wire's MemoryType (unknown, 0, is episodic, as A3S's default); InvalidArgument otherwise."""
    if number == 0:
        return MemoryType.EPISODIC
    try:
        return MemoryType(number)  # the same numbers, 1-4
    except ValueError:
        raise InvalidArgument(f"memory.memory_type {number} is not a MemoryType (1-4)") from None


def memory_item(memory: Memory) -> dict[str, Any]:
    """MemoryItem's fields."""
    return {
        "id": memory.id,
        "content": memory.content,
        "timestamp": memory.created_at,
        "importance": memory.importance,
        "tags": memory.tags,
        "memory_type": int(memory.memory_type),
        "metadata": memory.metadata,
        "access_count": memory.access_count,
        "last_accessed": memory.last_accessed,
    }


_JOB_TYPE_NAMES = {JobType.SHELL: "CRON_JOB_TYPE_SHELL", JobType.AGENT: "CRON_JOB_TYPE_AGENT"}


def job_type(number: int) -> JobType:
    """CreateCronJobRequest's job_type: CRON_JOB_TYPE_SHELL (0) or CRON_JOB_TYPE_AGENT (1)."""
    if number not in (0, 1):
        raise InvalidArgument(
            f"job_type {number} is neither CRON_JOB_TYPE_SHELL (0) nor CRON_JOB_TYPE_AGENT (1)"
        )
    return JobType.AGENT if number else JobType.SHELL


def cron_job(job: CronJob) -> dict[str, Any]:
    """CronJob's fields; an agent job's config never with its key."""
    spec, agent = job.spec, job.spec.agent
    state = "RUNNING" if job.running else "PAUSED" if job.paused else "ACTIVE"
    return {
        "id": job.id,
        "name": job.name,
        "schedule": spec.schedule,
        "command": spec.command,
        "status": f"CRON_JOB_STATUS_{state}",
        "timeout_ms": spec.timeout_ms,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "last_run": job.last_run,
        "next_run": job.next_run,
        "run_count": job.run_count,
        "fail_count": job.fail_count,
        "working_dir": spec.working_dir,
        "job_type": _JOB_TYPE_NAMES[spec.job_type],
        "agent_config": None
        if agent is None
        else {
            "model": agent.model,
            "workspace": agent.workspace or None,
            "system_prompt": agent.system_prompt or None,
            "base_url": agent.base_url or None,
        },
    }


def cron_execution(execution: CronExecution) -> dict[str, Any]:
    """CronExecution's fields: the proto has no running status, so that is unknown."""
    status = "UNKNOWN" if execution.status is ExecutionStatus.RUNNING else execution.status.name
    return {
        "id": execution.id,
        "job_id": execution.job_id,
        "status": f"CRON_EXECUTION_STATUS_{status}",
        "started_at": execution.started_at,
        "ended_at": execution.ended_at,
        "duration_ms": execution.duration_ms,
        "exit_code": execution.exit_code,
        "stdout": execution.stdout,
        "stderr": execution.stderr,
        "error": execution.error or None,
    }


# --- provider configuration ------------------------------------------------------------------


def provider_info(view: ProviderView) -> dict[str, Any]:
    """ProviderInfo's fields: never a key, only the `${env:...}`/`${file:...}` reference it was
    given as (else no api_key)."""
    return {
        "name": view.name,
        "api_key": view.key_reference or None,
        "base_url": view.base_url or None,
        "models": [_model_info(model) for model in view.models],
    }


def _model_info(model: ModelSpec) -> dict[str, Any]:
    return {
        "id": model.id,
        "name": model.name,
        "family": model.family,
        "attachment": model.attachment,
        "reasoning": model.reasoning,
        "tool_call": model.tool_call,
        "temperature": model.temperature,
        "release_date": model.release_date or None,
        "modalities": {"input": model.input_modalities, "output": model.output_modalities},
        "cost": {
            "input": model.cost_input,
            "output": model.cost_output,
            "cache_read": model.cost_cache_read,
            "cache_write": model.cost_cache_write,
        },
        "limit": {"context": model.context_limit, "output": model.output_limit},
    }


def default_model(default: DefaultModel) -> dict[str, str | None]:
    """GetDefaultModelResponse's fields (unset when there is no default model)."""
    if not default.model:
        return {"provider": None, "model": None}
    return {"provider": default.provider or DEFAULT_PROVIDER, "model": default.model}


def provider_list(listed: ProviderList) -> dict[str, Any]:
    """ListProvidersResponse's fields."""
    default = default_model(listed.default)
    return {
        "providers": [provider_info(view) for view in listed.providers],
        "default_provider": default["provider"],
        "default_model": default["model"],
    }


def refuse_model_endpoint(where: str, api_key: str | None, base_url: str | None) -> None:
    """A ModelInfo of a provider entry may not name an endpoint or key of its own."""
    for name, value in (("api_key", api_key), ("base_url", base_url)):
        if value:
            raise InvalidArgument(
                f"{where}.{name}: a model of its own endpoint or key is not supported; give the"
                f" provider's {name}, or add a provider for that endpoint"
            )


# --- planning and goal tracking ------------------------------------------------------------------


def execution_plan(plan: Plan) -> dict[str, Any]:
    """ExecutionPlan's fields."""
    return {
        "goal": plan.goal,
        "steps": [
            {
                "id": step.id,
                "description": step.description,
                "tool": step.tool,
                "dependencies": step.dependencies,
                "status": f"STEP_STATUS_{step.status.name}",
                "success_criteria": step.success_criteria,
            }
            for step in plan.steps
        ],
        "complexity": f"COMPLEXITY_{plan.complexity.name}",
        "required_tools": plan.required_tools,
        "estimated_steps": plan.estimated_steps,
    }


def agent_goal(goal: Goal) -> dict[str, Any]:
    """AgentGoal's fields."""
    return {
        "description": goal.description,
        "success_criteria": goal.success_criteria,
        "progress": goal.progress,
        "achieved": goal.achieved,
        "created_at": goal.created_at,
    }


# --- server-side agentic loop and delegation ---------------------------------------------------


PLANNED = 2
"""AgenticStrategy's AGENTIC_STRATEGY_PLANNED: a plan first, as `planning` true asks. The other
strategies are the one loop (the model's calls of one turn that change nothing run at once)."""


def agentic_generate(
    app: Application,
    session_id: str,
    prompt: str,
    strategy: int,
    max_steps: int,
    planning: bool,
    reflection: bool,
) -> AsyncIterator[Item]:
    """AgenticGenerateRequest's run."""
    return app.agentic.generate(
        session_id,
        prompt,
        max_steps=max_steps,
        planning=planning or strategy == PLANNED,
        reflection=reflection,
    )


async def outcome(items: AsyncIterator[Item]) -> Finished:
    """A run's outcome, for the unary RPCs; what broke it is raised (its status is the reply)."""
    async for item in items:
        if isinstance(item, Failed) and not item.recoverable:
            raise item.error
        if isinstance(item, Finished):
            return item
    raise AssertionError("the run ended without an outcome")


async def agentic_events(
    session_id: str, items: AsyncIterator[Item], delegation: bool = False
) -> AsyncIterator[dict[str, Any]]:
    """AgenticGenerateEvents' fields, for the streaming RPCs; in a `delegation`, once the child has
    started (its first event names it), each event names its session (`agent_session_id`)."""
    child = ""
    async for item in items:
        fields = agentic_event(session_id, item, child)
        if fields is not None:
            if delegation:
                child = child or fields.get("agent_session_id", "")
            yield fields


def agentic_reply(session_id: str, done: Finished) -> dict[str, Any]:
    """AgenticGenerateResponse's fields."""
    return {
        "session_id": session_id,
        "text": done.text,
        "steps": [_agentic_step(step) for step in done.steps],
        "tool_calls": [_tool_call(call, result) for call, result in done.tool_calls],
        "usage": _usage(done.usage),
        "finish_reason": done.finish_reason,
        "plan": execution_plan(done.plan) if done.plan is not None else None,
    }


def delegate_reply(session_id: str, done: Finished) -> dict[str, Any]:
    """DelegateResponse's fields."""
    reply = agentic_reply(session_id, done)
    del reply["plan"]
    return {**reply, "agent_session_id": done.agent_session_id}


def agentic_event(session_id: str, item: Item, agent_session_id: str = "") -> dict[str, Any] | None:
    """AgenticGenerateEvent's fields of `item` (None for what the wire has no event for);
    `agent_session_id`: the delegated child's, on each event of a delegation."""
    fields = _event_fields(item)
    if fields is None:
        return None
    child = agent_session_id or (item.agent_session_id if isinstance(item, Finished) else "")
    return {"session_id": session_id, **({"agent_session_id": child} if child else {}), **fields}


def _event_fields(item: Item) -> dict[str, Any] | None:
    if isinstance(item, Progress):
        return _progress(item)
    if isinstance(item, StepFinished):
        step = item.step
        return {
            "type": "step_finish",
            "step_index": step.index,
            "step_text": step.text,
            "usage": _usage(step.usage),
        }
    if isinstance(item, PlanMade):
        return {"type": "plan", "plan": execution_plan(item.plan)}
    if isinstance(item, Reflected):
        return {"type": "reflection", "confidence": item.confidence, "should_retry": item.should_retry,
                "insight": item.insight}  # fmt: skip
    if isinstance(item, Failed):
        return {"type": "error", "error_message": str(item.error), "recoverable": item.recoverable}
    if isinstance(item, Told):
        return _told(item.event)
    return {
        "type": "done",
        "content": item.text,
        "finish_reason": item.finish_reason,
        "usage": _usage(item.usage),
    }


def _progress(item: Progress) -> dict[str, Any] | None:
    event = item.event
    if isinstance(event, TextEvent):
        return {"type": "text", "content": event.text}
    if isinstance(event, ToolCallEvent):
        return {"type": "tool_call", "tool_call": _tool_call(event.call, None), "tool_call_id": event.call.id,
                "tool_name": event.call.name, "tool_args": event.call.arguments}  # fmt: skip
    if isinstance(event, ToolResultEvent):
        return {"type": "tool_result", "tool_result": _tool_result(event.result), "tool_call_id": event.call.id,
                "tool_name": event.call.name}  # fmt: skip
    if isinstance(event, NoticeEvent):
        return _notice(event.data)
    return None  # a turn's end (step_finish says it), the model's thinking


def _notice(data: dict[str, str]) -> dict[str, Any] | None:
    """The notices a run's stream carries, as the events A3S names."""
    kind = data.get("type", "")
    child = {"agent_session_id": data["child_session_id"]} if data.get("child_session_id") else {}
    if kind == "subagent_start":
        return {"type": kind, "agent_name": data.get("agent"), "agent_task": data.get("description"),
                "tool_call_id": data.get("tool_id"), **child}  # fmt: skip
    if kind == "subagent_progress":
        return {"type": kind, "agent_name": data.get("agent"), "tool_name": data.get("tool_name"),
                "tool_call_id": data.get("child_tool_id"), "content": data.get("step"), **child}  # fmt: skip
    if kind == "subagent_end":
        return {"type": kind, "agent_name": data.get("agent"), "finish_reason": data.get("finish_reason"),
                "agent_result": data.get("result"), "tool_call_id": data.get("tool_id"),
                "error_message": data.get("error"), **child}  # fmt: skip
    if kind == "confirmation_required":
        return {"type": kind, "confirmation_id": data.get("tool_id"), "tool_call_id": data.get("tool_id"),
                "tool_name": data.get("tool_name"), "tool_args": data.get("arguments"),
                "timeout_ms": int(data.get("timeout_ms") or 0) or None, **child}  # fmt: skip
    if kind == "context_compacted":
        return {"type": "context_compact", "before_tokens": int(data.get("before_tokens", 0)),
                "after_tokens": int(data.get("after_tokens", 0)), "content": data.get("summary")}  # fmt: skip
    if kind == "token_budget_spent":
        used, budget = data.get("token_budget_used"), data.get("token_budget")
        return {"type": "error", "error_message": f"the session's token budget of {budget} tokens is spent"
                f" ({used} used): raise it to go on", "recoverable": False}  # fmt: skip
    return None


def _told(event: Event) -> dict[str, Any]:
    """A confirmation's answer or an external task, from the session's log: `external_task`'s
    session is the one the task waits in (a subagent's, or the session's own)."""
    data = event.data
    child = {"agent_session_id": data["child_session_id"]} if data.get("child_session_id") else {}
    if event.type is EventType.CONFIRMATION_RECEIVED:
        return {"type": "confirmation_received", "confirmation_id": data.get("tool_id"),
                "tool_call_id": data.get("tool_id"), "approved": data.get("approved") == "true",
                "content": data.get("reason") or None, **child}  # fmt: skip
    task: dict[str, Any] = {
        "task_id": data.get("task_id", ""),
        "session_id": data.get("child_session_id") or event.session_id,
    }
    if event.type is EventType.EXTERNAL_TASK_PENDING:
        lane = data.get("lane", "")
        task.update(lane=f"SESSION_LANE_{lane}" if lane else 0, command_type=data.get("command_type", ""),
                    payload=data.get("payload", ""))  # fmt: skip
        return {"type": "external_task_pending", "external_task": task, "tool_name": data.get("command_type"),
                **child}  # fmt: skip
    return {"type": "external_task_completed", "external_task": task, "content": data.get("success")}


def _agentic_step(step: Step) -> dict[str, Any]:
    """AgenticStep's fields."""
    return {
        "step_index": step.index,
        "text": step.text,
        "tool_calls": [_tool_call(call, None) for call, _ in step.calls],
        "tool_results": [_tool_result(result) for _, result in step.calls if result is not None],
        "usage": _usage(step.usage),
        "finish_reason": step.finish_reason,
    }


def _tool_call(call: ToolCall, result: ToolOutput | None) -> dict[str, Any]:
    return {
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "result": _tool_result(result) if result is not None else None,
    }


def _tool_result(result: ToolOutput) -> dict[str, Any]:
    return {"success": result.success, "output": result.output, "error": result.error,
            "metadata": result.string_metadata()}  # fmt: skip


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
