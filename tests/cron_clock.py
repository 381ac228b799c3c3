"""A clock the cron tests move themselves (the Runtime's `clock`): time passes only when a test says,
and `move_to` returns once every scheduler has made a round that began at the new time (a round
begins with the scheduler reading the clock, ends with its sleep), so a test asserts what the
schedulers did, never how long they took. A scheduler sleeps until its next due time or for at most
MAX_IDLE_MS: a move short of that wakes none, and `move_to` says so by failing."""

from __future__ import annotations

import asyncio

from .conftest import eventually


class ManualClock:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms
        self._moves = 0  # how often the time was set
        self._moved = asyncio.Event()
        self._began: dict[int, int] = {}  # by task: the move its current round began after
        self._looked: dict[int, int] = {}  # by scheduler loop (task): the move its last round began after
        self._sleeping: set[int] = set()

    def now_ms(self) -> int:
        self._began.setdefault(id(asyncio.current_task()), self._moves)
        return self.now

    async def sleep_until(self, when_ms: int, wake: asyncio.Event) -> None:
        task = id(asyncio.current_task())
        self._looked[task] = self._began.pop(task, self._moves)
        self._sleeping.add(task)
        try:
            while self.now < when_ms and not wake.is_set():
                waits = [asyncio.ensure_future(self._moved.wait()), asyncio.ensure_future(wake.wait())]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiting in waits:
                        waiting.cancel()
        finally:
            self._sleeping.discard(task)

    async def running(self, schedulers: int = 1) -> None:
        """Wait until `schedulers` scheduler loops have made their first round and sleep."""
        await eventually(
            lambda: len(self._looked) >= schedulers and len(self._sleeping) >= schedulers,
            f"{schedulers} cron scheduler(s) asleep",
        )

    async def move_to(self, now_ms: int) -> None:
        """Set the time; return once every scheduler loop has made a round at it and sleeps again."""
        loops = set(self._looked)
        self._moves += 1
        self.now = now_ms
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
        await eventually(
            lambda: all(self._looked[loop] >= self._moves for loop in loops) and self._sleeping >= loops,
            "every cron scheduler's round at the new time",
        )
