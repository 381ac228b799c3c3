"""The way every tool call the model makes is run: permission rules, human confirmation, the
session's lane handler (ours, the host's, or both), lane concurrency, events, cancellation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ...base import telemetry
from ...base.errors import AgentError
from ...base.models import ToolCall
from ...tools.registry import Tool, ToolContext, ToolOutput
from ..policy.permissions import evaluated
from ..sessions.control import ControlPlane, HandlerMode, Lane, Outcome
from ..store.events import EventBus, EventType, event_entry
from ..store.protocol import LogEntry
from ..store.session import Session
from . import meters, span_content, spans

# A notice for the caller of a running generation (a METADATA chunk in streams).
Notify = Callable[[dict[str, str]], None]


def lane_of(tool: Tool) -> Lane:
    return Lane.QUERY if tool.lane == "query" else Lane.EXECUTE


def called(session_id: str, call: ToolCall) -> LogEntry:
    """The TOOL_CALLED entry of a call about to run."""
    return event_entry(
        EventType.TOOL_CALLED, session_id, f"calling {call.name}",
        {"tool_id": call.id, "tool_name": call.name, "arguments": call.arguments},
    )  # fmt: skip


class ToolGate:
    def __init__(self, control: ControlPlane, events: EventBus) -> None:
        self._control = control
        self._events = events

    def holds_nothing(self, session: Session) -> bool:
        """Whether no permission rule and no confirmation of `session` can deny or hold a call:
        then nothing the gate decides follows a call's TOOL_CALLED (only the tool's own end),
        and the caller may log that entry ahead of the call, with the write before it. Faces
        that read the decision from the events in the same commit as TOOL_CALLED (coven's tool
        states) still get it so whenever there is one to read."""
        policy = self._control.permission_policy(session.id)
        free = not policy.enabled or (
            policy.default_decision == "allow" and not policy.deny and not policy.ask
        )
        return free and not self._control.confirmation_policy(session.id).enabled

    async def run(
        self,
        session: Session,
        call: ToolCall,
        tool: Tool | None,
        ctx: ToolContext,
        notify: Notify,
        completed: Callable[[LogEntry], None] | None = None,
        announced: bool = False,
    ) -> ToolOutput:
        """Run one model-requested call; never raises for the call's own failures. Its
        TOOL_CALLED entry is queued for the log unless `announced` (the caller logged `called`'s
        entry with the write before). The TOOL_COMPLETED entry goes to `completed` when given (the
        caller logs it with the call's result), else to the log's queue."""
        sid = session.id
        if not announced:
            self._events.submit(called(sid, call))
        started = time.perf_counter()
        control = self._control.of(sid)
        task = asyncio.current_task()
        if task is not None:
            control.tool_tasks[call.id] = task
        try:
            with spans.tool_span(session, call):  # current while the call runs (a subagent's parent)
                span_content.note_call(call)
                result = await self._decide_and_run(session, call, tool, ctx, notify)
                spans.note_outcome(result)
                span_content.note_result(result)
        except asyncio.CancelledError:
            if call.id not in control.cancelled_tools:
                raise
            # Only this call was cancelled (Cancel with its id): the run goes on.
            if task is not None:
                task.uncancel()
            result = ToolOutput(success=False, error="cancelled by the client")
        finally:
            control.tool_tasks.pop(call.id, None)
        entry = event_entry(
            EventType.TOOL_COMPLETED, sid, f"{call.name} {'succeeded' if result.success else 'failed'}",
            {"tool_id": call.id, "tool_name": call.name, "success": str(result.success).lower(),
             "duration_ms": f"{(time.perf_counter() - started) * 1000:.1f}"},
        )  # fmt: skip
        (completed or self._events.submit)(entry)
        meters.tool_call(
            tool.name if tool is not None else None, result.success, time.perf_counter() - started
        )
        return result

    async def _decide_and_run(
        self, session: Session, call: ToolCall, tool: Tool | None, ctx: ToolContext, notify: Notify
    ) -> ToolOutput:
        if tool is None:
            return ToolOutput(success=False, error=f"tool {call.name!r} is not available in this request")
        try:
            args = tool.parse_arguments(call.arguments)
        except AgentError as exc:
            return ToolOutput(success=False, error=str(exc))
        arguments = args.model_dump()
        lane = lane_of(tool)
        permissions = self._control.permission_policy(session.id)
        # By the tool's own name: a call of A3S Code's `read` is governed as read_file is.
        verdict = await evaluated(permissions, tool.name, arguments, ctx.workspace, subject=tool.rule_subject)
        telemetry.note({"a3s.permission.decision": verdict.decision})
        if verdict.decision == "deny":
            rule = ", ".join(verdict.matching_rules) or "the default decision"
            self._events.publish(
                EventType.PERMISSION_DENIED, session.id, f"{call.name} denied by policy: {rule}",
                {"tool_id": call.id, "tool_name": call.name, "rules": rule},
            )  # fmt: skip
            return ToolOutput(success=False, error=f"denied by policy: {rule}")
        confirmation = self._control.confirmation_policy(session.id)
        if verdict.decision == "ask" or confirmation.needs_confirmation(tool.name, lane):
            if confirmation.enabled:
                notify({"type": "confirmation_required", "tool_id": call.id, "tool_name": call.name,
                        "arguments": call.arguments, "timeout_ms": str(confirmation.default_timeout_ms)})  # fmt: skip
                outcome = await self._control.wait_for_confirmation(
                    session.id, call.id, call.name, call.arguments,
                    confirmation.default_timeout_ms, confirmation.auto_approve_on_timeout,
                )  # fmt: skip
            else:
                # A rule asks but nobody is set up to answer: the timeout action decides at once.
                outcome = Outcome(
                    confirmation.auto_approve_on_timeout, "confirmation is off for this session"
                )
            telemetry.note({"a3s.confirmation": "approved" if outcome.approved else "rejected"})
            if not outcome.approved:
                return ToolOutput(
                    success=False, error=f"rejected by user: {outcome.detail or 'no reason given'}"
                )
        return await self._execute(session, call, tool, args, ctx, lane)

    async def _execute(
        self, session: Session, call: ToolCall, tool: Tool, args: object, ctx: ToolContext, lane: Lane
    ) -> ToolOutput:
        handler = self._control.lane_handler(session.id, lane)
        if tool.external or handler.mode == HandlerMode.EXTERNAL:
            payload = call.arguments or "{}"
            success, result, error = await self._control.run_external(
                session.id, lane, call.name, payload, handler.timeout_ms
            )
            return ToolOutput(success=success, output=result, error=error, metadata={"external": True})
        if handler.mode == HandlerMode.HYBRID:
            self._events.publish(
                EventType.EXTERNAL_TASK_PENDING, session.id, f"{call.name} runs here; observed by the host",
                {"task_id": call.id, "lane": lane.name, "command_type": call.name, "payload": call.arguments},
            )  # fmt: skip
        control = self._control.of(session.id)
        async with control.counts.holding(lane, control.lanes[lane]) as held:
            output = await tool.execute(args, ctx)  # type: ignore[arg-type]
            held.ok = output.success
        if handler.mode == HandlerMode.HYBRID:
            self._events.publish(
                EventType.EXTERNAL_TASK_COMPLETED, session.id, f"{call.name} finished",
                {"task_id": call.id, "success": str(output.success).lower(), "output": output.output[:4000]},
            )  # fmt: skip
        return output
