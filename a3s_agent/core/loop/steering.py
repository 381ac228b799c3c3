"""Steering a running generation: a user message sent while the agent works is taken in at the
run's next safe point (after the running tool calls end, before the next model request), and
the run answers it before it ends. The log says when: an INFO event `steer_applied`, and the
run's stream a notice of the same type."""

from __future__ import annotations

from ..sessions.control import Steer
from ..store.events import EventType, event_entry
from ..store.protocol import LogEntry

STEER_APPLIED = "steer_applied"


def steer_notice(steer: Steer) -> dict[str, str]:
    """What the log's event and the run's notice say of a steer taken in."""
    return {"type": STEER_APPLIED, "steer_id": steer.steer_id, "content": steer.message.content}


def steer_applied(session_id: str, steer: Steer) -> LogEntry:
    data = {key: value for key, value in steer_notice(steer).items() if key != "type"}
    return event_entry(EventType.INFO, session_id, STEER_APPLIED, data)
