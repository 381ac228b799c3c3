"""The `agent_task` tool: a whole generation on a session (a new one, or the caller's), answered
with the final message, with a progress notification per tool call, tool result and model turn.
Naming an `agent` makes it a delegation: that agent runs on the task as a subagent of the session
(app.subagents.delegate), in a child session of its own, and its answer is the result.

The generation runs in a task of its own, so that an MCP cancellation (notifications/cancelled, or
the caller's request going away) reaches it as a Cancel does over gRPC: the run stops, its open
tool calls are answered and the session says it was cancelled. Cancelling the handler's task
directly would cut that cleanup short (the SDK's anyio scopes cancel every await again)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import anyio
from mcp import types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...app import Application
from ...app.types import (
    AgentEvent,
    DoneEvent,
    GenerateOptions,
    Generation,
    NoticeEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from ...base.errors import AgentError, InvalidArgument
from ...base.models import Message, SessionConfig
from .convert import error_result, problems
from .tools import AGENT_TASK

CANCEL_WAIT_S = 5.0
"""After a cancellation: how long the run may take to stop (tools killed, history written)."""
NEW_SESSION_NAME = "mcp agent_task"

Report = Callable[[float, str], Awaitable[None]]
"""Sends one progress notification: the step number (rising) and what happened."""
Watch = Callable[[str, AgentEvent], None]
"""Sees each event of the run, with the session it is of (a subagent's: its child session's)."""


class AgentTaskArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="What the agent should do: the user message it answers.")
    session_id: str = Field(
        "",
        description="Go on in this session (its history, model and rules); empty: a new session in"
        " the server's workspace. The result names the session.",
    )
    agent: str = Field(
        "",
        description="Give the task to this agent (explore, plan, general or one of the server's agent"
        " files) as a subagent of the session: it works in a child session of its own, with the tools"
        " its agent allows, and its answer is the result. Empty: the session's own model works on it.",
    )


class AgentTaskResult(BaseModel):
    answer: str
    session_id: str
    finish_reason: str
    turns: int
    agent: str = ""
    child_session_id: str = ""
    """The subagent's session, when an agent was named."""
    checkpoint: int = 0
    """The checkpoint taken before the task's first turn, in the session that ran it (the child's,
    when an agent was named): rewinding to it undoes the task. 0: none was taken."""


TOOL = types.Tool(
    name=AGENT_TASK,
    description=(
        "Give a task to the a3s coding agent: it works in its workspace with its own tools (files,"
        " search, shell, git) until it can answer, and returns its final answer. Progress"
        " notifications report each tool call while it runs; cancelling the request stops it."
        " Pass the returned session_id to go on in the same conversation. Name an agent to hand the"
        " task to a subagent with a context of its own (explore: read-only search and reading)."
    ),
    input_schema=AgentTaskArguments.model_json_schema(),
    output_schema=AgentTaskResult.model_json_schema(),
    annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
)


async def run_agent_task(
    app: Application, arguments: dict[str, Any], report: Report, watch: Watch | None = None
) -> types.CallToolResult:
    try:
        args = AgentTaskArguments.model_validate(arguments)
        session_id = args.session_id or await _new_session(app)
        since = await _newest_checkpoint(app, session_id)
        generation, child = await _run(app, session_id, args, report, watch)
        checkpoint = await _first_checkpoint(app, child or session_id, 0 if child else since)
    except ValidationError as exc:
        return error_result(InvalidArgument(f"arguments for {AGENT_TASK}: {problems(exc)}"))
    except AgentError as exc:
        return error_result(exc)
    result = AgentTaskResult(
        answer=generation.message.content,
        session_id=session_id,
        finish_reason=generation.finish_reason,
        turns=generation.turns,
        agent=args.agent,
        child_session_id=child,
        checkpoint=checkpoint,
    )
    return types.CallToolResult(
        content=[
            types.TextContent(text=result.answer),
            types.TextContent(text=result.model_dump_json(exclude={"answer"})),
        ],
        structured_content=result.model_dump(),
    )


async def _new_session(app: Application) -> str:
    view = await app.sessions.create(None, SessionConfig(name=NEW_SESSION_NAME), [], {})
    return view.session.id


async def _newest_checkpoint(app: Application, session_id: str) -> int:
    records = await app.checkpoints.of_session(session_id)
    return records[-1].seq if records else 0


async def _first_checkpoint(app: Application, session_id: str, since: int) -> int:
    """The first turn checkpoint of the session after `since` (0: none)."""
    records = await app.checkpoints.of_session(session_id)
    return next((r.seq for r in records if r.seq > since and r.kind == "turn"), 0)


async def _run(
    app: Application, session_id: str, args: AgentTaskArguments, report: Report, watch: Watch | None
) -> tuple[Generation, str]:
    """The run's result, and the session of the subagent that answered (empty: none did)."""
    events: asyncio.Queue[tuple[str, AgentEvent] | None] = asyncio.Queue()
    run = asyncio.create_task(_generate(app, session_id, args, events))
    runner = session_id  # the session whose generation `run` is: the child's, once it started
    try:
        step = 0
        while (item := await events.get()) is not None:
            runner, event = item
            if watch is not None:
                watch(runner, event)
            note = _note(event)
            if note:
                step += 1
                await report(step, note)
        return await run, runner if runner != session_id else ""
    except BaseException:  # cancelled, or the progress could not be sent: the caller is gone
        if not run.done():
            _stop(app, runner, run)
            with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT_S):
                await asyncio.wait({run})  # its tools killed and its end written before the call ends
        raise


def _stop(app: Application, session_id: str, run: asyncio.Task[Generation]) -> None:
    if not app.control.cancel_own(session_id, run):  # the run answers its open calls, raises Cancelled
        run.cancel()  # still waiting for the session's previous generation
    run.add_done_callback(_retrieve)


def _retrieve(run: asyncio.Task[Generation]) -> None:
    """Its outcome read, though nobody waits for it any more."""
    if not run.cancelled():
        run.exception()


async def _generate(
    app: Application,
    session_id: str,
    args: AgentTaskArguments,
    events: asyncio.Queue[tuple[str, AgentEvent] | None],
) -> Generation:
    """The run: the session's generation, or the named agent's as its subagent; its events, each
    with the session it is of, go to `events`."""
    try:
        done: Generation | None = None
        if args.agent:
            async for item in app.subagents.delegate(session_id, args.agent, args.task):
                if isinstance(item.event, DoneEvent):  # the last: the loop ends, the child's run too
                    done = item.event.generation
                else:
                    events.put_nowait((item.session_id, item.event))
        else:
            messages = [Message(role="user", content=args.task)]
            async with aclosing(app.generation.stream(session_id, messages, GenerateOptions())) as own:
                async for event in own:  # to its end: the run over (the session free) once answered
                    if isinstance(event, DoneEvent):
                        done = event.generation
                    else:
                        events.put_nowait((session_id, event))
        if done is None:
            raise AssertionError("the agent loop ended without a result")
        return done
    finally:
        events.put_nowait(None)


def _note(event: AgentEvent) -> str:
    """The progress message for an event; empty for those not worth one (text as it streams)."""
    if isinstance(event, ToolCallEvent):
        return f"calling {event.call.name}"
    if isinstance(event, ToolResultEvent):
        outcome = "done" if event.result.success else f"failed: {event.result.error}"
        return f"{event.call.name} {outcome}"
    if isinstance(event, TurnEvent):
        return f"model turn {event.turn} finished ({event.finish_reason})"
    if isinstance(event, NoticeEvent):
        data = event.data
        if data.get("type") == "subagent_start":
            return f"subagent {data.get('agent')} started in session {data.get('child_session_id')}"
        if data.get("type") == "subagent_end":
            return f"subagent {data.get('agent')} ended ({data.get('finish_reason')})"
        if data.get("type") == "subagent_progress":
            return ""  # (its tool calls and results are reported themselves)
        return ", ".join(f"{key}: {value}" for key, value in data.items())
    return ""
