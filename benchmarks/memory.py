"""The `memory` section: SearchMemories over 10,000 memories against a plain session read
(GetSession) of the same server, on SQLite and (with pgserver) PostgreSQL; calls alternate, one
at a time, and each figure is a median."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .common import agent_process
from .replicas import Postgres
from .report import Row

MEMORIES = 10_000
FILLERS = 16
"""StoreMemory calls in flight while the memories are stored."""
_SYLLABLES = [
    "ka",
    "to",
    "ri",
    "mu",
    "sen",
    "dal",
    "vor",
    "pix",
    "lin",
    "qua",
    "bre",
    "zot",
    "fen",
    "hal",
    "mio",
]
_WORDS = [a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in _SYLLABLES[:6]]
"""1,350 made-up words: as in real notes, a word is in few memories (some 0.3% of them)."""
_TAGS = [f"area-{n}" for n in range(30)]
QUERY = "kasenka bremuri halpixto"
_TYPES = [later.MEMORY_TYPE_EPISODIC, later.MEMORY_TYPE_SEMANTIC, later.MEMORY_TYPE_PROCEDURAL]


def _memories(seed: int = 7) -> list[later.MemoryItem]:
    pick = random.Random(seed)
    return [
        later.MemoryItem(
            content=" ".join(pick.choices(_WORDS, k=pick.randint(10, 24))),
            importance=round(pick.random(), 2),
            tags=pick.sample(_TAGS, 2),
            memory_type=pick.choice(_TYPES),
        )
        for _ in range(MEMORIES)
    ]


async def _fill(stub: later_grpc.CodeAgentServiceStub, session_id: str) -> float:
    """Store MEMORIES memories; StoreMemory calls/s."""
    items = _memories()
    started = time.perf_counter()

    async def worker(part: list[later.MemoryItem]) -> None:
        for item in part:
            await stub.StoreMemory(later.StoreMemoryRequest(session_id=session_id, memory=item))

    await asyncio.gather(*(worker(items[n::FILLERS]) for n in range(FILLERS)))
    return MEMORIES / (time.perf_counter() - started)


async def _medians(calls: dict[str, Callable[[], Awaitable[object]]], rounds: int) -> dict[str, float]:
    """Median ms of each call, run one at a time in rounds whose order alternates (after a warm-up)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(20):
            await call()
    names = list(calls)
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            started = time.perf_counter()
            await calls[name]()
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


async def _store_figures(seconds: float, workspace: Path, extra: tuple[str, ...]) -> dict[str, float]:
    await asyncio.to_thread(workspace.mkdir)
    # Storing is not what is measured: commits need not reach the disk here.
    with agent_process(workspace, extra=extra, env={"A3S_DURABILITY": "normal"}) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            box, stub = pb_grpc.CodeAgentServiceStub(channel), later_grpc.CodeAgentServiceStub(channel)
            session_id = (await box.CreateSession(pb.CreateSessionRequest())).session_id
            stores = await _fill(stub, session_id)

            def searching(**fields: object) -> Callable[[], Awaitable[object]]:
                request = later.SearchMemoriesRequest(session_id=session_id, limit=10, **fields)  # type: ignore[arg-type]
                return lambda: stub.SearchMemories(request)

            figures = await _medians(
                {
                    "read": lambda: box.GetSession(pb.GetSessionRequest(session_id=session_id)),
                    "query": searching(query=QUERY),
                    "tags": searching(tags=["area-3", "area-17"]),
                    "all": searching(),
                },
                rounds=max(int(40 * seconds), 20),
            )
            total = (
                await stub.SearchMemories(later.SearchMemoriesRequest(session_id=session_id, query=QUERY))
            ).total_count
    return {**figures, "stores": stores, "matches": total}


async def bench_memory(seconds: float, workspace: Path) -> list[Row]:
    stores = {"SQLite": await _store_figures(seconds, workspace / "sqlite", ())}
    try:
        import pgserver  # noqa: F401
    except ImportError:
        pass
    else:
        with Postgres(workspace / "postgres") as postgres:
            stores["PostgreSQL"] = await _store_figures(
                seconds, workspace / "pg", ("--store", postgres.database())
            )
    rows: list[Row] = []
    for name, f in stores.items():
        rows += [
            Row(
                f"{name}: StoreMemory calls/s ({FILLERS} in flight, A3S_DURABILITY=normal)",
                f"{f['stores']:,.0f}",
            ),
            Row(f"{name}: GetSession p50 (ms)", f"{f['read']:.2f}"),
            Row(
                f"{name}: SearchMemories p50, 3 words over {MEMORIES:,} memories ({f['matches']:,.0f} match) (ms)",
                f"{f['query']:.2f}",
            ),
            Row(f"{name}: search / session read (p50 ratio)", f"{f['query'] / f['read']:.1f}", "<= 10"),
            Row(f"{name}: SearchMemories p50, 2 tags (ms)", f"{f['tags']:.2f}"),
            Row(f"{name}: tag search / session read (p50 ratio)", f"{f['tags'] / f['read']:.1f}", "report"),
            Row(f"{name}: SearchMemories p50, no query: all ranked (ms)", f"{f['all']:.2f}"),
            Row(f"{name}: ranking all / session read (p50 ratio)", f"{f['all'] / f['read']:.1f}", "report"),
        ]
    return rows
