"""One WARNING line per refused request, rate-limited so that a flood cannot flood the log."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("a3s_agent.security")

LINES_PER_WINDOW = 10
WINDOW_S = 10.0


class RefusalLog:
    """Logs refused attempts (peer, method, why): at most LINES_PER_WINDOW lines per WINDOW_S,
    then one line saying how many more were refused in that window. The server makes one and
    hands it to every face, so a flood on one face cannot hide refusals on another."""

    def __init__(self, lines_per_window: int = LINES_PER_WINDOW, window_s: float = WINDOW_S) -> None:
        self._limit = lines_per_window
        self._window_s = window_s
        self._window_start = 0.0
        self._logged = 0
        self._suppressed = 0

    def refused(self, peer: str, method: str, why: str) -> None:
        now = time.monotonic()
        if now - self._window_start >= self._window_s:
            if self._suppressed:
                log.warning("%d more requests refused in the last %.0f s", self._suppressed, self._window_s)
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < self._limit:
            self._logged += 1
            log.warning("refused %s from %s: %s", method, peer or "unknown peer", why)
        else:
            self._suppressed += 1
