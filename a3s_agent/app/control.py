"""Control of running generations: cancel, pause and resume, tool confirmation, lanes, external tasks.

What acts on a running generation goes to the replica that runs it (runtime/replicas.py route),
wherever the call arrived."""

from __future__ import annotations

import asyncio
from typing import Any

from ..base.errors import FailedPrecondition, InvalidArgument, NotFound
from ..base.models import Message
from ..core.sessions.control import ConfirmationPolicy, Lane, LaneHandler, PendingTask
from ..runtime import Runtime


class Control:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def _route(self, session_id: str, action: str, args: dict[str, Any]) -> Any:
        await self._rt.sessions.refresh(session_id)
        runs_here = self._rt.control.of(session_id).run_task is not None  # NotFound for an unknown session
        return await self._rt.replicas.route(session_id, action, args, runs_here)

    async def cancel(self, session_id: str, operation_id: str | None) -> bool:
        """Whether something was running to cancel."""
        return bool(await self._route(session_id, "cancel", {"operation_id": operation_id or ""}))

    async def inject(self, session_id: str, messages: list[Message]) -> bool:
        """Context for the running generation's next model call; False when none runs."""
        wire = [{"role": m.role, "content": m.content, "data": m.to_json()} for m in messages]
        return bool(await self._route(session_id, "inject", {"messages": wire}))

    async def steer(self, session_id: str, content: str) -> str:
        """Send the user's `content` to the session's running generation, which takes it in at its
        next safe point and answers it (core/loop/steering.py); the steer's id. FailedPrecondition
        when no generation runs, or the running one has given its answer: send it as a new prompt."""
        if not content.strip():
            raise InvalidArgument("content: a steer needs the text to send the running generation")
        wire = {"role": "user", "content": content, "data": {}}
        steer_id = str(await self._route(session_id, "steer", {"message": wire}))
        if not steer_id:
            raise FailedPrecondition(
                f"no generation is running in session {session_id!r} to steer; send the message as a new prompt"
            )
        return steer_id

    # For faces whose generation runs in their own task (Generation.stream: coven, ACP, MCP), so
    # it is this replica's: no routing, and no waiting.

    def runs_in(self, session_id: str, task: asyncio.Task[Any]) -> bool:
        """Whether the session's running generation is `task` (False too for an unknown session)."""
        try:
            return self._rt.control.of(session_id).run_task is task
        except NotFound:
            return False

    def cancel_own(self, session_id: str, task: asyncio.Task[Any]) -> bool:
        """Cancel the session's generation when it is `task`; whether it was."""
        return self.runs_in(session_id, task) and self._rt.control.cancel(session_id, None)

    def inject_own(self, session_id: str, task: asyncio.Task[Any], messages: list[Message]) -> bool:
        """`inject` into the session's generation when it is `task`; whether it was."""
        return self.runs_in(session_id, task) and self._rt.control.inject(session_id, messages)

    def confirm_own(self, session_id: str, tool_id: str, approved: bool, reason: str) -> None:
        """`confirm` a tool call of a generation running here (NotFound when none waits)."""
        self._rt.control.confirm(session_id, tool_id, approved, reason)

    async def pause(self, session_id: str) -> None:
        await self._route(session_id, "pause", {})

    async def resume(self, session_id: str) -> None:
        await self._route(session_id, "resume", {})

    async def confirm(self, session_id: str, tool_id: str, approved: bool, reason: str) -> None:
        await self._route(session_id, "confirm", {"tool_id": tool_id, "approved": approved, "reason": reason})

    async def set_confirmation_policy(
        self, session_id: str, policy: ConfirmationPolicy
    ) -> ConfirmationPolicy:
        await self._rt.sessions.refresh(session_id)
        self._rt.sessions.get(session_id)
        return await self._rt.control.set_confirmation_policy(session_id, policy)

    async def confirmation_policy(self, session_id: str) -> ConfirmationPolicy:
        await self._rt.sessions.refresh(session_id)
        return self._rt.control.confirmation_policy(session_id)

    async def set_lane_handler(self, session_id: str, lane: Lane, handler: LaneHandler) -> LaneHandler:
        await self._rt.sessions.refresh(session_id)
        self._rt.sessions.get(session_id)
        return await self._rt.control.set_lane_handler(session_id, lane, handler)

    async def lane_handler(self, session_id: str, lane: Lane) -> LaneHandler:
        await self._rt.sessions.refresh(session_id)
        self._rt.sessions.get(session_id)
        return self._rt.control.lane_handler(session_id, lane)

    async def complete_external(
        self, session_id: str, task_id: str, success: bool, result: str, error: str
    ) -> None:
        args = {"task_id": task_id, "success": success, "result": result, "error": error}
        await self._route(session_id, "complete_external", args)

    async def pending_external(self, session_id: str) -> list[PendingTask]:
        """The external tasks the session's running generation waits for (on whichever replica)."""
        listed = await self._route(session_id, "pending_external", {})
        return [PendingTask(**{**task, "lane": Lane(task["lane"])}) for task in listed]

    async def lane_stats(self, session_id: str) -> dict[str, dict[str, int]]:
        """How busy each lane of the session is (core/sessions/control.py lane_stats), as the replica that
        runs its generation sees it, else this one."""
        stats: dict[str, dict[str, int]] = await self._route(session_id, "lane_stats", {})
        return stats
