"""What the harness keeps of each run (app/harness.py): its record in the store, and in memory
which entries of the session's log are its events and the task that runs it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ..core.events import now_ms

TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass
class EventItem:
    """One event of a run: the chunk at `log_seq` of the session's log, or one made here (`made`,
    recorded at `at`; agent_start shares its seq with the run's first chunk)."""

    log_seq: int | None
    made: tuple[str, dict[str, Any]] | None = None
    at: int = 0


@dataclass
class RunRecord:
    """A run: `record()` is what the store keeps of it, the rest is found again from the log."""

    session_id: str  # ours
    run_id: str
    prompt: str
    workspace: str
    after_seq: int = 0  # the session log's last seq when the run was admitted
    updated_at: int = field(default_factory=now_ms)
    state: str = "created"
    chunk_run: str = ""  # the run id of its chunks in the log (runtime/runs.py)
    failure: str = ""  # why it failed before its first chunk
    base_tree: str | None = None
    result_tree: str | None = None
    captured_at: int = 0  # when the change set was captured (0: not yet, or never)
    items: list[EventItem] = field(default_factory=list)
    patch: bytes | None = None
    cancel_asked: bool = False
    task: asyncio.Task[None] | None = None  # None: not live here (a record of an earlier process)

    def touch(self, state: str | None = None) -> None:
        if state is not None and self.state not in TERMINAL:
            self.state = state
        self.updated_at = max(now_ms(), self.updated_at)

    def observed(self) -> int:
        return max(now_ms(), self.updated_at)

    @property
    def live(self) -> bool:
        return self.task is not None and not self.task.done()

    def record(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "workspace": self.workspace,
            "after_seq": self.after_seq,
            "updated_at": self.updated_at,
            "state": self.state,
            "chunk_run": self.chunk_run,
            "failure": self.failure,
            "base_tree": self.base_tree,
            "result_tree": self.result_tree,
            "captured_at": self.captured_at,
        }

    @classmethod
    def from_record(cls, session_id: str, run_id: str, record: dict[str, Any]) -> RunRecord:
        return cls(session_id, run_id, **record)


@dataclass
class Registry:
    """The runs of one runtime known in this process, and the tasks that run them here."""

    runs: dict[tuple[str, str], RunRecord] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def stop(self) -> None:
        """Cancel what the runs still do here (their generations have stopped: a capture)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
