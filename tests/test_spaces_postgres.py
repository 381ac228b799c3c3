"""Agent Spaces on PostgreSQL (a real server, a fresh database per test: tests/postgres.py): the store's
operations, and two `Spaces` services (two replicas) on one database: a space or a run of one is
read, resumed and cancelled on the other; a run whose replica stopped renewing its lease is failed
by the other's sweep, a live one is not."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from a3s_agent.base.errors import AlreadyExists, NotFound, ResourceExhausted, Unavailable
from a3s_agent.config import DEFAULT_MAX_SPACES
from a3s_agent.core.store import postgres_bounds
from a3s_agent.spaces.postgres_store import PostgresSpacesStore
from a3s_agent.spaces.service import Spaces
from a3s_agent.spaces.storage import RunRecord, SpaceRecord
from a3s_agent.tools.builtin import builtin_registry

from .conftest import ServerProcess, eventually, free_port

INTERRUPTED = {
    "type": "error",
    "category": "system",
    "message": "The run was interrupted: the server stopped while it ran",
    "details": {},
}
LEASE_S = 0.6  # short, so that expiry is seen quickly: renewed and swept every 0.2 s
NOW = "2025-01-15T10:30:00.000Z"


@pytest.fixture
def url(postgres_url: str) -> str:
    """A fresh database of the test's own (tests/postgres.py)."""
    return postgres_url


@asynccontextmanager
async def replica(
    url: str, name: str, data: Path, lease_s: float = LEASE_S, max_spaces: int = DEFAULT_MAX_SPACES
) -> AsyncIterator[Spaces]:
    spaces = Spaces(
        data, builtin_registry(), store_url=url, replica_id=name, lease_s=lease_s, max_spaces=max_spaces
    )
    await spaces.open()
    try:
        yield spaces
    finally:
        await spaces.close()


@asynccontextmanager
async def raw_store(url: str, owner: str, lease_ms: int = 10_000) -> AsyncIterator[PostgresSpacesStore]:
    store = PostgresSpacesStore(url, owner, lease_ms)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def ops(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


def bare(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in event.items() if k != "timestamp"} for event in events]


WAIT_FOR_GO = {
    "type": "shell",
    "id": "wait",
    "command": "touch started; while [ ! -e go ]; do sleep 0.05; done",
}


# --- the store ------------------------------------------------------------------------------------


async def test_the_store_keeps_spaces_runs_and_their_events(url: str) -> None:
    async with raw_store(url, "a") as store:
        await store.insert_space(SpaceRecord("box", "/w", {"preset": "standard"}, NOW), 10)
        with pytest.raises(AlreadyExists, match="space 'box' already exists"):
            await store.insert_space(SpaceRecord("box", "/other", {}, NOW), 10)
        assert await store.get_space("box") == SpaceRecord("box", "/w", {"preset": "standard"}, NOW)
        assert await store.get_space("nobody") is None and await store.get_run("nobody") is None

        await store.insert_run(RunRecord("r1", "box", "running", {"preset": "standard"}, None, 0, NOW, NOW))
        # Key order is kept (the protocol's events list their fields in the spec's order).
        first = [{"type": "createFile", "operationId": "a", "path": "x", "success": True}]
        pending = {"offset": 1, "operations": [{"type": "shell", "command": "ls"}], "operationId": "op-1"}
        assert await store.save_segment("r1", "awaiting_approval", pending, first, 0, "t1")
        run, events = await store.get_run("r1", with_events=True) or (None, [])
        assert run == RunRecord(
            "r1", "box", "awaiting_approval", {"preset": "standard"}, pending, 1, NOW, "t1"
        )
        assert events == first and list(events[0]) == ["type", "operationId", "path", "success"]

        assert not await store.claim_run("r1", "running", "cancelled", "t2")  # not in the state expected
        assert await store.claim_run("r1", "awaiting_approval", "running", "t2")
        assert not await store.claim_run("r1", "awaiting_approval", "running", "t2")  # claimed once only
        second = [{"type": "shell", "n": n} for n in range(3)]
        assert await store.save_segment("r1", "completed", None, second, 1, "t3")
        run, events = await store.get_run("r1", with_events=True) or (None, [])
        assert run is not None and (run.status, run.pending, run.event_count) == ("completed", None, 4)
        assert events == first + second
        assert (await store.get_run("r1") or (None, None))[1] == []  # without events when not asked


async def test_only_the_owner_records_a_runs_end_and_renews_its_lease(url: str) -> None:
    async with raw_store(url, "a") as a, raw_store(url, "b") as b:
        await a.insert_space(SpaceRecord("box", "/w", {}, NOW), 10)
        await a.insert_run(RunRecord("r1", "box", "running", {}, None, 0, NOW, NOW))
        await a.insert_run(RunRecord("r2", "box", "running", {}, None, 0, NOW, NOW))
        assert not await b.save_segment("r1", "completed", None, [{"type": "x"}], 0, "t")
        assert await a.get_run("r1", with_events=True) == (
            RunRecord("r1", "box", "running", {}, None, 0, NOW, NOW),
            [],
        )
        assert await a.renew(["r1", "r2"]) == set()
        assert await b.renew(["r1"]) == {"r1"}  # not b's: b must stop it
        assert await b.request_cancel("r2")
        assert await a.renew(["r1", "r2"]) == {"r2"}  # r2 asked to cancel from b
        assert await a.save_segment("r2", "cancelled", None, [], 0, "t")
        assert not await b.request_cancel("r2")  # no longer running
        assert await a.renew(["r2"]) == {"r2"}


async def test_a_statement_stuck_behind_another_client_s_lock_fails_unavailable(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_bounds, "STATEMENT_TIMEOUT_MS", 300)
    async with raw_store(url, "a") as a:
        await a.insert_space(SpaceRecord("box", "/w", {}, NOW), 10)
        await a.insert_run(RunRecord("r1", "box", "running", {}, None, 0, NOW, NOW))
        async with await psycopg.AsyncConnection.connect(url) as intruder:
            await intruder.execute("SELECT id FROM spaces_runs WHERE id = 'r1' FOR UPDATE")
            with pytest.raises(Unavailable, match="Agent Spaces' PostgreSQL store did not answer in time"):
                async with asyncio.timeout(10):
                    await a.request_cancel("r1")
            await intruder.rollback()
        assert await a.request_cancel("r1")  # the store goes on


async def test_a_sweep_fails_only_runs_whose_lease_expired(url: str) -> None:
    async with raw_store(url, "gone", lease_ms=50) as gone, raw_store(url, "alive") as alive:
        await gone.insert_space(SpaceRecord("box", "/w", {}, NOW), 10)
        await gone.insert_run(RunRecord("orphan", "box", "running", {}, None, 0, NOW, NOW))
        await gone.save_segment("orphan", "awaiting_approval", {"offset": 0}, [{"type": "a"}], 0, NOW)
        assert await gone.claim_run("orphan", "awaiting_approval", "running", NOW)  # one event before
        await alive.insert_run(RunRecord("live", "box", "running", {}, None, 0, NOW, NOW))
        await asyncio.sleep(0.1)
        # Two replicas sweeping at once end the orphan once.
        counts = await asyncio.gather(
            *(store.fail_running({"type": "error"}, "t") for store in (gone, alive))
        )
        assert sorted(counts) == [0, 1]
        orphan, events = await alive.get_run("orphan", with_events=True) or (None, [])
        assert orphan is not None and (orphan.status, orphan.event_count) == ("error", 2)
        assert events == [{"type": "a"}, {"type": "error"}]
        assert not await gone.save_segment("orphan", "completed", None, [], 2, "t")  # too late
        live = await alive.get_run("live")
        assert live is not None and live[0].status == "running"


async def test_replicas_starting_together_migrate_the_schema_once(url: str) -> None:
    stores = [PostgresSpacesStore(url, f"r{n}", 1000) for n in range(4)]
    await asyncio.gather(*(store.open() for store in stores))
    try:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cursor = await conn.execute("SELECT version FROM a3s_spaces_schema")
            assert await cursor.fetchall() == [(1,)]
            cursor = await conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'spaces%' ORDER BY 1"
            )
            assert await cursor.fetchall() == [("spaces_events",), ("spaces_runs",), ("spaces_spaces",)]
    finally:
        for store in stores:
            await store.close()


async def test_a_database_out_of_reach_fails_the_open_with_the_reason(tmp_path: Path) -> None:
    spaces = Spaces(
        tmp_path,
        builtin_registry(),
        store_url=f"postgresql://a3s@127.0.0.1:{free_port()}/none",
        replica_id="A",
    )
    with pytest.raises(Unavailable, match=r"Agent Spaces cannot reach its PostgreSQL store: .*refused"):
        await spaces.open()


# --- two replicas ---------------------------------------------------------------------------------


async def test_a_space_made_on_one_replica_is_read_and_run_on_another(
    url: str, tmp_path: Path, workspace: Path
) -> None:
    async with replica(url, "A", tmp_path / "a") as a, replica(url, "B", tmp_path / "b") as b:
        made = await a.create_space("shared", workspace=workspace, policy="standard")
        seen = await b.get_space("shared")
        assert (seen.id, seen.workspace, seen.policy.spec, seen.created_at) == (
            made.id,
            made.workspace,
            made.policy.spec,
            made.created_at,
        )
        done = await b.start_run(
            "shared", ops({"type": "createFile", "id": "f", "path": "from-b.txt", "content": "b"})
        )
        assert done["status"] == "completed" and (workspace / "from-b.txt").read_text() == "b"
        assert await a.get_run("shared", done["runId"]) == done
        with pytest.raises(AlreadyExists):
            await b.create_space("shared", workspace=workspace)


async def test_a_space_deleted_on_one_replica_is_gone_on_another(
    url: str, tmp_path: Path, workspace: Path
) -> None:
    async with replica(url, "A", tmp_path / "a") as a, replica(url, "B", tmp_path / "b") as b:
        await a.create_space("doomed", workspace=workspace, policy="standard")
        await b.get_space("doomed")  # B holds it now
        paused = await b.start_run("doomed", ops({"type": "shell", "id": "s", "command": "rm -rf x"}))
        assert paused["status"] == "awaiting_approval"
        await a.delete_space("doomed")
        with pytest.raises(NotFound):
            await b.get_space("doomed")
        with pytest.raises(NotFound):
            await b.start_run("doomed", ops({"type": "message", "id": "m", "content": "hi"}))
        with pytest.raises(NotFound):
            await b.get_run("doomed", paused["runId"])
    async with raw_store(url, "c") as store:
        assert await store.delete_space("doomed") == "missing"
        await store.insert_space(SpaceRecord("held", "/w", {}, NOW), 100)
        await store.insert_run(RunRecord("r-held", "held", "running", {}, None, 0, NOW, NOW))
        assert await store.delete_space("held") == "running"
        with pytest.raises(NotFound):
            await store.insert_run(RunRecord("r-gone", "doomed", "running", {}, None, 0, NOW, NOW))


async def test_replicas_creating_spaces_at_once_keep_to_the_cap(url: str, tmp_path: Path) -> None:
    """The cap (A3S_MAX_SPACES) counts the spaces in the shared store, also under a race."""
    async with (
        replica(url, "A", tmp_path / "a", max_spaces=3) as a,
        replica(url, "B", tmp_path / "b", max_spaces=3) as b,
    ):
        made = await asyncio.gather(*(r.create_space() for r in (a, b) * 5), return_exceptions=True)
        refused = [m for m in made if isinstance(m, BaseException)]
        assert len(made) - len(refused) == 3 and len(refused) == 7
        assert all(isinstance(m, ResourceExhausted) and "A3S_MAX_SPACES" in str(m) for m in refused)
    async with raw_store(url, "c") as store:
        assert not await store.insert_space(SpaceRecord("late", "/w", {}, NOW), 3)
        assert await store.insert_space(SpaceRecord("late", "/w", {}, NOW), 4)


async def test_a_run_paused_on_one_replica_is_approved_on_another(
    url: str, tmp_path: Path, workspace: Path
) -> None:
    risky = ops(
        {"type": "createFile", "id": "a", "path": "temp/x.txt", "content": "x"},
        {"type": "shell", "id": "b", "command": "rm -rf temp"},
        {"type": "createFile", "id": "c", "path": "after.txt", "content": "done"},
    )
    async with replica(url, "A", tmp_path / "a") as a, replica(url, "B", tmp_path / "b") as b:
        await a.create_space("box", workspace=workspace)
        paused = await a.start_run("box", risky)
        assert paused["status"] == "awaiting_approval"
        assert await b.get_run("box", paused["runId"]) == paused
        resumed = await b.resume_run("box", paused["runId"], {"operationId": "b", "decision": "approved"})
        assert resumed["status"] == "completed"
        assert [e["operationId"] for e in resumed["events"]] == ["b", "c"]
        assert not (workspace / "temp").exists() and (workspace / "after.txt").read_text() == "done"
        whole = await a.get_run("box", paused["runId"])
        assert whole["status"] == "completed" and whole["events"] == paused["events"] + resumed["events"]


async def test_an_approval_is_taken_by_one_replica_only(url: str, tmp_path: Path, workspace: Path) -> None:
    async with replica(url, "A", tmp_path / "a") as a, replica(url, "B", tmp_path / "b") as b:
        await a.create_space("box", workspace=workspace)
        paused = await a.start_run(
            "box", ops({"type": "shell", "id": "rm", "command": "rm -rf gone; echo once >> log"})
        )
        assert paused["status"] == "awaiting_approval"
        approve = {"operationId": "rm", "decision": "approved"}
        results = await asyncio.gather(
            a.resume_run("box", paused["runId"], approve),
            b.resume_run("box", paused["runId"], approve),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results) == ["FailedPrecondition", "dict"]
        assert (workspace / "log").read_text() == "once\n"


async def test_a_live_run_survives_another_replica_opening_and_sweeping(
    url: str, tmp_path: Path, workspace: Path
) -> None:
    async with replica(url, "A", tmp_path / "a") as a:
        await a.create_space("box", workspace=workspace)
        task = asyncio.create_task(a.start_run("box", ops(WAIT_FOR_GO)))
        await eventually(lambda: (workspace / "started").exists(), "the command started")
        async with replica(url, "B", tmp_path / "b") as b:
            run = await _running_run(url)
            assert run["owner"] == "A"
            seen = await b.get_run("box", run["id"])
            assert seen["status"] == "running"
            # Five lease lengths of B sweeping: A renews, so its run stays running.
            await asyncio.sleep(5 * LEASE_S)
            assert (await b.get_run("box", seen["runId"]))["status"] == "running"
            (workspace / "go").touch()
            done = await task
            assert done["status"] == "completed" and done["events"][0]["success"] is True
            assert await b.get_run("box", seen["runId"]) == done


async def test_runs_of_a_replica_that_stopped_renewing_are_failed_by_another(
    url: str, tmp_path: Path, workspace: Path
) -> None:
    async with replica(url, "B", tmp_path / "b") as b:
        await b.create_space("box", workspace=workspace)
    # A replica that is gone left two runs running (as a kill -9 leaves them): one's lease has
    # expired by the time B opens, the other's expires while B runs.
    async with raw_store(url, "gone", lease_ms=100) as gone:
        await gone.insert_run(RunRecord("run_early", "box", "running", {}, None, 0, NOW, NOW))
    await asyncio.sleep(0.2)
    async with raw_store(url, "gone", lease_ms=2000) as gone:
        await gone.insert_run(RunRecord("run_late", "box", "running", {}, None, 0, NOW, NOW))
    async with replica(url, "B", tmp_path / "b") as b:
        early = await b.get_run("box", "run_early")
        assert early["status"] == "error" and bare(early["events"]) == [INTERRUPTED]  # at open
        assert (await b.get_run("box", "run_late"))["status"] == "running"
        late = await eventually(lambda: _ended(b, "run_late"), "the sweep failed the late run", within_s=5)
        assert late["status"] == "error" and bare(late["events"]) == [INTERRUPTED]


async def test_a_run_is_cancelled_from_another_replica(url: str, tmp_path: Path, workspace: Path) -> None:
    async with replica(url, "A", tmp_path / "a") as a, replica(url, "B", tmp_path / "b") as b:
        await a.create_space("box", workspace=workspace)
        task = asyncio.create_task(a.start_run("box", ops(WAIT_FOR_GO, {"type": "message", "content": "x"})))
        await eventually(lambda: (workspace / "started").exists(), "the command started")
        run_id = (await _running_run(url))["id"]
        cancelled = await b.cancel_run("box", run_id)
        assert cancelled["status"] == "cancelled"
        assert [e["type"] for e in cancelled["events"]] == ["shell"]  # killed; the message never ran
        assert "Cancelled" in cancelled["events"][0]["error"]
        assert await task == cancelled


async def test_a_replica_that_lost_its_lease_does_not_overwrite_the_sweep(
    url: str, tmp_path: Path, workspace: Path
) -> None:
    """A replica that hangs (stops renewing) past its lease finds its run failed by another when it
    comes back: its end is not recorded over the sweep's."""
    async with replica(url, "A", tmp_path / "a") as a, replica(url, "B", tmp_path / "b") as b:
        await a.create_space("box", workspace=workspace)
        task = asyncio.create_task(a.start_run("box", ops(WAIT_FOR_GO)))
        await eventually(lambda: (workspace / "started").exists(), "the command started")
        assert a._upkeep is not None
        a._upkeep.cancel()  # A hangs: no more renewals
        run_id = (await _running_run(url))["id"]
        await eventually(lambda: _ended(b, run_id), "B's sweep failed the run", within_s=5)
        (workspace / "go").touch()
        result = await task
        assert result["status"] == "error" and bare(result["events"]) == [INTERRUPTED]
        assert await b.get_run("box", run_id) == result


async def _ended(spaces: Spaces, run_id: str) -> dict[str, Any] | None:
    result = await spaces.get_run("box", run_id)
    return None if result["status"] == "running" else dict(result)


async def _running_run(url: str) -> dict[str, Any]:
    """The one run running, as the database has it."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute("SELECT id, owner FROM spaces_runs WHERE status = 'running'")
        rows = await cursor.fetchall()
    assert len(rows) == 1, rows
    return {"id": rows[0][0], "owner": rows[0][1]}


# --- two server processes -------------------------------------------------------------------------


async def test_two_server_processes_share_spaces_and_one_killed_mid_run_is_swept(
    url: str, tmp_path: Path, workspace: Path
) -> None:
    """The real HTTP routes of two `serve --store` processes: a space and a paused run made on A are
    read and approved on B; A killed (-9) while a run executes: B fails it once its lease expires."""
    replicas = [
        ServerProcess(
            workspace,
            tmp_path / name / "data",
            env={"A3S_STORE": url, "A3S_REPLICA_ID": name, "A3S_LEASE_TTL_S": "1"},
        )
        for name in ("A", "B")
    ]
    await asyncio.gather(*(asyncio.to_thread(server.start) for server in replicas))
    try:
        async with (
            aiohttp.ClientSession(f"http://127.0.0.1:{replicas[0].http_port}") as a,
            aiohttp.ClientSession(f"http://127.0.0.1:{replicas[1].http_port}") as b,
        ):
            made = await a.post("/v1/spaces", json={"spaceId": "box", "workspace": str(workspace)})
            assert made.status == 201
            seen = await b.get("/v1/spaces/box")
            assert seen.status == 200 and await seen.json() == await made.json()

            paused = await (
                await a.post(
                    "/v1/spaces/box/runs", json=ops({"type": "shell", "id": "rm", "command": "rm -rf x"})
                )
            ).json()
            assert paused["status"] == "awaiting_approval"
            resumed = await b.post(
                f"/v1/spaces/box/runs/{paused['runId']}/resume",
                json={"approval": {"operationId": "rm", "decision": "approved"}},
            )
            assert resumed.status == 200 and (await resumed.json())["status"] == "completed"

            hanging = asyncio.create_task(a.post("/v1/spaces/box/runs", json=ops(WAIT_FOR_GO)))
            await eventually(lambda: (workspace / "started").exists(), "the command started on A")
            run_id = (await _running_run(url))["id"]
            assert (await (await b.get(f"/v1/spaces/box/runs/{run_id}")).json())["status"] == "running"
            replicas[0].stop(signal.SIGKILL)
            with pytest.raises(aiohttp.ClientError):
                await hanging

            async def swept() -> dict[str, Any] | None:
                run = await (await b.get(f"/v1/spaces/box/runs/{run_id}")).json()
                return None if run["status"] == "running" else dict(run)

            run = await eventually(swept, "B failed the run of the killed replica", within_s=10)
            assert run["status"] == "error" and bare(run["events"]) == [INTERRUPTED]
    finally:
        (workspace / "go").touch()  # the killed replica's command, if it outlived it, ends
        for server in replicas:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
