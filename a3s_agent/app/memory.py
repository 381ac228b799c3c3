"""Memories (A3S's memory group): a session stores, reads, searches, counts, clears and deletes
them (core/sessions/memories.py keeps them; base/memories.py says who sees which), and has its
model condense them into one summary memory. The domain types are base/memories.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..base.memories import MAX_TAGS, Memory, MemoryQuery, MemoryStats, MemoryType, checked_limit
from ..core.loop.memory_summary import required_model, summarize_memories
from ..core.store.events import now_ms
from ..runtime import Runtime

SUMMARY_TAG = "summary"
DEFAULT_SUMMARY_LIMIT = 50
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class MemorySummary:
    summary: str
    memory_count: int
    """How many memories the summary condenses (0: none matched, nothing was asked of the model)."""
    memory: Memory | None
    """The summary as kept: a semantic memory tagged `summary`."""


class Memories:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def store(
        self,
        session_id: str,
        content: str,
        memory_type: MemoryType,
        importance: float,
        tags: Sequence[str],
        metadata: Mapping[str, str],
        timestamp: int = 0,
    ) -> Memory:
        """Keep a memory (InvalidArgument names the field at fault: content that looks like a
        secret is one); NotFound for an unknown session."""
        return await self._rt.memories.remember(
            session_id, content, memory_type, importance, tags, metadata, timestamp
        )

    async def retrieve(self, session_id: str, memory_id: str) -> Memory | None:
        """The memory, its access counted, or None when the session sees none of that id."""
        return await self._rt.memories.retrieve(session_id, memory_id)

    async def search(self, session_id: str, query: MemoryQuery) -> tuple[list[Memory], int]:
        """The best matches, best first, and how many matched in all."""
        return await self._rt.memories.search(session_id, query)

    async def stats(self, session_id: str) -> MemoryStats:
        return await self._rt.memories.stats(session_id)

    async def clear(self, session_id: str, long_term: bool, short_term: bool, working: bool) -> int:
        """How many memories were cleared; InvalidArgument when no tier is named."""
        return await self._rt.memories.clear(session_id, long_term, short_term, working)

    async def delete(self, session_id: str, memory_id: str) -> bool:
        """False when the session sees no memory of that id."""
        return await self._rt.memories.delete(session_id, memory_id)

    async def summarize(
        self, session_id: str, tags: Sequence[str], limit: int, recent_hours: int | None
    ) -> MemorySummary:
        """The session's model condenses the memories it sees (those carrying any of `tags`, of the
        last `recent_hours`, the best `limit`) into one note, kept as a semantic memory tagged
        `summary` (and `tags`). FailedPrecondition without a model, as Generate."""
        await self._rt.sessions.refresh(session_id)
        required_model(self._rt, self._rt.sessions.get(session_id))
        since = None if recent_hours is None else now_ms() - recent_hours * HOUR_MS
        limit = checked_limit(limit, "limit") if limit else DEFAULT_SUMMARY_LIMIT
        found, _ = await self._rt.memories.search(
            session_id, MemoryQuery(tags=tuple(tags), since=since, limit=limit)
        )
        if not found:
            return MemorySummary("", 0, None)
        session = self._rt.sessions.get(session_id)
        summary = await summarize_memories(self._rt, self._rt.sessions, session, found)
        kept = await self._rt.memories.remember(
            session_id,
            summary,
            MemoryType.SEMANTIC,
            max(memory.importance for memory in found),
            [SUMMARY_TAG, *tags][:MAX_TAGS],
            {"summarized": str(len(found))},
            where="summary",
        )
        return MemorySummary(summary, len(found), kept)
