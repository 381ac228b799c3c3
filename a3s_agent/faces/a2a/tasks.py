"""The A2A tasks this server keeps, in the session store (core/store/a2a_tasks.py): a task outlives
the server that took its first message, and any replica reads and follows it on. At most
A3S_A2A_MAX_TASKS are kept; past that the oldest ended ones are forgotten, a task still going never.

The SDK saves a task at each of its events, a text chunk's included. A change of state is written
at once; a working task's artifacts growing are written at most every FLUSH_S, the last always: a
copy that old is still whole (its response artifact names the seq of its last chunk), and whoever
resubscribes from it follows the run on from there (executor.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, Task, TaskState

from ...app.types import A2aTaskRecord, A2aTaskTable

FLUSH_S = 0.5


class StoredTasks(TaskStore):
    def __init__(self, table: A2aTaskTable, limit: int) -> None:
        self._table = table
        self._limit = limit
        self._pending: dict[str, A2aTaskRecord] = {}
        """A working task's newest copy, not written yet."""
        self._working: set[str] = set()
        """The tasks last written here as working: their artifacts may wait to be written."""
        self._flushes: set[asyncio.Task[None]] = set()
        self._writing = asyncio.Lock()  # a deferred copy never lands after a newer one

    async def save(self, task: Task, context: ServerCallContext) -> None:
        state = task.status.state
        ended = state in TERMINAL_TASK_STATES
        record = A2aTaskRecord(
            task.id,
            resolve_user_scope(context),
            task.context_id,
            ended,
            time.time_ns() // 1_000_000,
            task.SerializeToString(),
        )
        working = state == TaskState.TASK_STATE_WORKING
        if working and task.id in self._working:
            if task.id not in self._pending:
                flush = asyncio.get_running_loop().create_task(self._flush_later(task.id))
                self._flushes.add(flush)
                flush.add_done_callback(self._flushes.discard)
            self._pending[task.id] = record
            return
        async with self._writing:
            self._pending.pop(task.id, None)
            await self._table.save_a2a_task(record, self._limit)
        if working:
            self._working.add(task.id)
        else:
            self._working.discard(task.id)

    async def _flush_later(self, task_id: str) -> None:
        await asyncio.sleep(FLUSH_S)
        await self._flush(task_id)

    async def _flush(self, task_id: str) -> None:
        async with self._writing:
            record = self._pending.pop(task_id, None)
            if record is not None:
                await self._table.save_a2a_task(record, self._limit)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        """The copy written here last, unless the stored one has ended (on another replica)."""
        record = await self._table.load_a2a_task(task_id)
        if record is None or not record.ended:
            record = self._pending.get(task_id, record)
        if record is None or record.owner != resolve_user_scope(context):
            return None
        return Task.FromString(record.task)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The SDK's filtering and paging, over this owner's tasks as stored (and written since)."""
        owner = resolve_user_scope(context)
        records = {r.id: r for r in await self._table.a2a_tasks_of(owner, params.context_id)}
        for pending in self._pending.values():
            if pending.owner == owner and pending.context_id == (params.context_id or pending.context_id):
                records[pending.id] = pending
        scratch = InMemoryTaskStore(use_copying=False)
        for record in records.values():
            await scratch.save(Task.FromString(record.task), context)
        return await scratch.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        if await self.get(task_id, context) is None:
            return
        async with self._writing:
            self._pending.pop(task_id, None)
            self._working.discard(task_id)
            await self._table.delete_a2a_task(task_id)

    async def aclose(self) -> None:
        """Write what waits to be (at a stop)."""
        for flush in list(self._flushes):
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush
        for task_id in list(self._pending):
            await self._flush(task_id)
