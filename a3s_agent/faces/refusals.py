"""Refused requests, logged rate-limited (base/sparse_log.py) so that a flood cannot flood the log."""

from __future__ import annotations

import logging

from ..base.sparse_log import SparseLog

log = logging.getLogger("a3s_agent.security")


class RefusalLog:
    """Logs refused attempts (peer, method, why) sparsely. The server makes one and hands it to
    every face, so a flood on one face cannot hide refusals on another."""

    def __init__(self) -> None:
        self._lines = SparseLog(log, "requests refused")

    def refused(self, peer: str, method: str, why: str) -> None:
        self._lines.log(logging.WARNING, "refused %s from %s: %s", method, peer or "unknown peer", why)
