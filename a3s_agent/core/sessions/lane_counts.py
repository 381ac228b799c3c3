"""How busy a session's lanes are on this replica (GetQueueStats): operations waiting for a lane's
slot, holding one, and finished, completed or failed, since this replica started. Live state only:
nothing here is stored, and each replica counts what it ran."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass


@dataclass
class LaneCount:
    pending: int = 0  # waiting for the lane's slot
    active: int = 0  # holding it
    completed: int = 0
    failed: int = 0


@dataclass
class Held:
    """An operation holding its lane: set `ok` False when it failed without raising."""

    ok: bool = True


class LaneCounts:
    def __init__(self, lanes: Iterable[int]) -> None:
        self._counts = {lane: LaneCount() for lane in lanes}

    def __getitem__(self, lane: int) -> LaneCount:
        return self._counts[lane]

    def finished(self, lane: int, ok: bool) -> None:
        if ok:
            self._counts[lane].completed += 1
        else:
            self._counts[lane].failed += 1

    @contextmanager
    def running(self, lane: int) -> Iterator[Held]:
        """An operation that needs no slot (a control action), active while the block runs; one
        that raises failed."""
        count = self._counts[lane]
        count.active += 1
        held = Held()
        try:
            yield held
        except BaseException:
            held.ok = False
            raise
        finally:
            count.active -= 1
            self.finished(lane, held.ok)

    @asynccontextmanager
    async def holding(self, lane: int, slot: AbstractAsyncContextManager[object]) -> AsyncIterator[Held]:
        """Pending while `slot` (the lane's semaphore, the session's generation lock) is waited
        for, then `running` while it is held."""
        count = self._counts[lane]
        count.pending += 1
        waiting = True
        try:
            async with slot:
                count.pending -= 1
                waiting = False
                with self.running(lane) as held:
                    yield held
        finally:
            if waiting:
                count.pending -= 1
