"""The A2A tasks this server keeps: the SDK's in-memory store, bounded (A3S_A2A_MAX_TASKS). Past
the bound the oldest ended tasks are forgotten; a task still going is never."""

from __future__ import annotations

from collections import OrderedDict

from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import Task


class BoundedTaskStore(InMemoryTaskStore):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit
        self._kept: OrderedDict[str, tuple[ServerCallContext, bool]] = OrderedDict()
        """Each task's id, oldest first: the context it was saved in (whose owner deletes it), and
        whether it has ended."""

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        self._kept[task.id] = (context, task.status.state in TERMINAL_TASK_STATES)
        while len(self._kept) > self._limit:
            oldest = next((task_id for task_id, (_, ended) in self._kept.items() if ended), None)
            if oldest is None:
                return  # every task kept is going on
            owner, _ = self._kept.pop(oldest)
            await super().delete(oldest, owner)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._kept.pop(task_id, None)
        await super().delete(task_id, context)
