"""The control plane of running generations: cancel, pause/resume, human confirmation, lanes and
external tasks. Every wait here has a bound."""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ...base.errors import InvalidArgument, NotWaiting
from ...base.models import Message, SessionState
from ..policy.permissions import PermissionPolicy
from ..store.events import EventBus, EventType
from ..store.session import DEFAULT_CONFIRMATION_TIMEOUT_MS as DEFAULT_CONFIRMATION_TIMEOUT_MS
from ..store.session import DEFAULT_EXTERNAL_TIMEOUT_MS as DEFAULT_EXTERNAL_TIMEOUT_MS
from ..store.session import ConfirmationPolicy as ConfirmationPolicy
from ..store.session import HandlerMode as HandlerMode
from ..store.session import LaneHandler as LaneHandler
from .lane_counts import LaneCounts
from .manager import SessionManager

MAX_WAIT_MS = 3_600_000


class Lane(enum.IntEnum):
    """Numbers match the wire enum SessionLane. Control actions never queue behind the others."""

    CONTROL = 1
    QUERY = 2
    EXECUTE = 3
    GENERATE = 4


# How many operations of one session may run at once in each lane.
LANE_LIMITS = {Lane.QUERY: 8, Lane.EXECUTE: 1, Lane.GENERATE: 1}


@dataclass
class ExternalTask:
    task_id: str
    session_id: str
    lane: Lane
    command_type: str
    payload: str
    timeout_ms: int
    deadline: float
    future: asyncio.Future[tuple[bool, str, str]]

    @property
    def remaining_ms(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


@dataclass(frozen=True)
class PendingTask:
    """An external task as a listing shows it (what travels between replicas: no future)."""

    task_id: str
    session_id: str
    lane: Lane
    command_type: str
    payload: str
    timeout_ms: int
    remaining_ms: int


@dataclass(frozen=True)
class Steer:
    """A message for the running generation, taken in at its next safe point (loop/steering.py)."""

    steer_id: str
    message: Message


@dataclass
class Outcome:
    """How a wait for a person or a host ended."""

    approved: bool
    detail: str


class SessionControl:
    """The live (not persisted) control state of one session."""

    def __init__(self) -> None:
        self.run_task: asyncio.Task[Any] | None = None
        self.cancel_requested = False
        self.running = asyncio.Event()  # cleared while paused
        self.running.set()
        self.tool_tasks: dict[str, asyncio.Task[Any]] = {}
        self.cancelled_tools: set[str] = set()
        self.confirmations: dict[str, asyncio.Future[Outcome]] = {}
        self.external: dict[str, ExternalTask] = {}
        self.lanes = {lane: asyncio.Semaphore(limit) for lane, limit in LANE_LIMITS.items()}
        self.injected: list[Message] = []  # context for the running run's next model call
        self.steers: list[Steer] = []  # user messages for the running run's next model call
        self.ending = False  # the running run has given its answer: it takes no more steers
        self.counts = LaneCounts(Lane)  # how busy each lane is here (GetQueueStats)


def _bounded_ms(value: int, default: int) -> int:
    return min(value or default, MAX_WAIT_MS)


class ControlPlane:
    def __init__(self, sessions: SessionManager, events: EventBus) -> None:
        self._sessions = sessions
        self._events = events
        self._controls: dict[str, SessionControl] = {}
        self._parents: dict[str, str] = {}  # a running subagent's session -> its parent's

    def of(self, session_id: str) -> SessionControl:
        self._sessions.get(session_id)
        control = self._controls.get(session_id)
        if control is None:  # built only when missing: it is asked for many times a turn
            control = self._controls[session_id] = SessionControl()
        return control

    def queue_depths(self) -> dict[str, int]:
        """Per lane (by lowercase name), the operations waiting for its slot in every session here."""
        controls = tuple(self._controls.values())  # a snapshot: metrics may read it from their thread
        return {lane.name.lower(): sum(c.counts[lane].pending for c in controls) for lane in Lane}

    def confirmations_waiting(self) -> int:
        """Tool calls waiting for a confirmation in every session here."""
        return sum(len(c.confirmations) for c in tuple(self._controls.values()))

    def forget(self, session_id: str) -> None:
        self._parents.pop(session_id, None)
        control = self._controls.pop(session_id, None)
        if control is not None and control.run_task is not None:
            control.run_task.cancel()

    # --- subagents: a parent's control reaches the children it runs --------------------------

    def adopt(self, parent_id: str, child_id: str) -> None:
        """`child_id`'s run is a subagent of `parent_id`'s until `disown`: Cancel, Pause and
        Resume of the parent reach it, and its confirmations are the parent's clients' too."""
        self._parents[child_id] = parent_id

    def disown(self, child_id: str) -> None:
        self._parents.pop(child_id, None)

    def _children(self, session_id: str) -> list[str]:
        return [child for child, parent in self._parents.items() if parent == session_id]

    def _descendants(self, session_id: str) -> list[str]:
        """The running subagents below the session, at any depth."""
        return [child for child in self._parents if session_id in self._ancestors(child)]

    def _publish_up(self, kind: EventType, session_id: str, said: str, data: Mapping[str, object]) -> None:
        """Publish to the session, and for a subagent to each session above it too (naming it in
        `child_session_id`): its parents' clients answer what it waits for and see it answered."""
        self._events.publish(kind, session_id, said, data)
        for above in self._ancestors(session_id):
            self._events.publish(
                kind, above, f"{said} in subagent {session_id}", {**data, "child_session_id": session_id}
            )

    def _ancestors(self, session_id: str) -> list[str]:
        line: list[str] = []
        while (session_id := self._parents.get(session_id, "")) and session_id not in line:
            line.append(session_id)
        return line

    # --- runs: cancel, pause, resume ------------------------------------------------------

    def start_run(self, session_id: str) -> SessionControl:
        control = self.of(session_id)
        control.run_task = asyncio.current_task()
        control.cancel_requested = False
        return control

    def end_run(self, session_id: str) -> None:
        control = self._controls.get(session_id)
        if control is not None:
            control.run_task = None
            control.cancel_requested = False
            control.ending = False
            control.cancelled_tools.clear()

    def cancel(self, session_id: str, operation_id: str | None) -> bool:
        """Stop the running generation and its subagents' (or only the tool call `operation_id`);
        False when nothing ran."""
        control = self.of(session_id)
        with control.counts.running(Lane.CONTROL):
            children = self._children(session_id) if operation_id is None else []
            stopped = [self.cancel(child, None) for child in children]  # first: see the loop's _run_group
            return self._cancel(control, operation_id) or any(stopped)

    def _cancel(self, control: SessionControl, operation_id: str | None) -> bool:
        if control.run_task is None or control.run_task.done():
            return False
        if operation_id:
            task = control.tool_tasks.get(operation_id)
            if task is None or task.done():
                return False
            control.cancelled_tools.add(operation_id)
            task.cancel()
            return True
        control.cancel_requested = True
        for waiter in control.confirmations.values():
            waiter.cancel()
        for external in control.external.values():
            external.future.cancel()
        control.running.set()  # a paused run must wake up to stop
        control.run_task.cancel()
        return True

    def inject(self, session_id: str, messages: list[Message]) -> bool:
        """Queue context for the running generation's next model call; False when none runs."""
        control = self.of(session_id)
        with control.counts.running(Lane.CONTROL):
            if control.run_task is None or control.run_task.done():
                return False
            control.injected.extend(messages)
            return True

    def take_injected(self, session_id: str) -> list[Message]:
        control = self.of(session_id)
        taken, control.injected = control.injected, []
        return taken

    def steer(self, session_id: str, message: Message, steer_id: str = "") -> str:
        """Queue `message` for the running generation's next model call, which it then answers
        too; the steer's id (`steer_id`, or a new one), "" when no generation runs or the running
        one has given its answer."""
        control = self.of(session_id)
        with control.counts.running(Lane.CONTROL):
            if control.run_task is None or control.run_task.done() or control.ending:
                return ""
            steer = Steer(steer_id or f"steer_{uuid.uuid4().hex[:20]}", message)
            control.steers.append(steer)
            return steer.steer_id

    def take_steers(self, session_id: str) -> list[Steer]:
        control = self.of(session_id)
        taken, control.steers = control.steers, []
        return taken

    def may_end(self, session_id: str) -> bool:
        """Whether the running generation may end with the answer it has: no steer waits for it.
        When it may, it takes no more steers from now on (`steer` answers "")."""
        control = self.of(session_id)
        control.ending = not control.steers
        return control.ending

    async def pause(self, session_id: str) -> None:
        """Hold the session's run, and its subagents', at their next step."""
        control = self.of(session_id)
        with control.counts.running(Lane.CONTROL):
            control.running.clear()
            await self._sessions.set_state(session_id, SessionState.PAUSED)
        for child in self._children(session_id):
            await self.pause(child)

    async def resume(self, session_id: str) -> None:
        control = self.of(session_id)
        with control.counts.running(Lane.CONTROL):
            control.running.set()
            await self._sessions.set_state(session_id, SessionState.ACTIVE)
        for child in self._children(session_id):
            await self.resume(child)

    async def checkpoint(self, session_id: str) -> None:
        """A step boundary: wait here while the session is paused."""
        await self.of(session_id).running.wait()

    # --- human confirmation ---------------------------------------------------------------

    def confirmation_policy(self, session_id: str) -> ConfirmationPolicy:
        return self._sessions.get(session_id).settings.confirmation_policy

    def permission_policy(self, session_id: str) -> PermissionPolicy:
        """As the session has it now: a rule set while a run goes on governs its next call."""
        return self._sessions.get(session_id).settings.permission_policy

    async def set_confirmation_policy(
        self, session_id: str, policy: ConfirmationPolicy
    ) -> ConfirmationPolicy:
        policy.default_timeout_ms = _bounded_ms(policy.default_timeout_ms, DEFAULT_CONFIRMATION_TIMEOUT_MS)
        await self._sessions.update_settings(session_id, lambda s: replace(s, confirmation=policy))
        return policy

    async def wait_for_confirmation(
        self, session_id: str, tool_id: str, tool_name: str, arguments: str, timeout_ms: int, on_timeout: bool
    ) -> Outcome:
        """Ask the host; approval, rejection or the timeout action, never an unbounded wait."""
        control = self.of(session_id)
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        control.confirmations[tool_id] = waiter
        data = {"tool_id": tool_id, "tool_name": tool_name, "arguments": arguments, "timeout_ms": timeout_ms}
        self._publish_up(EventType.CONFIRMATION_REQUIRED, session_id, f"{tool_name} needs confirmation", data)
        try:
            return await asyncio.wait_for(waiter, timeout_ms / 1000)
        except TimeoutError:
            action = "approved" if on_timeout else "rejected"
            self._events.publish(
                EventType.CONFIRMATION_TIMEOUT,
                session_id,
                f"no answer for {tool_name} within {timeout_ms} ms: {action}",
                {"tool_id": tool_id, "tool_name": tool_name, "action": action},
            )
            return Outcome(on_timeout, f"no confirmation within {timeout_ms} ms")
        finally:
            control.confirmations.pop(tool_id, None)

    def confirm(self, session_id: str, tool_id: str, approved: bool, reason: str) -> None:
        """Answer the call `tool_id` waiting in the session, or in one of its running subagents."""
        control = self.of(session_id)
        with control.counts.running(Lane.CONTROL):
            waiting = (
                self._waiting_child(session_id, tool_id) if tool_id not in control.confirmations else None
            )
            if waiting is not None:
                session_id, control = waiting, self.of(waiting)
            self._confirm(control, session_id, tool_id, approved, reason)

    def _waiting_child(self, session_id: str, tool_id: str) -> str | None:
        """The subagent below `session_id` whose call `tool_id` waits for confirmation, if one does."""
        found = [child for child in self._descendants(session_id) if tool_id in self.of(child).confirmations]
        if len(found) > 1:
            raise NotWaiting(
                f"subagents {', '.join(found)} each wait for a confirmation of a call {tool_id!r}: answer"
                " with the subagent's session_id"
            )
        return found[0] if found else None

    def _confirm(
        self, control: SessionControl, session_id: str, tool_id: str, approved: bool, reason: str
    ) -> None:
        waiter = control.confirmations.get(tool_id)
        if waiter is None or waiter.done():
            raise NotWaiting(
                f"no tool call {tool_id!r} is waiting for confirmation in session {session_id!r}"
            )
        waiter.set_result(Outcome(approved, reason))
        data = {"tool_id": tool_id, "approved": str(approved).lower(), "reason": reason}
        said = f"tool call {tool_id} {'approved' if approved else 'rejected'}"
        self._publish_up(EventType.CONFIRMATION_RECEIVED, session_id, said, data)

    # --- lanes and external tasks ---------------------------------------------------------

    def lane_handler(self, session_id: str, lane: Lane) -> LaneHandler:
        if lane not in Lane.__members__.values():
            raise InvalidArgument("lane must be one of CONTROL, QUERY, EXECUTE, GENERATE")
        return self._sessions.get(session_id).settings.lanes.get(int(lane)) or LaneHandler()

    async def set_lane_handler(self, session_id: str, lane: Lane, handler: LaneHandler) -> LaneHandler:
        handler.timeout_ms = _bounded_ms(handler.timeout_ms, DEFAULT_EXTERNAL_TIMEOUT_MS)
        await self._sessions.update_settings(
            session_id, lambda s: replace(s, lanes={**s.lanes, int(lane): handler})
        )
        return handler

    async def run_external(
        self, session_id: str, lane: Lane, command_type: str, payload: str, timeout_ms: int
    ) -> tuple[bool, str, str]:
        """Hand an operation to the host and wait (bounded) for CompleteExternalTask."""
        control = self.of(session_id)
        timeout_ms = _bounded_ms(timeout_ms, DEFAULT_EXTERNAL_TIMEOUT_MS)
        task = ExternalTask(
            task_id=f"task_{uuid.uuid4().hex[:20]}",
            session_id=session_id,
            lane=lane,
            command_type=command_type,
            payload=payload,
            timeout_ms=timeout_ms,
            deadline=time.monotonic() + timeout_ms / 1000,
            future=asyncio.get_running_loop().create_future(),
        )
        control.external[task.task_id] = task
        data = {"task_id": task.task_id, "lane": lane.name, "command_type": command_type, "payload": payload}
        self._publish_up(
            EventType.EXTERNAL_TASK_PENDING, session_id, f"{command_type} is waiting for the host", data
        )
        outcome: tuple[bool, str, str] = (False, "", "")
        try:
            outcome = await asyncio.wait_for(task.future, timeout_ms / 1000)
            return outcome
        except TimeoutError:
            return False, "", f"the host did not complete {command_type} within {timeout_ms} ms"
        finally:
            control.external.pop(task.task_id, None)
            control.counts.finished(lane, outcome[0])

    def complete_external(
        self, session_id: str, task_id: str, success: bool, result: str, error: str
    ) -> None:
        """Complete the task `task_id` waiting in the session, or in one of its running subagents."""
        control = self.of(session_id)
        with control.counts.running(Lane.CONTROL):
            if task_id not in control.external:
                waiting = next(
                    (c for c in self._descendants(session_id) if task_id in self.of(c).external), None
                )
                if waiting is not None:
                    session_id, control = waiting, self.of(waiting)
            self._complete_external(control, session_id, task_id, success, result, error)

    def _complete_external(
        self, control: SessionControl, session_id: str, task_id: str, success: bool, result: str, error: str
    ) -> None:
        task = control.external.get(task_id)
        if task is None or task.future.done():
            raise NotWaiting(f"no pending external task {task_id!r} in session {session_id!r}")
        task.future.set_result((success, result, error))
        self._publish_up(
            EventType.EXTERNAL_TASK_COMPLETED,
            session_id,
            f"{task.command_type} completed by the host",
            {"task_id": task_id, "success": str(success).lower()},
        )

    def pending_external(self, session_id: str) -> list[PendingTask]:
        """The session's, then its running subagents' (each naming its own session)."""
        return [
            PendingTask(
                t.task_id, t.session_id, t.lane, t.command_type, t.payload, t.timeout_ms, t.remaining_ms
            )
            for session in (session_id, *self._descendants(session_id))
            for t in self.of(session).external.values()
        ]

    def lane_stats(self, session_id: str) -> dict[str, dict[str, int]]:
        """Per lane (by lowercase name): pending, active, external (tasks waiting for the host),
        completed, failed, as this replica sees them; JSON-ready, for routing to the run's owner."""
        control = self.of(session_id)
        external = [task.lane for task in control.external.values()]
        return {
            lane.name.lower(): {**asdict(control.counts[lane]), "external": external.count(lane)}
            for lane in Lane
        }
