"""A session's context: usage, compaction, clearing."""

from __future__ import annotations

from ..core.loop import spans
from ..core.loop.context import Compaction, ContextUsage
from ..runtime import Runtime


class Context:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def usage(self, session_id: str) -> ContextUsage:
        await self._rt.sessions.refresh(session_id)
        return await self._rt.context.usage(session_id)

    def window(self, session_id: str) -> int:
        """The session's context window in tokens: its max_context_length, else its model's."""
        return self._rt.context.window(self._rt.sessions.get(session_id))

    async def compact(self, session_id: str) -> Compaction:
        """Compact now, as a client asks (a session within the target too: all but its recent turns
        are summarised), after any running generation of the session (on any replica)."""
        await self._rt.sessions.refresh(session_id)
        session = self._rt.sessions.get(session_id)
        async with self._rt.sessions.generation_lock(session_id), self._rt.own_run(session_id, "compaction"):
            compacting = self._rt.context.compact(session_id, requested=True)
            return await spans.compacted(None, session, "requested", compacting)  # under the call's span

    async def clear(self, session_id: str) -> None:
        """Empty the history, after any running generation of the session (on any replica)."""
        await self._rt.sessions.refresh(session_id)
        async with self._rt.sessions.generation_lock(session_id), self._rt.own_run(session_id, "clearing"):
            await self._rt.sessions.replace_history(session_id, [])
