"""Where the server is in its life, shared by every face: starting, ready (every configured face
listens), stopping. It also keeps the calls in flight, which a graceful stop waits for up to the
grace period and then cancels, so that each face can tell its client why the call ended."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..app.lifecycle import Lifecycle

log = logging.getLogger(__name__)

CANCEL_WAIT_S = 5.0
"""How long the cancelled calls may take to end (tools killed, histories written) after the grace."""
STARTING = "the server is starting: try again once its health check says SERVING"
STOPPING = "the server is shutting down: it takes no new work"


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


class Readiness:
    """The phase (stopping = the lifecycle's, which HealthCheck reads too) and the calls in flight."""

    def __init__(self, lifecycle: Lifecycle, *, ready: bool = False) -> None:
        self._lifecycle = lifecycle
        self._ready = ready
        self._calls: set[asyncio.Task[object]] = set()
        self._stopped: set[asyncio.Task[object]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.stop_message = ""

    @property
    def phase(self) -> Phase:
        if self._lifecycle.stopping:
            return Phase.STOPPING
        return Phase.READY if self._ready else Phase.STARTING

    def mark_ready(self) -> None:
        """Every configured face listens."""
        self._ready = True

    def begin_stop(self) -> None:
        self._lifecycle.begin_stop()

    def refusal(self) -> str:
        """Why a new call is refused now (UNAVAILABLE / 503)."""
        return STARTING if self.phase is Phase.STARTING else STOPPING

    @contextmanager
    def tracking(self) -> Iterator[None]:
        """Count the current task as a call in flight while the block runs."""
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        self._idle.clear()
        try:
            yield
        finally:
            self._calls.discard(task)
            self._stopped.discard(task)
            if not self._calls:
                self._idle.set()

    def took_back_stop(self) -> bool:
        """Inside a call that caught CancelledError: True, and the cancellation taken back, when the
        server's stop cancelled it (so that the face can end the call with `stop_message`);
        False when it was something else (the client went away), which must propagate."""
        task = asyncio.current_task()
        if task is None or task not in self._stopped:
            return False
        self._stopped.discard(task)
        task.uncancel()
        return True

    async def drain(self, grace_s: float) -> int:
        """Wait up to `grace_s` for the calls in flight, then cancel those left and wait (bounded)
        for them to end. Returns how many were cancelled."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            pass
        left = set(self._calls)
        self.stop_message = f"the server stopped: the call was cancelled at the end of the {grace_s:g} s shutdown grace period"
        for task in left:
            self._stopped.add(task)
            task.cancel(self.stop_message)
        if left:
            try:
                await asyncio.wait_for(self._idle.wait(), CANCEL_WAIT_S)
            except TimeoutError:
                log.warning(
                    "%d calls had not ended %.0f s after they were cancelled", len(self._calls), CANCEL_WAIT_S
                )
        return len(left)
