"""Log lines a flood could multiply (refused requests, failed accepts, refused proxy connections),
rate-limited so that a flood cannot flood the log."""

from __future__ import annotations

import logging
import time

LINES_PER_WINDOW = 10
WINDOW_S = 10.0


class SparseLog:
    """At most LINES_PER_WINDOW lines per WINDOW_S on `logger`; the first line after a window
    that left some out says how many ("%d more <what> in the last 10 s")."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        lines_per_window: int = LINES_PER_WINDOW,
        window_s: float = WINDOW_S,
    ) -> None:
        self._logger = logger
        self._what = what
        self._limit = lines_per_window
        self._window_s = window_s
        self._window_start = 0.0
        self._logged = 0
        self._suppressed = 0

    def log(self, level: int, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window_start >= self._window_s:
            if self._suppressed:
                self._logger.log(
                    level, "%d more %s in the last %.0f s", self._suppressed, self._what, self._window_s
                )
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < self._limit:
            self._logged += 1
            self._logger.log(level, message, *args)
        else:
            self._suppressed += 1
