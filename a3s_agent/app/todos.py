"""Todo lists: a session's, as GetTodos/SetTodos read and replace it (core/sessions/todos.py keeps them)."""

from __future__ import annotations

from ..base.models import Todo
from ..runtime import Runtime


class Todos:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def get(self, session_id: str) -> list[Todo]:
        """The session's list, in order; NotFound for an unknown session."""
        return await self._rt.todos.get(session_id)

    async def set(self, session_id: str, todos: list[Todo]) -> list[Todo]:
        """Replace the session's list and return it; InvalidArgument names the item at fault,
        NotFound an unknown session."""
        return await self._rt.todos.set(session_id, todos)
