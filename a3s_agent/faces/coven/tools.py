"""The tool part of a request's answer: tool_use, tool_state transitions, tool_approval_request
and tool_result, from the agent run's events and the live events of the session."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ...app.control import Control
from ...app.events import Feed
from ...app.types import Event, EventType, ToolOutput, tool_message
from ...base.errors import NotFound
from ...base.models import ToolCall
from ...proto import coven_pb2 as pb

log = logging.getLogger(__name__)

# Sends one MessageResponse event of the request, e.g. respond(tool_use=pb.ToolUse(...)).
Respond = Callable[..., None]

FINAL_STATES = frozenset(
    {pb.TOOL_STATE_COMPLETED, pb.TOOL_STATE_FAILED, pb.TOOL_STATE_DENIED,
     pb.TOOL_STATE_TIMEOUT, pb.TOOL_STATE_CANCELLED}
)  # fmt: skip

WATCHED_EVENTS = frozenset(
    {EventType.TOOL_CALLED, EventType.TOOL_COMPLETED, EventType.PERMISSION_DENIED,
     EventType.CONFIRMATION_REQUIRED, EventType.CONFIRMATION_RECEIVED, EventType.CONFIRMATION_TIMEOUT}
)  # fmt: skip


def final_state(result: ToolOutput) -> pb.ToolState:
    """How a finished call ended, read from the error texts the core's tool gate and tools give."""
    if result.success:
        return pb.TOOL_STATE_COMPLETED
    error = result.error
    if error.startswith("timed out") or "no confirmation within" in error:
        return pb.TOOL_STATE_TIMEOUT
    if error.startswith(("denied by policy", "rejected by user")):
        return pb.TOOL_STATE_DENIED
    if error.startswith("cancelled"):
        return pb.TOOL_STATE_CANCELLED
    return pb.TOOL_STATE_FAILED


class ToolStates:
    """Every tool call of one request goes PENDING -> [AWAITING_APPROVAL] -> RUNNING -> a final
    state, each state sent once and nothing after the final one."""

    def __init__(self, control: Control, session_id: str, respond: Respond) -> None:
        self._control = control
        self._session_id = session_id
        self._respond = respond
        self._states: dict[str, pb.ToolState] = {}
        self._unanswered: set[str] = set()  # calls without a tool_result yet
        self._starting: set[str] = set()
        self._approve_all = False

    @property
    def all_answered(self) -> bool:
        return not self._unanswered

    # --- from the agent run ----------------------------------------------------------------

    def used(self, call: ToolCall) -> None:
        self._respond(tool_use=pb.ToolUse(id=call.id, name=call.name, input_json=call.arguments or "{}"))
        self._unanswered.add(call.id)
        self._set(call.id, pb.TOOL_STATE_PENDING)

    def finished(self, call: ToolCall, result: ToolOutput) -> None:
        self._set(call.id, final_state(result), result.error)
        self._unanswered.discard(call.id)
        content = tool_message(call, result).content  # what the model reads back
        self._respond(tool_result=pb.ToolResult(id=call.id, output=content, is_error=not result.success))

    def abandon(self, reason: str) -> None:
        """The request ended early: calls still open were cancelled with it."""
        for tool_id in list(self._states):
            self._set(tool_id, pb.TOOL_STATE_CANCELLED, reason)

    # --- from the gateway ------------------------------------------------------------------

    def approve(self, answer: pb.ToolApprovalResponse) -> bool:
        """Answer a confirmation; False when that call is not waiting for one. approve_all also
        approves the calls waiting now and every later one of this request; a denial never
        turns into an approval."""
        if self._states.get(answer.id) != pb.TOOL_STATE_AWAITING_APPROVAL:
            return False
        self._confirm(answer.id, answer.approved)
        if answer.approved and answer.approve_all:
            self._approve_all = True
            for tool_id, state in list(self._states.items()):
                if state == pb.TOOL_STATE_AWAITING_APPROVAL:
                    self._confirm(tool_id, True)
        return True

    # --- from the session's live events ----------------------------------------------------

    async def follow(self, subscription: Feed) -> None:
        async for event in subscription:
            self._on_event(event)

    def _on_event(self, event: Event) -> None:
        tool_id = event.data.get("tool_id", "")
        if tool_id not in self._states:
            return  # another client's call on the same session
        self._starting.discard(tool_id)
        if event.type is EventType.TOOL_CALLED:
            # The gate publishes TOOL_CALLED and, in the same step, either its decision (denied,
            # confirmation needed, finished at once) or nothing because the tool started. All of it
            # is queued before this task wakes, so a call still undecided once the queue is
            # drained (call_soon runs after that) is running.
            self._starting.add(tool_id)
            asyncio.get_running_loop().call_soon(self._started, tool_id)
        elif event.type is EventType.CONFIRMATION_REQUIRED:
            if self._approve_all:
                self._confirm(tool_id, True)
                return
            self._set(tool_id, pb.TOOL_STATE_AWAITING_APPROVAL)
            self._respond(
                tool_approval_request=pb.ToolApprovalRequest(
                    id=tool_id,
                    name=event.data.get("tool_name", ""),
                    input_json=event.data.get("arguments", ""),
                )
            )
        elif event.type is EventType.CONFIRMATION_RECEIVED:
            if event.data.get("approved") == "true":
                self._set(tool_id, pb.TOOL_STATE_RUNNING)
            else:
                self._set(tool_id, pb.TOOL_STATE_DENIED, event.data.get("reason", ""))
        elif event.type is EventType.CONFIRMATION_TIMEOUT:
            if event.data.get("action") == "approved":
                self._set(tool_id, pb.TOOL_STATE_RUNNING)
            else:
                self._set(tool_id, pb.TOOL_STATE_TIMEOUT, event.message)
        elif event.type is EventType.PERMISSION_DENIED:
            self._set(tool_id, pb.TOOL_STATE_DENIED, event.message)

    def _started(self, tool_id: str) -> None:
        if tool_id in self._starting:
            self._starting.discard(tool_id)
            self._set(tool_id, pb.TOOL_STATE_RUNNING)

    def _confirm(self, tool_id: str, approved: bool) -> None:
        reason = "approved by the gateway user" if approved else "denied by the gateway user"
        try:
            self._control.confirm_own(self._session_id, tool_id, approved, reason)
        except NotFound:
            log.warning("tool call %s is no longer waiting for confirmation", tool_id)

    def _set(self, tool_id: str, state: pb.ToolState, detail: str = "") -> None:
        current = self._states.get(tool_id)
        if current == state or current in FINAL_STATES:
            return
        self._states[tool_id] = state
        self._respond(tool_state=pb.ToolStateUpdate(id=tool_id, state=state, detail=detail or None))
