"""The scheduled jobs on PostgreSQL (core/store/cron.py), in the session store's database: its tables
are a migration of postgres_schema.py, its statements run on that store's pooled connections.

Claims of one job are serialised by the job's row lock: a firing is recorded in the transaction that
moves the job's next_run on, so of two replicas claiming one scheduled time one moves it and the
other finds it moved and records nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection
from psycopg.errors import UniqueViolation

from ...base.errors import AlreadyExists, NotFound
from .cron import (
    EXECUTION_COLUMNS,
    HISTORY_KEPT,
    JOB_COLUMNS,
    OVERLAP,
    CronExecution,
    CronJob,
    ExecutionStatus,
    execution_of,
    execution_row,
    job_of,
)

# Outputs are bytes (UTF-8): a text column cannot hold the NUL character a command may print.
SCHEMA = """
    CREATE TABLE cron_jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        spec TEXT NOT NULL,
        paused BOOLEAN NOT NULL DEFAULT FALSE,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        next_run BIGINT,
        last_run BIGINT,
        run_count BIGINT NOT NULL DEFAULT 0,
        fail_count BIGINT NOT NULL DEFAULT 0,
        seq BIGSERIAL NOT NULL  -- the order jobs were made in, for jobs made at one time
    );
    CREATE INDEX cron_jobs_by_next_run ON cron_jobs(next_run);
    CREATE TABLE cron_executions (
        id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES cron_jobs(id) ON DELETE CASCADE,
        scheduled_at BIGINT,
        status TEXT NOT NULL,
        started_at BIGINT NOT NULL,
        ended_at BIGINT,
        exit_code INTEGER,
        stdout BYTEA NOT NULL DEFAULT '',
        stderr BYTEA NOT NULL DEFAULT '',
        error BYTEA NOT NULL DEFAULT '',
        owner TEXT NOT NULL,
        lease_until BIGINT NOT NULL,
        seq BIGSERIAL NOT NULL  -- the order records were made in, for firings that started together
    );
    -- One record per scheduled time of a job: the second claim of a time cannot be stored.
    CREATE UNIQUE INDEX cron_executions_by_time ON cron_executions(job_id, scheduled_at);
    CREATE INDEX cron_executions_by_start ON cron_executions(job_id, started_at);
    CREATE INDEX cron_executions_running ON cron_executions(status, lease_until);
"""

_RUNNING = ExecutionStatus.RUNNING.value
_JOB = (
    f"{JOB_COLUMNS}, EXISTS (SELECT 1 FROM cron_executions e WHERE e.job_id = j.id"
    f" AND e.status = '{_RUNNING}' AND e.lease_until >= %(now)s)"
)
_HELD = f"SELECT 1 FROM cron_executions WHERE job_id = %s AND status = '{_RUNNING}' AND lease_until >= %s"
_TEXTS = (9, 10, 11)  # stdout, stderr, error in EXECUTION_COLUMNS: bytes in the table
_PLACES = ", ".join(["%s"] * len(EXECUTION_COLUMNS.split(",")))

Connect = Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]]


class PostgresCronStore:
    def __init__(self, connect: Connect) -> None:
        """`connect`: a pooled connection of the session store (autocommit; what fails on the
        database raises Unavailable)."""
        self._connect = connect

    async def add_job(self, job: CronJob) -> None:
        try:
            async with self._connect() as conn:
                await conn.execute(
                    "INSERT INTO cron_jobs (id, name, spec, paused, created_at, updated_at, next_run)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (
                        job.id,
                        job.name,
                        job.spec.to_json(),
                        job.paused,
                        job.created_at,
                        job.updated_at,
                        job.next_run,
                    ),
                )
        except UniqueViolation as exc:
            raise AlreadyExists(f"a cron job named {job.name!r} exists already") from exc

    async def jobs(self, now: int) -> list[CronJob]:
        return await self._jobs("ORDER BY j.created_at, j.seq", {"now": now})

    async def job(self, job_id: str, now: int) -> CronJob | None:
        found = await self._jobs("WHERE j.id = %(value)s", {"now": now, "value": job_id})
        return found[0] if found else None

    async def job_named(self, name: str, now: int) -> CronJob | None:
        found = await self._jobs("WHERE j.name = %(value)s", {"now": now, "value": name})
        return found[0] if found else None

    async def due(self, now: int) -> list[CronJob]:
        return await self._jobs("WHERE j.next_run <= %(now)s ORDER BY j.next_run", {"now": now})

    async def _jobs(self, rest: str, values: dict[str, Any]) -> list[CronJob]:
        async with self._connect() as conn:
            rows = await (await conn.execute(f"SELECT {_JOB} FROM cron_jobs j {rest}", values)).fetchall()
        return [job_of(row) for row in rows]

    async def save_job(self, job: CronJob, since: int) -> bool:
        async with self._connect() as conn:
            cursor = await conn.execute(
                "UPDATE cron_jobs SET spec = %s, paused = %s, next_run = %s, updated_at = %s"
                " WHERE id = %s AND updated_at = %s",
                (job.spec.to_json(), job.paused, job.next_run, job.updated_at, job.id, since),
            )
            return cursor.rowcount > 0

    async def delete_job(self, job_id: str) -> bool:
        async with self._connect() as conn:  # its history goes with it (ON DELETE CASCADE)
            cursor = await conn.execute("DELETE FROM cron_jobs WHERE id = %s", (job_id,))
            return cursor.rowcount > 0

    async def next_due(self) -> int | None:
        async with self._connect() as conn:
            row = await (await conn.execute("SELECT MIN(next_run) FROM cron_jobs")).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    async def claim(
        self, job_id: str, due: int, next_run: int | None, firing: CronExecution | None
    ) -> CronExecution | None:
        async with self._connect() as conn, conn.transaction():
            cursor = await conn.execute(
                "UPDATE cron_jobs SET next_run = %s WHERE id = %s AND next_run = %s", (next_run, job_id, due)
            )
            if not cursor.rowcount or firing is None:
                return None
            if await _held(conn, firing):
                firing = firing.closed(ExecutionStatus.CANCELLED, firing.started_at, error=OVERLAP)
            await _record(conn, firing)
            return firing

    async def start(self, execution: CronExecution) -> bool:
        async with self._connect() as conn, conn.transaction():
            locked = await conn.execute(
                "SELECT 1 FROM cron_jobs WHERE id = %s FOR UPDATE", (execution.job_id,)
            )
            if await locked.fetchone() is None:
                raise NotFound(f"no cron job has the id {execution.job_id!r}")
            if await _held(conn, execution):
                return False
            await _record(conn, execution)
            return True

    async def renew(self, execution: CronExecution, lease_until: int) -> bool:
        async with self._connect() as conn:
            cursor = await conn.execute(
                "UPDATE cron_executions SET lease_until = %s WHERE id = %s AND owner = %s AND status = %s",
                (lease_until, execution.id, execution.owner, _RUNNING),
            )
            return cursor.rowcount > 0

    async def finish(self, execution: CronExecution) -> bool:
        async with self._connect() as conn, conn.transaction():
            return await _close(conn, execution)

    async def abandon(self, now: int, error: str) -> int:
        async with self._connect() as conn, conn.transaction():
            rows = await (
                await conn.execute(
                    f"SELECT {EXECUTION_COLUMNS} FROM cron_executions WHERE status = %s AND lease_until < %s"
                    " FOR UPDATE SKIP LOCKED",
                    (_RUNNING, now),
                )
            ).fetchall()
            for row in rows:
                stale = _execution(row)
                await _close(conn, stale.closed(ExecutionStatus.FAILED, stale.lease_until, error=error))
            return len(rows)

    async def history(self, job_id: str, limit: int) -> list[CronExecution]:
        async with self._connect() as conn:
            rows = await (
                await conn.execute(
                    f"SELECT {EXECUTION_COLUMNS} FROM cron_executions WHERE job_id = %s"
                    " ORDER BY started_at DESC, seq DESC LIMIT %s",
                    (job_id, limit),
                )
            ).fetchall()
        return [_execution(row) for row in rows]


def _execution(row: tuple[Any, ...]) -> CronExecution:
    return execution_of([bytes(v).decode() if i in _TEXTS else v for i, v in enumerate(row)])


async def _held(conn: AsyncConnection[Any], firing: CronExecution) -> bool:
    """Whether another firing of the job holds its lease when `firing` starts (the caller holds the
    job's row lock, so no firing of it starts meanwhile)."""
    held = await conn.execute(_HELD, (firing.job_id, firing.started_at))
    return await held.fetchone() is not None


async def _record(conn: AsyncConnection[Any], firing: CronExecution) -> None:
    """Insert a firing's record and, when it runs, set its job's last_run."""
    values = [v.encode() if i in _TEXTS else v for i, v in enumerate(execution_row(firing))]
    await conn.execute(f"INSERT INTO cron_executions ({EXECUTION_COLUMNS}) VALUES ({_PLACES})", values)
    if firing.status is ExecutionStatus.RUNNING:
        await conn.execute(
            "UPDATE cron_jobs SET last_run = %s WHERE id = %s", (firing.started_at, firing.job_id)
        )


async def _close(conn: AsyncConnection[Any], done: CronExecution) -> bool:
    """Write a running firing's outcome, count it in its job and trim the job's history."""
    cursor = await conn.execute(
        "UPDATE cron_executions SET status = %s, ended_at = %s, exit_code = %s, stdout = %s, stderr = %s,"
        " error = %s WHERE id = %s AND status = %s",
        (
            done.status.value,
            done.ended_at,
            done.exit_code,
            done.stdout.encode(),
            done.stderr.encode(),
            done.error.encode(),
            done.id,
            _RUNNING,
        ),
    )
    if not cursor.rowcount:
        return False
    await conn.execute(
        "UPDATE cron_jobs SET run_count = run_count + 1, fail_count = fail_count + %s WHERE id = %s",
        (int(done.status is not ExecutionStatus.SUCCESS), done.job_id),
    )
    await conn.execute(
        "DELETE FROM cron_executions WHERE job_id = %s AND id NOT IN (SELECT id FROM cron_executions"
        " WHERE job_id = %s ORDER BY started_at DESC, seq DESC LIMIT %s)",
        (done.job_id, done.job_id, HISTORY_KEPT),
    )
    return True
