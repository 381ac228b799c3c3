"""The scheduler's clock: the time, and a sleep until a time that a change of the jobs cuts short.
The server's is the wall clock; a test hands the Runtime one it moves itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch."""

    async def sleep_until(self, when_ms: int, wake: asyncio.Event) -> None:
        """Return at `when_ms`, or sooner when `wake` is set."""


class WallClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep_until(self, when_ms: int, wake: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), max(when_ms - self.now_ms(), 0) / 1000)
