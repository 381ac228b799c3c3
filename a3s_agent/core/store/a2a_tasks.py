"""The A2A tasks the A2A face keeps (faces/a2a/tasks.py), in the session store's database so that a
task outlives the server that took its first message and any replica answers for it. The task is
the face's to encode: the store keeps its bytes with what it is found and pruned by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

COLUMNS = "id, owner, context_id, ended, updated_at, task"
REPLACED = ", ".join(f"{column} = excluded.{column}" for column in COLUMNS.split(", ")[1:])
"""The SET list of an upsert of COLUMNS: all but the id."""


@dataclass(frozen=True)
class A2aTaskRecord:
    id: str
    owner: str
    """Who may read it: the SDK's owner of the call that saved it."""
    context_id: str
    ended: bool
    """In a terminal state: it may be pruned (a task still going never is)."""
    updated_at: int
    task: bytes

    def row(self) -> tuple[Any, ...]:
        """The values of COLUMNS."""
        return (self.id, self.owner, self.context_id, self.ended, self.updated_at, self.task)


def record_of(row: tuple[Any, ...]) -> A2aTaskRecord:
    """A record from the values of COLUMNS."""
    task_id, owner, context_id, ended, updated_at, task = row
    return A2aTaskRecord(task_id, owner, context_id, bool(ended), updated_at, bytes(task))


class A2aTaskTable(Protocol):
    async def save_a2a_task(self, record: A2aTaskRecord, keep: int) -> None:
        """Insert or replace the task, unless the one stored has ended (an ended task is final:
        a copy of it still going, written late by another replica, never brings it back); then,
        past `keep` tasks, forget the oldest ended ones."""
        ...

    async def load_a2a_task(self, task_id: str) -> A2aTaskRecord | None: ...

    async def a2a_tasks_of(self, owner: str, context_id: str) -> list[A2aTaskRecord]:
        """The tasks of `owner` (in context `context_id`; "": in any), newest first."""
        ...

    async def delete_a2a_task(self, task_id: str) -> None: ...
