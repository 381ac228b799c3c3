"""Control of running generations: cancel, pause and resume, tool confirmation, lanes, external tasks."""

from __future__ import annotations

import asyncio
from typing import Any

from ..base.errors import NotFound
from ..base.models import Message
from ..core.control import ConfirmationPolicy, ExternalTask, Lane, LaneHandler
from ..runtime import Runtime


class Control:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def cancel(self, session_id: str, operation_id: str | None) -> bool:
        """Whether something was running to cancel."""
        return self._rt.control.cancel(session_id, operation_id)

    def inject(self, session_id: str, messages: list[Message]) -> bool:
        """Context for the running generation's next model call; False when none runs."""
        return self._rt.control.inject(session_id, messages)

    def runs_in(self, session_id: str, task: asyncio.Task[Any]) -> bool:
        """Whether the session's running generation is `task` (False too for an unknown session)."""
        try:
            return self._rt.control.of(session_id).run_task is task
        except NotFound:
            return False

    async def pause(self, session_id: str) -> None:
        await self._rt.control.pause(session_id)

    async def resume(self, session_id: str) -> None:
        await self._rt.control.resume(session_id)

    def confirm(self, session_id: str, tool_id: str, approved: bool, reason: str) -> None:
        self._rt.control.confirm(session_id, tool_id, approved, reason)

    async def set_confirmation_policy(
        self, session_id: str, policy: ConfirmationPolicy
    ) -> ConfirmationPolicy:
        self._rt.sessions.get(session_id)
        return await self._rt.control.set_confirmation_policy(session_id, policy)

    def confirmation_policy(self, session_id: str) -> ConfirmationPolicy:
        return self._rt.control.confirmation_policy(session_id)

    async def set_lane_handler(self, session_id: str, lane: Lane, handler: LaneHandler) -> LaneHandler:
        self._rt.sessions.get(session_id)
        return await self._rt.control.set_lane_handler(session_id, lane, handler)

    def lane_handler(self, session_id: str, lane: Lane) -> LaneHandler:
        self._rt.sessions.get(session_id)
        return self._rt.control.lane_handler(session_id, lane)

    def complete_external(
        self, session_id: str, task_id: str, success: bool, result: str, error: str
    ) -> None:
        self._rt.control.complete_external(session_id, task_id, success, result, error)

    def pending_external(self, session_id: str) -> list[ExternalTask]:
        return self._rt.control.pending_external(session_id)
