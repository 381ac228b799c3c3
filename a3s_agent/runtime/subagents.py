"""Subagents: a child run of an agent (core/agents/) on a task, in a session of its own below the
session whose model (or client) asked for it.

A child's session is created with a link to its parent and the call that made it (its id derived
from both), the parent's workspace, permission and confirmation policies, lane handlers, loaded
skills and memory settings, the agent's prompt as its system prompt, and the parent's model unless
the agent names another. It runs as a generation of its own (its own context, compaction, lease
and log, where its chunks are, so anyone may follow it) in the caller's task: in the parent's tool
call for the `task` tool, so that whatever stops the parent's run (Cancel, a lost lease, the
server stopping) stops the child too. Its tools are those of the parent's model that the agent
allows, and `task` only while the depth limit lets it start children of its own.

While it runs the parent's control reaches it (core/sessions/control.py adopt), each of its model
turns' usage is added to the usage of every session above it (by the loop: a token budget at the top
covers the whole tree), and the parent's log gets `subagent_start`, `subagent_progress` (each tool call of
the child) and `subagent_end` INFO events naming the child's session.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ..base.errors import AgentError, AlreadyExists, Cancelled, FailedPrecondition
from ..base.models import LLMConfig, Message, SessionConfig, Usage
from ..config import Settings
from ..core.agents.catalog import AgentCatalog, Agents
from ..core.agents.definition import AgentDefinition
from ..core.agents.task_tool import TaskArguments, describe, task_tool
from ..core.loop.accounting import spending_data
from ..core.loop.agent import (
    DEFAULT_MAX_TOOL_CALLS,
    AgentEvent,
    DoneEvent,
    GenerateOptions,
    Generation,
    NoticeEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from ..core.sessions.control import ControlPlane
from ..core.sessions.manager import SESSION_ID_PATTERN, SessionManager
from ..core.store.events import EventBus, EventType
from ..core.store.session import ParentLink, Session, SessionSettings
from ..tools.registry import Tool, ToolContext, ToolOutput
from .runs import Runs

MAX_ANSWER_CHARS = 16_000
"""Of a child's answer, what the parent's model gets (the rest stays in the child's session)."""
MAX_TASK_TOOLS = 32  # task tools kept built (one per distinct list of agents)

SUBAGENT_START = "subagent_start"
SUBAGENT_PROGRESS = "subagent_progress"
SUBAGENT_END = "subagent_end"
PASSED_ON = frozenset({SUBAGENT_START, SUBAGENT_PROGRESS, SUBAGENT_END, "confirmation_required"})
"""The child's notices its parent's stream gets (a child's compaction or spent budget is its own)."""


@dataclass(frozen=True)
class Delegation:
    """What a subagent is asked to do."""

    agent: str
    prompt: str
    description: str = ""
    max_steps: int = 0  # at most this many tool calls (0: the agent's, else the loop's default)
    allowed_tools: tuple[str, ...] = ()  # narrower still than the agent's (empty: no narrowing)


@dataclass(frozen=True)
class ChildEvent:
    """An event of a child's run, with the child's session id."""

    session_id: str
    event: AgentEvent


class Subagents:
    def __init__(
        self,
        settings: Settings,
        sessions: SessionManager,
        control: ControlPlane,
        events: EventBus,
        runs: Runs,
        tools_for: Callable[[Session | None], list[Tool]],
        llm_for: Callable[[Session], LLMConfig],
        release: Callable[[str], Awaitable[None]],
        workspace: Callable[[], Path],
    ) -> None:
        """`release` stops what a session holds open (the MCP servers of the skills a child has
        from its parent), when a child's run ends."""
        self._settings = settings
        self._sessions = sessions
        self._control = control
        self._events = events
        self._runs = runs
        self._tools_for = tools_for
        self._llm_for = llm_for
        self._release = release
        self.catalog = AgentCatalog(settings.agent_dirs, settings.trust_workspace_agents, workspace)
        self._slots: dict[str, tuple[asyncio.Semaphore, list[None]]] = {}  # per parent: slots, users
        self._task_tools: dict[str, Tool] = {}

    # --- what a session's model is offered ---------------------------------------------------

    def agents_for(self, session: Session | None) -> Agents:
        return self.catalog.for_workspace(Path(session.config.workspace) if session is not None else None)

    def tools_for(self, session: Session | None) -> list[Tool]:
        """The `task` tool, for a session whose subagents may start children (depth limit)."""
        depth = len(self._sessions.lineage(session)) if session is not None else 0
        if depth >= self._settings.subagent_depth:
            return []
        description = describe(self.agents_for(session))
        tool = self._task_tools.get(description)
        if tool is None:  # the same object while the agents are the same: its schema is built once
            if len(self._task_tools) >= MAX_TASK_TOOLS:
                self._task_tools.clear()
            tool = self._task_tools[description] = task_tool(description, self._run_task)
        return [tool]

    async def _run_task(self, args: TaskArguments, ctx: ToolContext) -> ToolOutput:
        """The `task` tool's call: the child's answer, or what stopped it, for the parent's model."""
        caller = ctx.caller
        if caller is None or ctx.session_id is None:
            return ToolOutput(
                success=False, error="task starts a subagent only when a model calls it in a generation"
            )
        delegation = Delegation(args.agent, args.prompt, args.description)
        child = ""
        done: Generation | None = None
        try:
            async for item in self.stream(ctx.session_id, caller.call_id, delegation, caller.offered):
                child = item.session_id
                notice = item.event.data if isinstance(item.event, NoticeEvent) else {}
                if notice.get("type") in PASSED_ON:  # for the parent's caller
                    caller.notify({**notice, "child_session_id": child, "agent": args.agent})
                elif isinstance(item.event, DoneEvent):
                    done = item.event.generation
        except Cancelled:
            return ToolOutput(
                success=False, error="cancelled: the subagent was stopped", metadata=_about(child, args.agent)
            )
        except AgentError as exc:
            return ToolOutput(
                success=False, error=f"subagent {args.agent!r}: {exc}", metadata=_about(child, args.agent)
            )
        if done is None:  # (the loop always ends with one)
            raise AssertionError("the subagent's run ended without a result")
        answer = done.message.content
        if len(answer) > MAX_ANSWER_CHARS:
            answer = (
                f"{answer[:MAX_ANSWER_CHARS]}\n[the answer is cut at {MAX_ANSWER_CHARS} characters of"
                f" {len(answer)}; all of it is the last message of session {child}]"
            )
        return ToolOutput(
            output=answer or "(the subagent gave no answer)",
            metadata={**_about(child, args.agent), "finish_reason": done.finish_reason, "turns": done.turns,
                      **done.usage.counts()},
        )  # fmt: skip

    # --- a child's run -------------------------------------------------------------------------

    async def stream(
        self,
        parent_id: str,
        call_id: str,
        delegation: Delegation,
        offered: Collection[str] | None = None,
    ) -> AsyncIterator[ChildEvent]:
        """Run `delegation` as a child of `parent_id` started by the call `call_id`; its events as
        they are committed, with NoticeEvents saying what the parent's log says of it
        (`subagent_start`, `subagent_progress` with each tool call and result, `subagent_end`
        before the DoneEvent, which is last). `offered`: the tools the parent's model has (None:
        all the parent's). NotFound (no such agent), InvalidArgument (its file is broken) and
        FailedPrecondition (the depth limit) raise before anything is created."""
        parent = self._sessions.get(parent_id)
        if len(self._sessions.lineage(parent)) >= self._settings.subagent_depth:
            raise FailedPrecondition(
                f"session {parent_id!r} may not start subagents: they nest at most"
                f" {self._settings.subagent_depth} deep (A3S_SUBAGENT_DEPTH)"
            )
        agent = self.agents_for(parent).get(delegation.agent)
        async with self._slot(parent_id):
            child = await self._create(parent, call_id, agent, delegation)
            tools = self._tools(parent, child, agent, offered, delegation.allowed_tools)
            steps = delegation.max_steps or agent.max_steps or DEFAULT_MAX_TOOL_CALLS
            options = GenerateOptions(enable_tools=bool(tools), allowed_tools=tools, max_tool_calls=steps)
            async for event in self._run(parent, child, call_id, agent, delegation, options):
                yield ChildEvent(child.id, event)

    async def _run(
        self,
        parent: Session,
        child: Session,
        call_id: str,
        agent: AgentDefinition,
        delegation: Delegation,
        options: GenerateOptions,
    ) -> AsyncIterator[AgentEvent]:
        about = {"child_session_id": child.id, "agent": agent.name, "tool_id": call_id}

        def tell(message: str, data: dict[str, object]) -> NoticeEvent:
            """An event in the parent's log, fenced by the parent run's lease (the run ends only
            once its calls have: core/loop/agent.py), so refused once another replica took it;
            and the notice for the parent's stream that says the same."""
            self._events.publish(EventType.INFO, parent.id, message, {**about, **data})
            return NoticeEvent({key: str(value) for key, value in {"type": message, **about, **data}.items()})

        def end(ending: dict[str, object]) -> dict[str, object]:
            duration = round((time.perf_counter() - started) * 1000, 3)
            return {
                **ending,
                "duration_ms": duration,
                **spending_data(self._llm_for(child).model, calls, usage),
            }

        self._control.adopt(parent.id, child.id)
        started = time.perf_counter()
        ending: dict[str, object] = {"finish_reason": "error", "success": "false"}
        usage, calls, told = Usage(), 0, False
        try:
            yield tell(SUBAGENT_START, {"description": delegation.description})
            prompt = [Message(role="user", content=delegation.prompt)]
            async for event in self._runs.here(child.id, prompt, options):
                if isinstance(event, TurnEvent):  # (the loop adds it to the parent's usage too)
                    usage, calls = usage + event.usage, calls + 1
                elif isinstance(event, ToolCallEvent | ToolResultEvent):
                    yield tell(SUBAGENT_PROGRESS, _step(event))
                elif isinstance(event, DoneEvent):
                    ending = {"finish_reason": event.generation.finish_reason, "success": "true",
                              "turns": event.generation.turns}  # fmt: skip
                    told = True
                    yield tell(SUBAGENT_END, end(ending))
                yield event
        except (Cancelled, asyncio.CancelledError):
            ending = {"finish_reason": "cancelled", "success": "false"}
            raise
        except AgentError as exc:
            ending = {"finish_reason": "error", "success": "false", "error": str(exc)[:2000]}
            raise
        finally:
            self._control.disown(child.id)
            await self._release(child.id)
            if not told:
                tell(SUBAGENT_END, end(ending))

    async def _create(
        self, parent: Session, call_id: str, agent: AgentDefinition, delegation: Delegation
    ) -> Session:
        """The child's session: the parent's settings but its client's own tools, MCP servers,
        todos and budget (the budget at the top of the line covers it)."""
        copied = SessionSettings.from_json(parent.settings.to_json())  # (no list or dict shared)
        settings = replace(copied, client_tools={}, mcp_servers={}, todos=[], token_budget=None)
        llm = parent.config.llm
        if agent.model:
            llm = LLMConfig(model=agent.model).merged_over(llm or LLMConfig())
        config = SessionConfig(
            name=f"{agent.name}: {delegation.description}" if delegation.description else agent.name,
            workspace=parent.config.workspace,
            llm=llm,
            system_prompt=agent.prompt,
            max_context_length=parent.config.max_context_length,
            auto_compact=True,
        )
        link = ParentLink(parent.id, call_id, agent.name)
        for child_id in _child_ids(parent.id, call_id):
            try:
                return await self._sessions.create(child_id, config, [], settings, link)
            except AlreadyExists:  # a call id used again (some models number their calls per turn)
                continue
        raise FailedPrecondition(f"session {parent.id!r} has too many subagents of call {call_id!r}")

    def _tools(
        self,
        parent: Session,
        child: Session,
        agent: AgentDefinition,
        offered: Collection[str] | None,
        allowed: tuple[str, ...],
    ) -> list[str]:
        """The child's tools: those of the parent's model (all the parent's when `offered` is None)
        that the agent allows (and `allowed` names, when it names any); `task` among them only
        when the depth limit lets the child start children (`tools_for`)."""
        parents = {tool.name for tool in self._tools_for(parent)} if offered is None else set(offered)
        return [
            tool.name
            for tool in self._tools_for(child)
            if tool.name in parents and agent.allows(tool) and (not allowed or tool.name in allowed)
        ]

    @asynccontextmanager
    async def _slot(self, parent_id: str) -> AsyncIterator[None]:
        """One of the A3S_MAX_SUBAGENTS children of `parent_id` that may run at once."""
        slots, users = self._slots.setdefault(
            parent_id, (asyncio.Semaphore(self._settings.max_subagents), [])
        )
        users.append(None)
        try:
            async with slots:
                yield
        finally:
            users.pop()
            if not users:
                self._slots.pop(parent_id, None)


def _about(child: str, agent: str) -> dict[str, object]:
    return {"child_session_id": child, "agent": agent} if child else {"agent": agent}


def _step(event: ToolCallEvent | ToolResultEvent) -> dict[str, object]:
    if isinstance(event, ToolCallEvent):
        return {"step": "tool_call", "tool_name": event.call.name, "child_tool_id": event.call.id}
    return {"step": "tool_result", "tool_name": event.call.name, "child_tool_id": event.call.id,
            "tool_success": str(event.result.success).lower()}  # fmt: skip


def _child_ids(parent_id: str, call_id: str) -> Iterator[str]:
    """The ids a child of the call may have: `<parent>.<call>` when that is a session id, else the
    parent's and a digest of both; then the same with `-2`, `-3`... (a call id used again)."""
    base = f"{parent_id}.{call_id}"
    if not SESSION_ID_PATTERN.fullmatch(base) or len(base) > 120:
        digest = hashlib.sha256(f"{parent_id}\0{call_id}".encode()).hexdigest()[:24]
        base = f"{parent_id[:90]}.{digest}"
    yield base
    for number in range(2, 100):
        yield f"{base}-{number}"
