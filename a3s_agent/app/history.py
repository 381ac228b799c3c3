"""A session's history read in pages, and a stored session made ready again (A3S's GetMessages and
RestoreSession)."""

from __future__ import annotations

from dataclasses import dataclass

from ..base.models import Message
from ..runtime import Runtime


@dataclass(frozen=True)
class HistoryPage:
    messages: list[Message]
    """The live history from `offset` on (compaction and clearing archive what came before)."""
    offset: int
    total: int
    """Messages in the live history."""
    updated_at: int
    """The session's last change, Unix ms: the store keeps no time per message."""


class History:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def page(self, session_id: str, offset: int, limit: int | None) -> HistoryPage:
        """Up to `limit` messages (None: all) from position `offset`; NotFound for an unknown session."""
        messages = await self._history(session_id)
        end = len(messages) if limit is None else offset + limit
        updated_at = self._rt.sessions.get(session_id).updated_at
        return HistoryPage(messages[offset:end], offset, len(messages), updated_at)

    async def restore(self, session_id: str) -> int:
        """Load a stored session's history (sessions outlive restarts: there is nothing else to
        bring back); its message count. NotFound when no session is stored under `session_id`."""
        return len(await self._history(session_id))

    async def _history(self, session_id: str) -> list[Message]:
        await self._rt.sessions.refresh(session_id)
        return await self._rt.sessions.history(session_id)
