"""Sessions: create, read, configure, list and destroy, with their compaction settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..base.errors import NotFound
from ..base.models import Message, SessionConfig
from ..core.context import ContextUsage
from ..core.control import ConfirmationPolicy
from ..core.session import Session, SessionSettings
from ..core.sessions import listing_key
from ..runtime import Runtime

PageKey = tuple[int, str]
"""Where a listing resumes: the key (created_at, id) of the last session already listed."""


@dataclass(frozen=True)
class SessionView:
    """A session as replies show it: with its context usage and compaction (threshold, target)."""

    session: Session
    usage: ContextUsage
    compaction: tuple[float, float]


@dataclass(frozen=True)
class SessionPage:
    sessions: list[Session]
    next_after: PageKey | None
    """The key to resume after, when more sessions follow."""


class Sessions:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def create(
        self,
        session_id: str | None,
        config: SessionConfig,
        initial_context: list[Message],
        compaction: Mapping[str, float],
    ) -> SessionView:
        """`compaction`: the session's own compaction shares (none: the server's)."""
        checked = self._rt.context.checked_settings({}, compaction) if compaction else None
        session = await self._rt.sessions.create(
            session_id,
            config,
            initial_context,
            settings=SessionSettings(compaction=checked) if checked is not None else None,
        )
        return await self._view(session)

    async def ensure(
        self, session_id: str, config: SessionConfig, confirmation: ConfirmationPolicy | None = None
    ) -> bool:
        """Create the session `session_id` with `config` (and `confirmation`, when given) unless it
        exists; whether it was created."""
        try:
            self._rt.sessions.get(session_id)
            return False
        except NotFound:
            pass
        await self._rt.sessions.create(session_id, config, [])
        if confirmation is not None:
            await self._rt.control.set_confirmation_policy(session_id, confirmation)
        return True

    async def append(self, session_id: str, messages: list[Message]) -> None:
        """Add messages to the history as they are (no generation answers them)."""
        await self._rt.sessions.append_messages(session_id, messages)

    async def get(self, session_id: str) -> SessionView:
        return await self._view(self._rt.sessions.get(session_id))

    async def configure(
        self,
        session_id: str,
        config: SessionConfig,
        *,
        replace_all: bool,
        compaction: Mapping[str, float],
    ) -> SessionView:
        """Merge `config` (or with `replace_all`, replace the config and compaction shares)."""
        current = self._rt.sessions.get(session_id).settings
        checked = self._rt.context.checked_settings({} if replace_all else current.compaction, compaction)
        session = await self._rt.sessions.configure(
            session_id, config, replace_all=replace_all, settings=replace(current, compaction=checked)
        )
        return await self._view(session)

    async def destroy(self, session_id: str) -> None:
        """NotFound for an unknown session; a running generation stops with its session."""
        self._rt.sessions.get(session_id)
        self._rt.control.forget(session_id)
        await self._rt.sessions.destroy(session_id)

    def page(self, after: PageKey | None, size: int) -> SessionPage:
        """Up to `size` sessions after `after`, oldest first, without reading any history."""
        sessions, more = self._rt.sessions.page(after, size)
        return SessionPage(sessions, listing_key(sessions[-1]) if more else None)

    async def _view(self, session: Session) -> SessionView:
        return SessionView(
            session, await self._rt.context.usage(session.id), self._rt.context.shares(session)
        )
