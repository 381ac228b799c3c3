"""The later dialect's memory group over HTTP, as faces/grpc/later_memory.py serves it over gRPC."""

from __future__ import annotations

from ...app import Application
from ...base.errors import InvalidArgument
from ...base.memories import MemoryQuery
from ..later_service import memory_item, memory_type
from .convert import Given, Plain
from .rpc_table import Handlers

HANDLERS = Handlers()


@HANDLERS.rpc("StoreMemory")
async def _store(app: Application, request: Given) -> Plain:
    item = request["memory"]
    if item is None:
        raise InvalidArgument("memory is required")
    memory = await app.memory.store(
        request["session_id"],
        item["content"],
        memory_type(item["memory_type"]),
        item["importance"],
        list(item["tags"]),
        dict(item["metadata"]),
        item["timestamp"],
    )
    return {"success": True, "memory_id": memory.id}


@HANDLERS.rpc("RetrieveMemory")
async def _retrieve(app: Application, request: Given) -> Plain:
    found = await app.memory.retrieve(request["session_id"], request["memory_id"])
    return {"memory": None if found is None else memory_item(found)}


@HANDLERS.rpc("SearchMemories")
async def _search(app: Application, request: Given) -> Plain:
    query = MemoryQuery(
        text=request["query"] or "",
        tags=tuple(request["tags"]),
        min_importance=request["min_importance"],
        recent_only=request["recent_only"],
        limit=request["limit"],
    )
    found, total = await app.memory.search(request["session_id"], query)
    return {"memories": [memory_item(memory) for memory in found], "total_count": total}


@HANDLERS.rpc("GetMemoryStats")
async def _stats(app: Application, request: Given) -> Plain:
    stats = await app.memory.stats(request["session_id"])
    counts = {"long_term_count": stats.long_term, "short_term_count": stats.short_term}
    return {"stats": {**counts, "working_count": stats.working}}


@HANDLERS.rpc("ClearMemories")
async def _clear(app: Application, request: Given) -> Plain:
    count = await app.memory.clear(
        request["session_id"],
        request["clear_long_term"],
        request["clear_short_term"],
        request["clear_working"],
    )
    return {"success": True, "cleared_count": count}


@HANDLERS.rpc("DeleteMemory")
async def _delete(app: Application, request: Given) -> Plain:
    return {"success": await app.memory.delete(request["session_id"], request["memory_id"])}


@HANDLERS.rpc("SummarizeMemories")
async def _summarize(app: Application, request: Given) -> Plain:
    done = await app.memory.summarize(
        request["session_id"], list(request["tags"]), request["limit"], request["recent_hours"]
    )
    return {
        "summary": done.summary,
        "memory_count": done.memory_count,
        "stored": done.memory is not None,
        "summary_memory_id": done.memory.id if done.memory is not None else "",
    }
