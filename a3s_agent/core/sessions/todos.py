"""Sessions' todo lists (the `todo` tool's, GetTodos/SetTodos'): kept in the session's settings, so
in its store row, where a restart and every replica find them. A list is replaced whole; each change
is reported by an INFO event (data kind "todos_updated") in the transaction that stores it."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

from ...base.models import Todo
from ...tools.todo import STATUSES, checked_todos
from ..store.events import EventType, event_entry
from ..store.protocol import LogEntry
from .manager import SessionManager

TODOS_UPDATED = "todos_updated"


class TodoLists:
    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions

    async def get(self, session_id: str) -> list[Todo]:
        """The session's list (NotFound for an unknown session)."""
        await self._sessions.refresh(session_id)
        return list(self._sessions.get(session_id).settings.todos)

    async def set(self, session_id: str, todos: list[Todo]) -> list[Todo]:
        """Make `todos` the session's list (InvalidArgument naming the item at fault); the list."""
        checked = checked_todos(todos)
        await self._sessions.refresh(session_id)
        await self._sessions.update_settings(
            session_id, lambda s: replace(s, todos=checked), log=[todos_updated(session_id, checked)]
        )
        return list(checked)


def todos_updated(session_id: str, todos: list[Todo]) -> LogEntry:
    """The event that reports the session's new todo list."""
    counts = Counter(item.status for item in todos)
    data = {
        "kind": TODOS_UPDATED,
        "count": len(todos),
        **{status: counts[status] for status in STATUSES},
        "todos": json.dumps([item.to_json() for item in todos]),
    }
    return event_entry(EventType.INFO, session_id, f"todo list updated: {len(todos)} items", data)
