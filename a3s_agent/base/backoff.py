"""Exponential backoff with jitter, for whatever retries a connection: the LLM provider's
requests and the coven face's reconnects. It depends on nothing else in the package."""

from __future__ import annotations

import random


class Backoff:
    """Delays that start at `initial_s` and double after each one, capped at `max_s`; each is cut
    by a random fraction of at most `jitter`, so clients failing together do not retry together."""

    def __init__(self, initial_s: float, max_s: float, *, jitter: float) -> None:
        self._initial = initial_s
        self._max = max_s
        self._jitter = jitter
        self._next = initial_s

    def reset(self) -> None:
        """Start again from the first delay (after a success)."""
        self._next = self._initial

    def next_s(self) -> float:
        """The next delay, in seconds."""
        delay = self._next * (1 - self._jitter * random.random())
        self._next = min(self._next * 2, self._max)
        return delay
