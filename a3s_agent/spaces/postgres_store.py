"""PostgreSQL persistence of Agent Spaces, for replicas that share one database (`--store
postgresql://...`): the tables `spaces_spaces`, `spaces_runs` and `spaces_events` live beside the
session store's in the same database.

Their schema version is in `a3s_spaces_schema`; the migrations a database lacks are applied at
open in one transaction under an advisory lock, so replicas starting together apply each once.
The store has its own small connection pool; each method is one transaction. Only the service
imports this module, when the store is a PostgreSQL URL, so psycopg is loaded only then.

A running run is leased to the replica executing it: `owner` is its replica id and `lease_until`
(ms, by the database's clock, so replicas' clocks need not agree) is renewed while it runs. A run
whose lease expired was left by a replica that is gone; `fail_running` ends it. A replica's own
writes of a run's end need the run still `running` and still its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg import errors
from psycopg_pool import AsyncConnectionPool

from ..base.errors import AlreadyExists, NotFound, Unavailable
from ..core.store.postgres_bounds import bound_waits, pooled
from ..core.store.postgres_schema import CONNECT_TIMEOUT_S, NOW_MS, migrate
from .storage import RunRecord, SpaceDeletion, SpaceRecord

# Each entry moves the schema one version up; a3s_spaces_schema records the version (one row).
_MIGRATIONS: list[str] = [
    """
    CREATE TABLE spaces_spaces (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        policy TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE TABLE spaces_runs (
        id TEXT PRIMARY KEY,
        space_id TEXT NOT NULL REFERENCES spaces_spaces(id) ON DELETE CASCADE,
        status TEXT NOT NULL,
        policy TEXT NOT NULL,
        pending TEXT,
        event_count INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        owner TEXT,
        lease_until BIGINT,
        cancel_requested BOOLEAN NOT NULL DEFAULT false
    );
    CREATE INDEX spaces_runs_leased ON spaces_runs(lease_until) WHERE status = 'running';
    CREATE TABLE spaces_events (
        run_id TEXT NOT NULL REFERENCES spaces_runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    """,
]
_MIGRATION_LOCK = 0xA35_5ACE  # the key of pg_advisory_xact_lock that migrations take ("a3s space")
_SPACES_LOCK = 0xA35_5ACF  # the key that a space's insert takes, to count and insert as one
_POOL_SIZE = 4
_STORE_NAME = "Agent Spaces' PostgreSQL store"
_RUN_COLUMNS = "id, space_id, status, policy, pending, event_count, created_at, updated_at"


class PostgresSpacesStore:
    """The PostgreSQL `LeasedSpacesStorage`; `owner` names this replica in the runs it executes."""

    def __init__(self, url: str, owner: str, lease_ms: int) -> None:
        self.lease_ms = lease_ms
        self._url = url
        self._owner = owner
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] | None = None

    async def open(self) -> None:
        try:
            async with await psycopg.AsyncConnection.connect(
                self._url, connect_timeout=CONNECT_TIMEOUT_S
            ) as conn:
                await migrate(conn, _MIGRATIONS, "a3s_spaces_schema", _MIGRATION_LOCK)
        except psycopg.OperationalError as exc:
            raise Unavailable(f"Agent Spaces cannot reach its PostgreSQL store: {exc}") from exc
        self._pool = AsyncConnectionPool(
            self._url,
            min_size=1,
            max_size=_POOL_SIZE,
            open=False,
            name="a3s-spaces",
            timeout=CONNECT_TIMEOUT_S,
            configure=bound_waits,
        )
        await self._pool.open()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def insert_space(self, space: SpaceRecord, most: int) -> bool:
        try:
            async with self._connection() as conn:
                # Replicas counting at once would both see room: they take turns on this lock.
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SPACES_LOCK,))
                cursor = await conn.execute(
                    "INSERT INTO spaces_spaces (id, workspace, policy, created_at)"
                    " SELECT %s, %s, %s, %s WHERE (SELECT count(*) FROM spaces_spaces) < %s",
                    (space.id, space.workspace, json.dumps(space.policy), space.created_at, most),
                )
                return cursor.rowcount == 1
        except errors.UniqueViolation as exc:
            raise AlreadyExists(f"space {space.id!r} already exists") from exc

    async def get_space(self, space_id: str) -> SpaceRecord | None:
        row = await self._fetchone(
            "SELECT id, workspace, policy, created_at FROM spaces_spaces WHERE id = %s", (space_id,)
        )
        return None if row is None else SpaceRecord(row[0], row[1], json.loads(row[2]), row[3])

    async def delete_space(self, space_id: str) -> SpaceDeletion:
        async with self._connection() as conn:
            # The space's row locked first: a run inserted meanwhile (its foreign key) waits for the
            # delete, and fails then; its runs' rows locked next: a resume (claim_run) waits too.
            space = await conn.execute("SELECT 1 FROM spaces_spaces WHERE id = %s FOR UPDATE", (space_id,))
            if await space.fetchone() is None:
                return "missing"
            runs = await conn.execute(
                "SELECT status FROM spaces_runs WHERE space_id = %s FOR UPDATE", (space_id,)
            )
            if any(status == "running" for (status,) in await runs.fetchall()):
                return "running"
            await conn.execute(
                "DELETE FROM spaces_spaces WHERE id = %s", (space_id,)
            )  # runs, events: cascade
        return "deleted"

    async def insert_run(self, run: RunRecord) -> None:
        try:
            await self._insert_run(run)
        except errors.ForeignKeyViolation as exc:
            raise NotFound(f"space {run.space_id!r} does not exist") from exc

    async def _insert_run(self, run: RunRecord) -> None:
        running = run.status == "running"
        await self._execute(
            f"INSERT INTO spaces_runs ({_RUN_COLUMNS}, owner, lease_until)"
            f" VALUES (%s, %s, %s, %s, NULL, 0, %s, %s, %s, CASE WHEN %s THEN {NOW_MS} + %s END)",
            (
                run.id,
                run.space_id,
                run.status,
                json.dumps(run.policy),
                run.created_at,
                run.updated_at,
                self._owner if running else None,
                running,
                self.lease_ms,
            ),
        )

    async def get_run(self, run_id: str, *, with_events: bool = False) -> tuple[RunRecord, list[Any]] | None:
        # One statement, so the run and its events are of one snapshot.
        events = (
            ", ARRAY(SELECT data FROM spaces_events WHERE run_id = spaces_runs.id ORDER BY seq)"
            if with_events
            else ""
        )
        row = await self._fetchone(f"SELECT {_RUN_COLUMNS}{events} FROM spaces_runs WHERE id = %s", (run_id,))
        if row is None:
            return None
        run = RunRecord(row[0], row[1], row[2], json.loads(row[3]), row[4] and json.loads(row[4]), *row[5:8])
        return run, [json.loads(data) for data in row[8]] if with_events else []

    async def claim_run(self, run_id: str, expected: str, status: str, updated_at: str) -> bool:
        if status == "running":
            lease = f"owner = %s, lease_until = {NOW_MS} + %s"
            values: tuple[Any, ...] = (self._owner, self.lease_ms)
        else:
            lease, values = "pending = NULL, owner = NULL, lease_until = NULL", ()
        return (
            await self._execute(
                f"UPDATE spaces_runs SET status = %s, updated_at = %s, cancel_requested = false, {lease}"
                " WHERE id = %s AND status = %s",
                (status, updated_at, *values, run_id, expected),
            )
            == 1
        )

    async def save_segment(
        self,
        run_id: str,
        status: str,
        pending: dict[str, Any] | None,
        events: Sequence[Any],
        first_seq: int,
        updated_at: str,
    ) -> bool:
        async with self._connection() as conn:
            ended = await conn.execute(
                "UPDATE spaces_runs SET status = %s, pending = %s, event_count = %s, updated_at = %s,"
                " owner = NULL, lease_until = NULL, cancel_requested = false"
                " WHERE id = %s AND status = 'running' AND owner = %s",
                (
                    status,
                    None if pending is None else json.dumps(pending),
                    first_seq + len(events),
                    updated_at,
                    run_id,
                    self._owner,
                ),
            )
            if ended.rowcount != 1:
                return False
            await conn.execute(
                "INSERT INTO spaces_events (run_id, seq, data)"
                " SELECT %s, %s + ord - 1, data FROM unnest(%s::text[]) WITH ORDINALITY AS t(data, ord)",
                (run_id, first_seq, [json.dumps(event) for event in events]),
            )
        return True

    async def fail_running(self, event: dict[str, Any], updated_at: str) -> int:
        # Replicas sweeping at once do not both end a run: the second UPDATE waits for the first's
        # row lock, then finds the run no longer running.
        return await self._execute(
            "WITH gone AS ("
            " UPDATE spaces_runs SET status = 'error', pending = NULL, owner = NULL, lease_until = NULL,"
            " cancel_requested = false, event_count = event_count + 1, updated_at = %s"
            f" WHERE status = 'running' AND lease_until < {NOW_MS}"
            " RETURNING id, event_count - 1 AS seq)"
            " INSERT INTO spaces_events (run_id, seq, data) SELECT id, seq, %s FROM gone",
            (updated_at, json.dumps(event)),
        )

    async def renew(self, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"UPDATE spaces_runs SET lease_until = {NOW_MS} + %s"
                " WHERE id = ANY(%s) AND status = 'running' AND owner = %s RETURNING id, cancel_requested",
                (self.lease_ms, list(run_ids), self._owner),
            )
            held = await cursor.fetchall()
        return (set(run_ids) - {run_id for run_id, _ in held}) | {run_id for run_id, cancel in held if cancel}

    async def request_cancel(self, run_id: str) -> bool:
        return (
            await self._execute(
                "UPDATE spaces_runs SET cancel_requested = true WHERE id = %s AND status = 'running'",
                (run_id,),
            )
            == 1
        )

    # --- plumbing ---------------------------------------------------------------------------------

    def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[tuple[Any, ...]]]:
        """A pooled connection in a transaction of its own, committed when the block ends; what
        fails on the database raises Unavailable (core/store/postgres_bounds.py)."""
        if self._pool is None:
            raise RuntimeError("the Agent Spaces store is not open")
        return pooled(self._pool, _STORE_NAME)

    async def _execute(self, sql: str, values: Sequence[Any]) -> int:
        """Run one statement in a transaction of its own; how many rows it changed."""
        async with self._connection() as conn:
            return (await conn.execute(sql, values)).rowcount

    async def _fetchone(self, sql: str, values: Sequence[Any]) -> tuple[Any, ...] | None:
        async with self._connection() as conn:
            return await (await conn.execute(sql, values)).fetchone()
