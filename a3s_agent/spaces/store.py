"""SQLite persistence of spaces, runs and their events (`<data_dir>/spaces.db`, WAL mode, commits
synced as the session store's are: `A3S_DURABILITY`).

The connection lives on one worker thread (`core/sqlite.py`) and each method is one hop to it. A run's events are
written in one transaction when an execution segment ends (paused, completed or cancelled), not
one commit per event; a paused run keeps its remaining operations and its policy, so a new
process can resume it. One process uses the file at a time, so runs need no lease
(`storage.py`; `postgres_store.py` is the store replicas share).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..base.errors import AlreadyExists, NotFound
from ..base.sqlite import Database, Durability, transaction
from .storage import RunRecord, SpaceDeletion, SpaceRecord

# Each entry moves the schema one version up; PRAGMA user_version records where a file is.
_MIGRATIONS: list[str] = [
    """
    CREATE TABLE spaces (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        policy TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        space_id TEXT NOT NULL REFERENCES spaces(id) ON DELETE CASCADE,
        status TEXT NOT NULL,
        policy TEXT NOT NULL,
        pending TEXT,
        event_count INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE INDEX runs_by_status ON runs(status);
    CREATE TABLE events (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    """,
]


class SpacesStore:
    """The SQLite `SpacesStorage`."""

    def __init__(self, path: Path, durability: Durability = "full") -> None:
        self.path = path
        # What was asked for until `open`; then what the connection reports (PRAGMA synchronous).
        self.durability: str = durability
        self._db = Database(path, _MIGRATIONS, durability, "spaces")

    async def open(self) -> None:
        self.durability = await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def insert_space(self, space: SpaceRecord, most: int) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "INSERT INTO spaces (id, workspace, policy, created_at)"
                " SELECT ?, ?, ?, ? WHERE (SELECT count(*) FROM spaces) < ?",
                (space.id, space.workspace, json.dumps(space.policy), space.created_at, most),
            )
            return cursor.rowcount == 1

        try:
            return await self._db.run(write)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"space {space.id!r} already exists") from exc

    async def get_space(self, space_id: str) -> SpaceRecord | None:
        row = await self._db.run(
            lambda db: db.execute(
                "SELECT id, workspace, policy, created_at FROM spaces WHERE id = ?", (space_id,)
            ).fetchone()
        )
        return None if row is None else SpaceRecord(row[0], row[1], json.loads(row[2]), row[3])

    async def delete_space(self, space_id: str) -> SpaceDeletion:
        def write(db: sqlite3.Connection) -> SpaceDeletion:
            with transaction(db):
                running = "SELECT 1 FROM runs WHERE space_id = ? AND status = 'running' LIMIT 1"
                if db.execute(running, (space_id,)).fetchone() is not None:
                    return "running"
                deleted = db.execute(
                    "DELETE FROM spaces WHERE id = ?", (space_id,)
                ).rowcount  # runs, events: cascade
            return "deleted" if deleted == 1 else "missing"

        return await self._db.run(write)

    async def insert_run(self, run: RunRecord) -> None:
        try:
            await self._db.run(
                lambda db: db.execute(
                    "INSERT INTO runs (id, space_id, status, policy, pending, event_count, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, NULL, 0, ?, ?)",
                    (
                        run.id,
                        run.space_id,
                        run.status,
                        json.dumps(run.policy),
                        run.created_at,
                        run.updated_at,
                    ),
                )
            )
        except sqlite3.IntegrityError as exc:  # the space's foreign key: it was deleted
            raise NotFound(f"space {run.space_id!r} does not exist") from exc

    async def get_run(self, run_id: str, *, with_events: bool = False) -> tuple[RunRecord, list[Any]] | None:
        """The run and, if asked, its events in order; None when there is no such run."""

        def read(db: sqlite3.Connection) -> tuple[RunRecord, list[Any]] | None:
            row = db.execute(
                "SELECT id, space_id, status, policy, pending, event_count, created_at, updated_at"
                " FROM runs WHERE id = ?",
                (run_id,),
            ).fetchone()
            if row is None:
                return None
            run = RunRecord(
                row[0], row[1], row[2], json.loads(row[3]), row[4] and json.loads(row[4]), *row[5:]
            )
            if not with_events:
                return run, []
            rows = db.execute("SELECT data FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
            return run, [json.loads(data) for (data,) in rows]

        return await self._db.run(read)

    async def claim_run(self, run_id: str, expected: str, status: str, updated_at: str) -> bool:
        """Move the run from `expected` to `status` (dropping a pending approval); False if it was not in `expected`."""

        def write(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE runs SET status = ?, updated_at = ?"
                + (", pending = NULL" if status != "running" else "")
                + " WHERE id = ? AND status = ?",
                (status, updated_at, run_id, expected),
            )
            return cursor.rowcount == 1

        return await self._db.run(write)

    async def save_segment(
        self,
        run_id: str,
        status: str,
        pending: dict[str, Any] | None,
        events: Sequence[Any],
        first_seq: int,
        updated_at: str,
    ) -> bool:
        """Record how an execution segment ended and its events, numbered from `first_seq`, at once."""

        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                db.executemany(
                    "INSERT INTO events (run_id, seq, data) VALUES (?, ?, ?)",
                    ((run_id, seq, json.dumps(event)) for seq, event in enumerate(events, first_seq)),
                )
                cursor = db.execute(
                    "UPDATE runs SET status = ?, pending = ?, event_count = ?, updated_at = ? WHERE id = ?",
                    (
                        status,
                        None if pending is None else json.dumps(pending),
                        first_seq + len(events),
                        updated_at,
                        run_id,
                    ),
                )
            return cursor.rowcount == 1

        return await self._db.run(write)

    async def fail_running(self, event: dict[str, Any], updated_at: str) -> int:
        """Mark runs left `running` by a process that stopped as `error`, adding `event` to each
        (every running run: call it before running any)."""

        def write(db: sqlite3.Connection) -> int:
            with transaction(db):
                rows = db.execute("SELECT id, event_count FROM runs WHERE status = 'running'").fetchall()
                data = json.dumps(event)
                db.executemany(
                    "INSERT INTO events (run_id, seq, data) VALUES (?, ?, ?)",
                    [(run_id, count, data) for run_id, count in rows],
                )
                db.execute(
                    "UPDATE runs SET status = 'error', pending = NULL, event_count = event_count + 1,"
                    " updated_at = ? WHERE status = 'running'",
                    (updated_at,),
                )
            return len(rows)

        return await self._db.run(write)
