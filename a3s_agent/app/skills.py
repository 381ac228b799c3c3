"""Skills: load into and unload from a session, and list them."""

from __future__ import annotations

from ..core.skills.catalog import Listed
from ..runtime import Runtime


class Skills:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def load(self, session_id: str, name: str, content: str | None) -> list[str]:
        """Load a skill by name, or from `content` (SKILL.md text); the names of its tools."""
        await self._rt.sessions.refresh(session_id)
        return await self._rt.skills.load(session_id, name, content)

    async def unload(self, session_id: str, name: str) -> list[str]:
        """The names of the tools removed with the skill (its MCP servers stop unless still used)."""
        await self._rt.sessions.refresh(session_id)
        removed = await self._rt.skills.unload(session_id, name)
        if session_id:
            await self._rt.mcp.session_changed(self._rt.sessions.get(session_id))
        else:
            await self._rt.mcp.server_changed()
        return removed

    async def listing(self, session_id: str | None) -> list[Listed]:
        """The skills on disk (scanned afresh) merged with the session's loaded ones."""
        await self._rt.sessions.refresh(session_id or "")
        session = self._rt.sessions.get(session_id) if session_id else None
        await self._rt.skills.rescan()
        return self._rt.skills.listing(session)
