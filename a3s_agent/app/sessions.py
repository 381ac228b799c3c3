"""Sessions: create, read, configure, list and destroy, with their compaction settings and token
budgets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..base.errors import NotFound
from ..base.memories import MemorySettings
from ..base.models import Message, SessionConfig
from ..core.loop.context import ContextUsage
from ..core.sessions.control import ConfirmationPolicy
from ..core.sessions.manager import listing_key
from ..core.store.session import Session, SessionSettings
from ..runtime import Runtime
from ..runtime.mcp import ServersGiven

__all__ = ["PageKey", "ServersGiven", "SessionPage", "SessionView", "Sessions"]

PageKey = tuple[int, str]
"""Where a listing resumes: the key (created_at, id) of the last session already listed."""


@dataclass(frozen=True)
class SessionView:
    """A session as replies show it: with its context usage (an estimate while the tokenizer loads:
    `usage.estimated`), compaction (threshold, target) and the token budget that applies to it
    (0: none; its usage so far is `session.usage`)."""

    session: Session
    usage: ContextUsage
    compaction: tuple[float, float]
    token_budget: int
    memory: MemorySettings
    """What its model gets of memories (its own setting, else the server's)."""


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
        token_budget: int | None = None,
        mcp_servers: ServersGiven | None = None,
        memory: MemorySettings | None = None,
    ) -> SessionView:
        """`compaction`: the session's own compaction shares (none: the server's); `token_budget`:
        its own cap on its total tokens (None: the server's, 0: none); `mcp_servers`: its own MCP
        servers (runtime/mcp.py); `memory`: what its model gets of memories (None: the server's)."""
        checked = self._rt.context.checked_settings({}, compaction) if compaction else {}
        servers = self._rt.mcp.from_api(mcp_servers)
        session = await self._rt.sessions.create(
            session_id,
            config,
            initial_context,
            settings=SessionSettings(
                compaction=checked, token_budget=token_budget, mcp_servers=servers, memory=memory
            ),
        )
        return await self._view(session)

    async def ensure(
        self, session_id: str, config: SessionConfig, confirmation: ConfirmationPolicy | None = None
    ) -> bool:
        """Create the session `session_id` with `config` (and `confirmation`, when given) unless it
        exists; whether it was created."""
        await self._rt.sessions.refresh(session_id)
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
        await self._rt.sessions.refresh(session_id)
        await self._rt.sessions.append_messages(session_id, messages)

    async def get(self, session_id: str) -> SessionView:
        await self._rt.sessions.refresh(session_id)
        return await self._view(self._rt.sessions.get(session_id))

    async def configure(
        self,
        session_id: str,
        config: SessionConfig,
        *,
        replace_all: bool,
        compaction: Mapping[str, float],
        token_budget: int | None = None,
        mcp_servers: ServersGiven | None = None,
        memory: MemorySettings | None = None,
    ) -> SessionView:
        """Merge `config` (or with `replace_all`, replace the config, compaction shares, token
        budget, MCP servers and memory settings); `token_budget` None keeps the session's (with
        `replace_all`: the server's); `mcp_servers` replaces the session's own servers, None keeps
        them (with `replace_all`: none); `memory` None keeps the session's (with `replace_all`:
        the server's)."""
        await self._rt.sessions.refresh(session_id)
        given_servers = (
            None if mcp_servers is None and not replace_all else self._rt.mcp.from_api(mcp_servers)
        )

        def configured(current: SessionSettings) -> SessionSettings:
            checked = self._rt.context.checked_settings({} if replace_all else current.compaction, compaction)
            budget = current.token_budget if token_budget is None and not replace_all else token_budget
            servers = current.mcp_servers if given_servers is None else given_servers
            kept = current.memory if memory is None and not replace_all else memory
            return replace(current, compaction=checked, token_budget=budget, mcp_servers=servers, memory=kept)

        session = await self._rt.sessions.configure(
            session_id, config, replace_all=replace_all, settings=configured
        )
        await self._rt.mcp.session_changed(session)
        return await self._view(session)

    async def destroy(self, session_id: str) -> None:
        """NotFound for an unknown session; a running generation stops with its session, and the
        sessions of its subagents go with it."""
        await self._rt.sessions.refresh(session_id)
        self._rt.sessions.get(session_id)
        await self._rt.sessions.refresh_all()  # (on a shared store: children other replicas made)
        for child in self._rt.sessions.children(session_id):
            await self.destroy(child.id)
        self._rt.control.forget(session_id)
        await self._rt.checkpoints.forget(session_id)  # its checkpoints, and the trees only they named
        await self._rt.sessions.destroy(session_id)
        await self._rt.mcp.session_ended(session_id)  # its MCP servers stop
        self._rt.sandbox.forget_session(session_id)  # the HOME its commands had goes too

    async def release(self, session_id: str) -> None:
        """Stop what the session holds open (its own MCP servers) without destroying it: what it
        needs starts again when it runs next. NotFound for an unknown session."""
        await self._rt.sessions.refresh(session_id)
        self._rt.sessions.get(session_id)
        await self._rt.mcp.session_ended(session_id)

    async def page(self, after: PageKey | None, size: int, workspace: str | None = None) -> SessionPage:
        """Up to `size` sessions after `after`, oldest first, without reading any history; with
        `workspace`, only the sessions that work in that directory."""
        await self._rt.sessions.refresh_all()
        if workspace is None:
            sessions, more = self._rt.sessions.page(after, size)
            return SessionPage(sessions, listing_key(sessions[-1]) if more else None)
        target = _resolved(workspace)
        rest, _ = self._rt.sessions.page(after, len(self._rt.sessions))
        matching = [s for s in rest if s.config.workspace == target]
        page = matching[:size]
        return SessionPage(page, listing_key(page[-1]) if len(matching) > size else None)

    async def history(self, session_id: str) -> list[Message]:
        """The live history, oldest first: what the model is sent next (compaction and clearing
        archive the rest)."""
        await self._rt.sessions.refresh(session_id)
        return await self._rt.sessions.history(session_id)

    async def _view(self, session: Session) -> SessionView:
        return SessionView(
            session,
            await self._rt.context.shown_usage(session.id),
            self._rt.context.shares(session),
            self._rt.token_budget_for(session),
            self._rt.memory_settings_for(session),
        )


def _resolved(path: str) -> str:
    return str(Path(path).resolve())
