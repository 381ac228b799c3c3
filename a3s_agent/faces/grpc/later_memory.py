"""The memory group of the later dialect (a3s-string-dialect.md 4.6): each RPC a conversion of
code_agent_later_pb2's messages around one call of `app.memory` (app/memory.py says what they do).

As the messages say: a memory the session does not see is an answer without `memory`
(RetrieveMemory) or `success=false` (DeleteMemory), not an error; an unknown session is NOT_FOUND.
"""

from __future__ import annotations

from typing import Any

from ...app import Application
from ...base.errors import InvalidArgument
from ...base.memories import Memory, MemoryQuery
from ...proto import code_agent_later_pb2 as later
from ..later_service import memory_item, memory_type
from .errors import rpc


class LaterMemoryService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def StoreMemory(self, request: later.StoreMemoryRequest, context: Any) -> later.StoreMemoryResponse:
        if not request.HasField("memory"):
            raise InvalidArgument("memory is required")
        item = request.memory
        memory = await self.app.memory.store(
            request.session_id,
            item.content,
            memory_type(item.memory_type),
            item.importance,
            list(item.tags),
            dict(item.metadata),
            item.timestamp,
        )
        return later.StoreMemoryResponse(success=True, memory_id=memory.id)

    @rpc
    async def RetrieveMemory(
        self, request: later.RetrieveMemoryRequest, context: Any
    ) -> later.RetrieveMemoryResponse:
        found = await self.app.memory.retrieve(request.session_id, request.memory_id)
        return later.RetrieveMemoryResponse(memory=None if found is None else _item(found))

    @rpc
    async def SearchMemories(
        self, request: later.SearchMemoriesRequest, context: Any
    ) -> later.SearchMemoriesResponse:
        query = MemoryQuery(
            text=request.query if request.HasField("query") else "",
            tags=tuple(request.tags),
            min_importance=request.min_importance if request.HasField("min_importance") else None,
            recent_only=request.recent_only,
            limit=request.limit,
        )
        found, total = await self.app.memory.search(request.session_id, query)
        return later.SearchMemoriesResponse(memories=[_item(memory) for memory in found], total_count=total)

    @rpc
    async def GetMemoryStats(
        self, request: later.GetMemoryStatsRequest, context: Any
    ) -> later.GetMemoryStatsResponse:
        stats = await self.app.memory.stats(request.session_id)
        return later.GetMemoryStatsResponse(
            stats=later.MemoryStats(
                long_term_count=stats.long_term,
                short_term_count=stats.short_term,
                working_count=stats.working,
            )
        )

    @rpc
    async def ClearMemories(
        self, request: later.ClearMemoriesRequest, context: Any
    ) -> later.ClearMemoriesResponse:
        count = await self.app.memory.clear(
            request.session_id, request.clear_long_term, request.clear_short_term, request.clear_working
        )
        return later.ClearMemoriesResponse(success=True, cleared_count=count)

    @rpc
    async def DeleteMemory(
        self, request: later.DeleteMemoryRequest, context: Any
    ) -> later.DeleteMemoryResponse:
        return later.DeleteMemoryResponse(
            success=await self.app.memory.delete(request.session_id, request.memory_id)
        )

    @rpc
    async def SummarizeMemories(
        self, request: later.SummarizeMemoriesRequest, context: Any
    ) -> later.SummarizeMemoriesResponse:
        hours = request.recent_hours if request.HasField("recent_hours") else None
        done = await self.app.memory.summarize(request.session_id, list(request.tags), request.limit, hours)
        return later.SummarizeMemoriesResponse(
            summary=done.summary,
            memory_count=done.memory_count,
            stored=done.memory is not None,
            summary_memory_id=done.memory.id if done.memory is not None else "",
        )


def _item(memory: Memory) -> later.MemoryItem:
    return later.MemoryItem(**memory_item(memory))
