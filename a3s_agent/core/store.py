"""The store interface: durable sessions, their configuration and their messages.

One implementation today (SQLite, `sqlite_store.py`); the protocol is the seam for
another backend (PostgreSQL) when one machine is outgrown.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..base.models import Message, Usage
from ..core.session import Session


class Store(Protocol):
    backend: str
    durability: str  # how commits are synced once open: "full" survives a power loss, "normal" a crash

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def create_session(self, session: Session, messages: list[Message]) -> None:
        """Store a new session and its initial messages in one transaction.

        Raises AlreadyExists when the id is taken."""

    async def list_sessions(self) -> list[Session]:
        """Every session's header (config, state, usage, message count: no messages), oldest first."""

    async def update_session(self, session: Session) -> None:
        """Persist config, state, timestamps and usage of an existing session."""

    async def delete_session(self, session_id: str) -> bool:
        """Remove a session and its messages; False when it did not exist."""

    async def append_messages(
        self, session_id: str, messages: list[Message], updated_at: int, usage: Usage | None = None
    ) -> None:
        """Append messages to a session's live history, and set its usage totals when given,
        in one transaction."""

    async def replace_history(self, session_id: str, messages: list[Message], updated_at: int) -> None:
        """Archive the live history (kept, no longer loaded) and store `messages` as the new one,
        in one transaction."""

    async def load_messages(self, session_id: str) -> list[Message]:
        """The live (not archived) history of a session, in order."""

    async def load_archived(self, session_id: str) -> list[Message]:
        """The archived messages of a session (taken out by compaction or clearing), in order."""

    async def save_initialization(self, data: dict[str, Any]) -> None:
        """Replace the stored Initialize configuration (JSON-ready, holding no secret), in one
        transaction."""

    async def load_initialization(self) -> dict[str, Any] | None:
        """The stored Initialize configuration, or None when no Initialize was ever stored."""
