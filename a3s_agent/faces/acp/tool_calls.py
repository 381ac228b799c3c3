"""The tool calls of one prompt turn as the editor sees them. Each goes pending (the model made it;
also while it waits for permission) -> in_progress (it runs) -> completed or failed (with what the
model reads back), each status sent once, nothing after the last. A plan tool call is shown as the
session's plan instead; a `task` call shows its subagent's steps (subagents.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from acp.schema import (
    TerminalToolCallContent,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
    ToolCallUpdate,
)

from ...app.events import Feed
from ...app.types import Event, EventType, Tool, ToolOutput, tool_message
from ...base.models import ToolCall
from .describe import ToolContent, arguments_of, output_content, shown_output, started
from .outbox import SessionUpdate
from .permissions import Asker
from .plan import PLAN_TOOL, plan_update
from .subagents import ChildSteps, child_call_id, notice_call_id

log = logging.getLogger(__name__)

WATCHED_EVENTS = frozenset(
    {EventType.TOOL_CALLED, EventType.TOOL_COMPLETED, EventType.PERMISSION_DENIED,
     EventType.CONFIRMATION_REQUIRED, EventType.CONFIRMATION_RECEIVED, EventType.CONFIRMATION_TIMEOUT}
)  # fmt: skip
_RANK: dict[ToolCallStatus, int] = {"pending": 0, "in_progress": 1, "completed": 2, "failed": 2}

Send = Callable[[SessionUpdate], None]


@dataclass
class _Call:
    call: ToolCall
    start: ToolCallUpdate  # the first report, which a permission request repeats
    status: ToolCallStatus = "pending"
    content: list[ToolContent] = field(default_factory=list)  # diffs and terminals, kept to the end
    child: ChildSteps | None = None  # a task call's subagent, once it started


class ToolCalls:
    def __init__(
        self, session_id: str, workspace: Path, tools: Mapping[str, Tool], send: Send, asker: Asker
    ) -> None:
        self._session_id = session_id
        self._workspace = workspace
        self._tools = tools
        self._send = send
        self._asker = asker
        self._calls: dict[str, _Call] = {}
        self._starting: set[str] = set()
        self._asking: set[asyncio.Task[None]] = set()

    # --- from the agent run ----------------------------------------------------------------

    def requested(self, call: ToolCall) -> None:
        if call.name == PLAN_TOOL:
            return
        self._show(call, started(call, self._tools.get(call.name), self._workspace))

    def finished(self, call: ToolCall, result: ToolOutput) -> None:
        if call.name == PLAN_TOOL:
            plan = plan_update(call.arguments) if result.success else None
            if plan is not None:
                self._send(plan)
            return
        content = [*self._content(call.id), *shown_output(tool_message(call, result))]
        raw = {"success": result.success, "metadata": result.string_metadata()}
        self._set(call.id, "completed" if result.success else "failed", content=content, raw_output=raw)

    def confirmation_required(self, data: dict[str, str]) -> None:
        """The call `data` names waits for a person: ask the editor (in a task: the run goes on
        meanwhile). A subagent's call (`child_session_id`) is first shown as a call of its own."""
        child, tool_id = data.get("child_session_id", ""), data.get("tool_id", "")
        if child:
            self._child_call(data)
        known = self._calls.get(notice_call_id(data))
        if known is None:
            return
        ask = self._asker.ask(
            self._session_id, known.start, known.call.name, arguments_of(known.call), tool_id, child
        )
        task = asyncio.create_task(ask, name=f"acp-permission-{tool_id}")
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    def subagent(self, data: dict[str, str]) -> None:
        """The `task` call's subagent started, took a step or ended: the call's content says so; a
        call of the child shown on its own (it was asked about) ends with its result."""
        known = self._calls.get(data.get("tool_id", ""))
        if known is None:
            return
        if known.child is None:
            known.child = ChildSteps()
        known.child.noted(data)
        if data.get("step") == "tool_result":
            own = child_call_id(data.get("child_session_id", ""), data.get("child_tool_id", ""))
            self._set(own, "completed" if data.get("tool_success") == "true" else "failed")
        self._set(data.get("tool_id", ""), "in_progress", content=self._content(data.get("tool_id", "")))

    def _child_call(self, data: dict[str, str]) -> None:
        """A subagent's call, shown as one of the turn's, titled with its agent."""
        key = notice_call_id(data)
        call = ToolCall(key, data.get("tool_name", ""), data.get("arguments", "") or "{}")
        start = started(call, self._tools.get(call.name), self._workspace)
        start.title = f"{data.get('agent', 'subagent')} subagent: {start.title}"
        self._show(call, start)

    def _show(self, call: ToolCall, start: ToolCallStart) -> None:
        update = ToolCallUpdate(**start.model_dump(exclude={"session_update"}))
        self._calls[call.id] = _Call(call, update, content=list(start.content or []))
        self._send(start)

    def attach_terminal(self, tool_name: str, command: str, terminal_id: str) -> bool:
        """Show the editor's terminal running `command` in the call that runs it."""
        for tool_id, known in self._calls.items():
            if (
                known.call.name == tool_name
                and _RANK[known.status] < 2
                and not any(isinstance(c, TerminalToolCallContent) for c in known.content)
                and arguments_of(known.call).get("command") == command
            ):
                known.content.append(TerminalToolCallContent(type="terminal", terminal_id=terminal_id))
                self._set(tool_id, "in_progress", content=list(known.content))
                return True
        return False

    def close(self, reason: str) -> None:
        """The turn is over: calls still open ended with it, and nobody waits for answers."""
        for task in self._asking:
            task.cancel()
        for tool_id, known in self._calls.items():
            if _RANK[known.status] < 2:
                self._set(tool_id, "failed", content=[*self._content(tool_id), output_content(reason)])

    # --- from the session's live events ----------------------------------------------------

    async def follow(self, subscription: Feed) -> None:
        async for event in subscription:
            self._on_event(event)

    def _on_event(self, event: Event) -> None:
        tool_id = notice_call_id(event.data)
        if tool_id not in self._calls:
            return
        self._starting.discard(tool_id)
        if event.type is EventType.TOOL_CALLED:
            # The gate publishes TOOL_CALLED and, in the same step, its decision (denied, asking)
            # when it takes one; all of it is queued before this task wakes. A call with nothing
            # after TOOL_CALLED once the queue is drained (call_soon runs after that) is running.
            self._starting.add(tool_id)
            asyncio.get_running_loop().call_soon(self._started, tool_id)
        elif (event.type is EventType.CONFIRMATION_RECEIVED and event.data.get("approved") == "true") or (
            event.type is EventType.CONFIRMATION_TIMEOUT and event.data.get("action") == "approved"
        ):
            self._set(tool_id, "in_progress")

    def _started(self, tool_id: str) -> None:
        if tool_id in self._starting:
            self._starting.discard(tool_id)
            self._set(tool_id, "in_progress")

    def _content(self, tool_id: str) -> list[ToolContent]:
        """What the call shows: its diffs and terminals, and its subagent's steps."""
        known = self._calls.get(tool_id)
        if known is None:
            return []
        return [*known.content, *([known.child.content()] if known.child is not None else [])]

    def _set(
        self,
        tool_id: str,
        status: ToolCallStatus,
        content: list[ToolContent] | None = None,
        raw_output: dict[str, object] | None = None,
    ) -> None:
        known = self._calls.get(tool_id)
        if known is None or _RANK[status] < _RANK[known.status] or _RANK[known.status] == 2:
            return
        if status == known.status and content is None:
            return
        known.status = status
        self._send(
            ToolCallProgress(
                session_update="tool_call_update",
                tool_call_id=tool_id,
                status=status,
                content=content,
                raw_output=raw_output,
            )
        )
