"""`replicas`: PostgreSQL against SQLite, one replica against two, the durable event log against
the bare fan-out, and a stream resumed on another replica against a new one."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from pathlib import Path

import grpc

from a3s_agent.base.models import SessionConfig
from a3s_agent.core.store.events import EVENT, EventBus, EventType, Filter, event_entry
from a3s_agent.core.store.session import Session
from a3s_agent.core.store.sqlite_store import SqliteStore
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .common import (
    FakeLLMProcess,
    Process,
    agent_process,
    calls_per_second,
    initialize,
    session_pair,
    stream_generation,
)
from .report import Row, Skipped


class Postgres:
    """A PostgreSQL server from pgserver (the test extra) in `root`; `database` makes a new one."""

    def __init__(self, root: Path) -> None:
        import pgserver

        self.server = pgserver.get_server(root, cleanup_mode="stop")
        self.made = 0

    def database(self) -> str:
        import psycopg

        self.made += 1
        name = f"bench_{self.made}"
        with psycopg.connect(self.server.get_uri(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return str(self.server.get_uri(name))

    def __enter__(self) -> Postgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.cleanup()


def replica_process(workspace: Path, url: str, name: str) -> Process:
    """`a3s-agent serve` on PostgreSQL (`url`) as replica `name`, its data directory its own."""
    return agent_process(
        workspace, extra=("--store", url, "--replica-id", name, "--data-dir", f"{workspace}.{name}")
    )


async def _generation_s(stub: pb_grpc.CodeAgentServiceStub, runs: int) -> float:
    """Mean seconds of one StreamGenerate on a new session (after a warm-up)."""
    await stream_generation(stub)
    started = time.perf_counter()
    for _ in range(runs):
        await stream_generation(stub)
    return (time.perf_counter() - started) / runs


async def _store_rates(seconds: float, workspace: Path, url: str) -> tuple[float, float]:
    """CreateSession+GetSession pairs/s, and seconds per 3-turn generation, of one server."""
    extra = ("--store", url) if url else ()
    with FakeLLMProcess(2) as fake, agent_process(workspace, extra=extra) as agent:
        agent.wait_healthy()
        pairs = await calls_per_second(agent.address, session_pair, seconds)
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await initialize(stub, fake.base_url)
            generation = await _generation_s(stub, max(10, int(seconds * 10)))
    return pairs, generation


async def _generations_per_second(addresses: list[str], base_url: str, seconds: float) -> float:
    """Short generations/s of 100 concurrent sessions spread over the servers at `addresses`."""
    async with contextlib.AsyncExitStack() as stack:
        channels = [await stack.enter_async_context(grpc.aio.insecure_channel(a)) for a in addresses]
        stubs = [pb_grpc.CodeAgentServiceStub(c) for c in channels]
        for stub in stubs:
            await initialize(stub, base_url)
        sessions = [(await stubs[i % len(stubs)].CreateSession(pb.CreateSessionRequest())).session_id
                    for i in range(100)]  # fmt: skip
        done = 0
        deadline = 0.0

        async def worker(index: int) -> None:
            nonlocal done
            stub, session_id = stubs[index % len(stubs)], sessions[index]
            message = pb.Message(role=pb.Message.ROLE_USER, content="go")
            while time.perf_counter() < deadline:
                await stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[message]))
                done += 1

        deadline = time.perf_counter() + 1.0  # warm up
        await asyncio.gather(*(worker(i) for i in range(100)))
        done = 0
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(worker(i) for i in range(100)))
        return done / (time.perf_counter() - started)


async def _spread_rates(seconds: float, workspace: Path, postgres: Postgres) -> tuple[float, float]:
    """Generations/s of 100 concurrent sessions on one replica, then on two."""
    rates = []
    for count in (1, 2):
        url = postgres.database()
        with contextlib.ExitStack() as stack:
            fake = stack.enter_context(FakeLLMProcess(0))
            replicas = [stack.enter_context(replica_process(workspace, url, f"r{i}")) for i in range(count)]
            for replica in replicas:
                replica.wait_healthy()
            rates.append(await _generations_per_second([r.address for r in replicas], fake.base_url, seconds))
    return rates[0], rates[1]


async def _events_per_second(bus: EventBus, durable: bool, count: int) -> float:
    """Events/s from publishing to a subscriber's reading them: through the store's log (its group
    commits), or handed straight to the fan-out as the in-memory bus before the log did."""
    subscription = await bus.subscribe(Filter("bench", EVENT))

    async def publish() -> None:
        for i in range(1, count + 1):
            if durable:
                bus.publish(EventType.INFO, "bench", f"event {i}")
            else:
                entry = event_entry(EventType.INFO, "bench", f"event {i}")
                entry.seq = entry.id = i
                bus.deliver([entry])
            if i % 100 == 0:
                await asyncio.sleep(0)  # let the subscriber read, as the agent's awaits do

    started = time.perf_counter()
    publishing = asyncio.ensure_future(publish())
    read = 0
    async for _ in subscription:
        read += 1
        if read == count:
            break
    await publishing
    return count / (time.perf_counter() - started)


async def _log_rates(workspace: Path, url: str, count: int) -> tuple[float, float, float]:
    """Events/s (in process): fan-out only, through the SQLite log, through the PostgreSQL log."""
    from a3s_agent.core.store.postgres_store import PostgresStore

    rates: list[float] = []
    for store in (
        SqliteStore(workspace / "memory.db"),
        SqliteStore(workspace / "events.db"),
        PostgresStore(url, "bench"),
    ):
        await store.open()
        try:
            durable = bool(rates)
            if durable:
                await store.create_session(Session("bench", SessionConfig()), [])
            rates.append(await _events_per_second(EventBus(store), durable, count))
        finally:
            await store.close()
    return rates[0], rates[1], rates[2]


async def _first_chunk_ms(call: grpc.aio.UnaryStreamCall) -> tuple[float, pb.GenerateChunk]:
    started = time.perf_counter()
    async for chunk in call:
        elapsed = (time.perf_counter() - started) * 1000
        async for _ in call:  # read it to its end
            pass
        return elapsed, chunk
    raise RuntimeError("the stream ended without a chunk")


async def _resume_ms(seconds: float, workspace: Path, url: str) -> tuple[float, float]:
    """Median ms to the first chunk: of a new StreamGenerate on replica A (instant model), and of
    a StreamGenerate resumed on replica B from that generation's first chunk (a3s-after-seq)."""
    with (
        FakeLLMProcess(2) as fake,
        replica_process(workspace, url, "a") as first,
        replica_process(workspace, url, "b") as second,
    ):
        first.wait_healthy()
        second.wait_healthy()
        async with (
            grpc.aio.insecure_channel(first.address) as one,
            grpc.aio.insecure_channel(second.address) as other,
        ):
            a, b = pb_grpc.CodeAgentServiceStub(one), pb_grpc.CodeAgentServiceStub(other)
            for stub in (a, b):
                await initialize(stub, fake.base_url)
            new, resumed = [], []
            for _ in range(max(20, int(seconds * 10))):
                session_id = (await a.CreateSession(pb.CreateSessionRequest())).session_id
                go = pb.GenerateRequest(
                    session_id=session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content="go")]
                )
                elapsed, chunk = await _first_chunk_ms(a.StreamGenerate(go))
                new.append(elapsed)
                after = (("a3s-after-seq", chunk.metadata["seq"]),)
                elapsed, _ = await _first_chunk_ms(
                    b.StreamGenerate(pb.GenerateRequest(session_id=session_id), metadata=after)
                )
                resumed.append(elapsed)
    return statistics.median(new[1:]), statistics.median(resumed[1:])


async def bench_replicas(seconds: float, workspace: Path) -> list[Row]:
    try:
        import pgserver  # noqa: F401
    except ImportError:
        raise Skipped("pgserver (the test extra) is not installed") from None
    (workspace / "small.txt").write_text("lorem ipsum\n" * 300)
    with Postgres(workspace.parent / "postgres") as postgres:
        sqlite_pairs, sqlite_generation = await _store_rates(seconds, workspace, "")
        pg_pairs, pg_generation = await _store_rates(seconds, workspace, postgres.database())
        one, two = await _spread_rates(seconds, workspace, postgres)
        memory, sqlite_log, pg_log = await _log_rates(workspace, postgres.database(), 20_000)
        new_ms, resume_ms = await _resume_ms(seconds, workspace, postgres.database())
    return [
        Row("CreateSession+GetSession pairs/s: SQLite", f"{sqlite_pairs:,.0f}"),
        Row("CreateSession+GetSession pairs/s: PostgreSQL", f"{pg_pairs:,.0f}"),
        Row("pairs/s ratio (PostgreSQL / SQLite)", f"{pg_pairs / sqlite_pairs:.2f}", "report"),
        Row("3-turn generation, instant model (ms): SQLite", f"{sqlite_generation * 1000:.1f}"),
        Row("3-turn generation, instant model (ms): PostgreSQL", f"{pg_generation * 1000:.1f}"),
        Row(
            "generation time ratio (PostgreSQL / SQLite)",
            f"{pg_generation / sqlite_generation:.2f}",
            "report",
        ),
        Row("100 concurrent sessions, generations/s: 1 replica", f"{one:,.0f}"),
        Row("100 concurrent sessions, generations/s: 2 replicas", f"{two:,.0f}"),
        Row("throughput ratio (2 replicas / 1)", f"{two / one:.2f}", ">= 1.6"),
        Row("events/s: in-memory fan-out only", f"{memory:,.0f}"),
        Row("events/s: through the SQLite log", f"{sqlite_log:,.0f}"),
        Row("events/s: through the PostgreSQL log", f"{pg_log:,.0f}"),
        Row("events/s ratio (SQLite log / fan-out only)", f"{sqlite_log / memory:.2f}", "report"),
        Row("events/s ratio (PostgreSQL log / fan-out only)", f"{pg_log / memory:.2f}", "report"),
        Row("first chunk of a new StreamGenerate (ms)", f"{new_ms:.1f}"),
        Row("first chunk of a StreamGenerate resumed on another replica (ms)", f"{resume_ms:.1f}"),
        Row("resume latency ratio (resumed / new)", f"{resume_ms / new_ms:.2f}", "<= 1"),
    ]
