"""What the harness keeps of each run (app/harness.py): its record in the store, and in memory
which entries of the session's log are its events and the task that runs it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ..core.store.events import now_ms
from .harness_events import SUBAGENT_END

TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass
class EventItem:
    """One event of a run: the chunk at `log_seq` of the session's log, or one made here (`made`,
    recorded at `at`; agent_start shares its seq with the run's first chunk)."""

    log_seq: int | None
    made: tuple[str, dict[str, Any]] | None = None
    at: int = 0
    answer_seq: int | None = None
    """A `subagent_end`'s: the result of its `task` call, whose output is the child's answer."""


MODEL_KINDS = frozenset({"text", "thinking", "tool_call", "turn"})
"""The chunks a model call writes (harness_events.entry_kind): the first one opens a turn."""


@dataclass
class Turn:
    """Where a run is in A3S's turns as its chunks come in (RunRecord.add_chunk)."""

    number: int = 0  # of the last turn opened, from 1
    open: bool = False
    calls: int = 0  # tool calls of the open turn without a result yet
    end: int | None = None  # the seq of its turn chunk, once its model call is over


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
    turn: Turn = field(default_factory=Turn)
    ending: dict[str, int] = field(default_factory=dict)  # subagent_end seqs by task call, held

    def add_chunk(self, seq: int, kind: str, call_id: str = "") -> None:
        """The chunk at `seq` of the run (of `kind`, about the call `call_id`: harness_events
        entry_kind and entry_call) as its next events, in the order of the protocol's section 5:
        `agent_start` first; `turn_start` before a model call's first chunk; the turn's tool calls
        and their results; then `turn_end`. Our turn chunk comes when the model call ends, before
        its tools run, so it is held until the last of their results; the run's end closes a turn
        still open. A subagent's `subagent_end` is held until its `task` call's result, which
        holds the child's answer (its `output`), and comes right before that call's `tool_end`."""
        if not self.items:
            self.items.append(EventItem(seq, ("agent_start", {"prompt": self.prompt})))
        turn = self.turn
        if kind in MODEL_KINDS and not turn.open:
            turn.number, turn.open = turn.number + 1, True
            self.items.append(EventItem(seq, ("turn_start", {"turn": turn.number})))
        if kind == "turn":
            turn.end = seq
        elif kind == SUBAGENT_END:
            self.ending[call_id] = seq
        else:
            if kind in ("done", "failed"):
                self.items.extend(EventItem(held) for held in self.ending.values())
                self.ending.clear()
                self._close_turn()
            if kind == "tool_result" and call_id in self.ending:
                self.items.append(EventItem(self.ending.pop(call_id), answer_seq=seq))
            self.items.append(EventItem(seq))
            turn.calls += {"tool_call": 1, "tool_result": -1}.get(kind, 0)
        if turn.end is not None and turn.calls <= 0:
            self._close_turn()

    def _close_turn(self) -> None:
        """`turn_end` for the open turn, if its model call ended (a failed one has no turn chunk)."""
        if self.turn.end is not None:
            self.items.append(EventItem(self.turn.end))
        self.turn = Turn(self.turn.number)

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
