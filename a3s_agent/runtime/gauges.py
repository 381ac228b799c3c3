"""The server's state as metrics' gauges (base/metrics.py): sessions, generations, lanes' queues,
confirmations waiting, subscribers' lag, leases held; read at each collection."""

from __future__ import annotations

from collections.abc import Callable

from ..base import metrics
from ..base.models import SessionState
from .runtime import Runtime


def observe(rt: Runtime) -> None:
    """Register the gauges of `rt` (nothing when metrics are off)."""
    if not metrics.enabled():
        return
    gauges: tuple[tuple[str, str, str, Callable[[], metrics.Reading]], ...] = (
        ("a3s.sessions.active", "{session}", "Active sessions (not paused, completed or failed) here",
         lambda: [(rt.sessions.count(SessionState.ACTIVE), {})]),
        ("a3s.runs.active", "{generation}", "Generations running, or waiting for their session, here",
         lambda: [(rt.agent.active, {})]),
        ("a3s.lane.queue.depth", "{operation}", "Operations waiting for a lane's slot, per lane (a3s.lane)",
         lambda: [(n, {"a3s.lane": lane}) for lane, n in rt.control.queue_depths().items()]),
        ("a3s.confirmations.waiting", "{tool_call}", "Tool calls waiting for a human's confirmation",
         lambda: [(rt.control.confirmations_waiting(), {})]),
        ("a3s.events.subscriber.lag", "{entry}",
         "Committed event-log entries the slowest subscriber has not taken yet",
         lambda: [(rt.events.subscriber_lag(), {})]),
        ("a3s.replica.leases", "{lease}", "Run leases this replica holds",
         lambda: [(rt.replicas.leases_held, {})]),
    )  # fmt: skip
    for name, unit, description, read in gauges:
        metrics.observe(name, unit, description, read)
