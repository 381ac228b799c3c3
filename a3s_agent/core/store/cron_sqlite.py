"""The scheduled jobs on SQLite (core/store/cron.py), in the session store's file: its tables are a
migration of sqlite_store.py, its statements run on that store's connection."""

from __future__ import annotations

import sqlite3

from ...base.errors import AlreadyExists, NotFound
from ...base.sqlite import Database, transaction
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

SCHEMA = """
    CREATE TABLE cron_jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        spec TEXT NOT NULL,
        paused INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        next_run INTEGER,
        last_run INTEGER,
        run_count INTEGER NOT NULL DEFAULT 0,
        fail_count INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX cron_jobs_by_next_run ON cron_jobs(next_run);
    CREATE TABLE cron_executions (
        id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES cron_jobs(id) ON DELETE CASCADE,
        scheduled_at INTEGER,
        status TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        ended_at INTEGER,
        exit_code INTEGER,
        stdout TEXT NOT NULL DEFAULT '',
        stderr TEXT NOT NULL DEFAULT '',
        error TEXT NOT NULL DEFAULT '',
        owner TEXT NOT NULL,
        lease_until INTEGER NOT NULL
    );
    -- One record per scheduled time of a job: the second claim of a time cannot be stored.
    CREATE UNIQUE INDEX cron_executions_by_time ON cron_executions(job_id, scheduled_at);
    CREATE INDEX cron_executions_by_start ON cron_executions(job_id, started_at);
    CREATE INDEX cron_executions_running ON cron_executions(status, lease_until)
"""

_RUNNING = ExecutionStatus.RUNNING.value
_JOB = (
    f"{JOB_COLUMNS}, EXISTS (SELECT 1 FROM cron_executions e WHERE e.job_id = j.id"
    f" AND e.status = '{_RUNNING}' AND e.lease_until >= ?)"
)
_HELD = f"SELECT 1 FROM cron_executions WHERE job_id = ? AND status = '{_RUNNING}' AND lease_until >= ?"


class SqliteCronStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add_job(self, job: CronJob) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    "INSERT INTO cron_jobs (id, name, spec, paused, created_at, updated_at, next_run)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
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

        try:
            await self._db.run(write)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"a cron job named {job.name!r} exists already") from exc

    async def jobs(self, now: int) -> list[CronJob]:
        query = f"SELECT {_JOB} FROM cron_jobs j ORDER BY j.created_at, j.rowid"
        return await self._db.run(lambda db: [job_of(row) for row in db.execute(query, (now,))])

    async def job(self, job_id: str, now: int) -> CronJob | None:
        return await self._one("j.id = ?", job_id, now)

    async def job_named(self, name: str, now: int) -> CronJob | None:
        return await self._one("j.name = ?", name, now)

    async def _one(self, where: str, value: str, now: int) -> CronJob | None:
        query = f"SELECT {_JOB} FROM cron_jobs j WHERE {where}"
        row = await self._db.run(lambda db: db.execute(query, (now, value)).fetchone())
        return None if row is None else job_of(row)

    async def save_job(self, job: CronJob, since: int) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                return bool(
                    db.execute(
                        "UPDATE cron_jobs SET spec = ?, paused = ?, next_run = ?, updated_at = ?"
                        " WHERE id = ? AND updated_at = ?",
                        (job.spec.to_json(), job.paused, job.next_run, job.updated_at, job.id, since),
                    ).rowcount
                )

        return await self._db.run(write)

    async def delete_job(self, job_id: str) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):  # its history goes with it (ON DELETE CASCADE)
                return bool(db.execute("DELETE FROM cron_jobs WHERE id = ?", (job_id,)).rowcount)

        return await self._db.run(write)

    async def due(self, now: int) -> list[CronJob]:
        query = f"SELECT {_JOB} FROM cron_jobs j WHERE j.next_run <= ? ORDER BY j.next_run"
        return await self._db.run(lambda db: [job_of(row) for row in db.execute(query, (now, now))])

    async def next_due(self) -> int | None:
        row = await self._db.run(lambda db: db.execute("SELECT MIN(next_run) FROM cron_jobs").fetchone())
        return None if row[0] is None else int(row[0])

    async def claim(
        self, job_id: str, due: int, next_run: int | None, firing: CronExecution | None
    ) -> CronExecution | None:
        def write(db: sqlite3.Connection) -> CronExecution | None:
            with transaction(db):
                moved = db.execute(
                    "UPDATE cron_jobs SET next_run = ? WHERE id = ? AND next_run = ?", (next_run, job_id, due)
                ).rowcount
                if not moved or firing is None:
                    return None
                stored = firing
                if _held(db, firing):
                    stored = firing.closed(ExecutionStatus.CANCELLED, firing.started_at, error=OVERLAP)
                _record(db, stored)
                return stored

        return await self._db.run(write)

    async def start(self, execution: CronExecution) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                if db.execute("SELECT 1 FROM cron_jobs WHERE id = ?", (execution.job_id,)).fetchone() is None:
                    raise NotFound(f"no cron job has the id {execution.job_id!r}")
                if _held(db, execution):
                    return False
                _record(db, execution)
                return True

        return await self._db.run(write)

    async def renew(self, execution: CronExecution, lease_until: int) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                return bool(
                    db.execute(
                        "UPDATE cron_executions SET lease_until = ? WHERE id = ? AND owner = ? AND status = ?",
                        (lease_until, execution.id, execution.owner, _RUNNING),
                    ).rowcount
                )

        return await self._db.run(write)

    async def finish(self, execution: CronExecution) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                return _close(db, execution)

        return await self._db.run(write)

    async def abandon(self, now: int, error: str) -> int:
        def write(db: sqlite3.Connection) -> int:
            with transaction(db):
                rows = db.execute(
                    f"SELECT {EXECUTION_COLUMNS} FROM cron_executions WHERE status = ? AND lease_until < ?",
                    (_RUNNING, now),
                ).fetchall()
                for row in rows:
                    stale = execution_of(row)
                    _close(db, stale.closed(ExecutionStatus.FAILED, stale.lease_until, error=error))
                return len(rows)

        return await self._db.run(write)

    async def history(self, job_id: str, limit: int) -> list[CronExecution]:
        query = (
            f"SELECT {EXECUTION_COLUMNS} FROM cron_executions WHERE job_id = ?"
            " ORDER BY started_at DESC, rowid DESC LIMIT ?"
        )
        return await self._db.run(
            lambda db: [execution_of(row) for row in db.execute(query, (job_id, limit))]
        )


def _held(db: sqlite3.Connection, firing: CronExecution) -> bool:
    """Whether another firing of the job holds its lease when `firing` starts."""
    return db.execute(_HELD, (firing.job_id, firing.started_at)).fetchone() is not None


def _record(db: sqlite3.Connection, firing: CronExecution) -> None:
    """Insert a firing's record and, when it runs, set its job's last_run."""
    db.execute(
        f"INSERT INTO cron_executions ({EXECUTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        execution_row(firing),
    )
    if firing.status is ExecutionStatus.RUNNING:
        db.execute("UPDATE cron_jobs SET last_run = ? WHERE id = ?", (firing.started_at, firing.job_id))


def _close(db: sqlite3.Connection, done: CronExecution) -> bool:
    """Write a running firing's outcome, count it in its job and trim the job's history."""
    closed = db.execute(
        "UPDATE cron_executions SET status = ?, ended_at = ?, exit_code = ?, stdout = ?, stderr = ?,"
        " error = ? WHERE id = ? AND status = ?",
        (
            done.status.value,
            done.ended_at,
            done.exit_code,
            done.stdout,
            done.stderr,
            done.error,
            done.id,
            _RUNNING,
        ),
    ).rowcount
    if not closed:
        return False
    failed = int(done.status is not ExecutionStatus.SUCCESS)
    db.execute(
        "UPDATE cron_jobs SET run_count = run_count + 1, fail_count = fail_count + ? WHERE id = ?",
        (failed, done.job_id),
    )
    db.execute(
        "DELETE FROM cron_executions WHERE job_id = ? AND id NOT IN (SELECT id FROM cron_executions"
        " WHERE job_id = ? ORDER BY started_at DESC, rowid DESC LIMIT ?)",
        (done.job_id, done.job_id, HISTORY_KEPT),
    )
    return True
