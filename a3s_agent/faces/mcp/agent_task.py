"""The `agent_task` tool: a whole generation on a session (a new one, or the caller's), answered
with the final message, with a progress notification per tool call, tool result and model turn.

The generation runs in a task of its own, so that an MCP cancellation (notifications/cancelled, or
the caller's request going away) reaches it as a Cancel does over gRPC: the run stops, its open
tool calls are answered and the session says it was cancelled. Cancelling the handler's task
directly would cut that cleanup short (the SDK's anyio scopes cancel every await again)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
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
from .convert import error_result
from .tools import AGENT_TASK

CANCEL_WAIT_S = 5.0
"""After a cancellation: how long the run may take to stop (tools killed, history written)."""
NEW_SESSION_NAME = "mcp agent_task"

Report = Callable[[float, str], Awaitable[None]]
"""Sends one progress notification: the step number (rising) and what happened."""


class AgentTaskArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="What the agent should do: the user message it answers.")
    session_id: str = Field(
        "",
        description="Go on in this session (its history, model and rules); empty: a new session in"
        " the server's workspace. The result names the session.",
    )


class AgentTaskResult(BaseModel):
    answer: str
    session_id: str
    finish_reason: str
    turns: int


TOOL = types.Tool(
    name=AGENT_TASK,
    description=(
        "Give a task to the a3s coding agent: it works in its workspace with its own tools (files,"
        " search, shell, git) until it can answer, and returns its final answer. Progress"
        " notifications report each tool call while it runs; cancelling the request stops it."
        " Pass the returned session_id to go on in the same conversation."
    ),
    input_schema=AgentTaskArguments.model_json_schema(),
    output_schema=AgentTaskResult.model_json_schema(),
    annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
)


async def run_agent_task(app: Application, arguments: dict[str, Any], report: Report) -> types.CallToolResult:
    try:
        args = AgentTaskArguments.model_validate(arguments)
        session_id = args.session_id or await _new_session(app)
        generation = await _run(app, session_id, args.task, report)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}" for e in exc.errors()
        )
        return error_result(InvalidArgument(f"arguments for {AGENT_TASK}: {problems}"))
    except AgentError as exc:
        return error_result(exc)
    result = AgentTaskResult(
        answer=generation.message.content,
        session_id=session_id,
        finish_reason=generation.finish_reason,
        turns=generation.turns,
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


async def _run(app: Application, session_id: str, text: str, report: Report) -> Generation:
    events: asyncio.Queue[AgentEvent | None] = asyncio.Queue()
    run = asyncio.create_task(_generate(app, session_id, text, events))
    try:
        step = 0
        while (event := await events.get()) is not None:
            note = _note(event)
            if note:
                step += 1
                await report(step, note)
        return await run
    except BaseException:  # cancelled, or the progress could not be sent: the caller is gone
        if not run.done():
            _stop(app, session_id, run)
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
    app: Application, session_id: str, text: str, events: asyncio.Queue[AgentEvent | None]
) -> Generation:
    try:
        messages = [Message(role="user", content=text)]
        async for event in app.generation.stream(session_id, messages, GenerateOptions()):
            if isinstance(event, DoneEvent):
                return event.generation
            events.put_nowait(event)
        raise AssertionError("the agent loop ended without a result")
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
        return ", ".join(f"{key}: {value}" for key, value in event.data.items())
    return ""
