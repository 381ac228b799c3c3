"""Checkpoints on SQLite (core/store/checkpoints.py), in the session store's file: its table is a
migration of sqlite_store.py, its statements run on that store's connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace

from ...base.sqlite import Database, transaction
from .checkpoints import COLUMNS, CheckpointRecord, record_of
from .protocol import LogEntry

SCHEMA = """
    CREATE TABLE checkpoints (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        workspace TEXT NOT NULL,
        tree TEXT NOT NULL,
        kind TEXT NOT NULL,
        message_count INTEGER NOT NULL,
        archived_count INTEGER NOT NULL,
        user_message TEXT NOT NULL,
        changed TEXT NOT NULL,
        skipped TEXT NOT NULL,
        outside TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE INDEX checkpoints_by_tree ON checkpoints(workspace, tree)
"""

AppendLog = Callable[[sqlite3.Connection, Sequence[LogEntry]], None]


class SqliteCheckpoints:
    def __init__(self, db: Database, append_log: AppendLog) -> None:
        self._db = db
        self._append_log = append_log

    async def add(self, record: CheckpointRecord, log: Sequence[LogEntry]) -> CheckpointRecord | None:
        def write(db: sqlite3.Connection) -> CheckpointRecord | None:
            with transaction(db):
                self._append_log(db, log)
                session_id, *rest = record.row()
                db.execute(
                    f"INSERT INTO checkpoints ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, log[-1].seq, *rest),
                )
                return replace(record, seq=log[-1].seq)

        return await self._db.run(write)

    async def archived_count(self, session_id: str) -> int:
        query = "SELECT COUNT(*) FROM messages WHERE session_id = ? AND archived = 1"
        row = await self._db.run(lambda db: db.execute(query, (session_id,)).fetchone())
        return int(row[0])

    async def of_session(self, session_id: str) -> list[CheckpointRecord]:
        query = f"SELECT {COLUMNS} FROM checkpoints WHERE session_id = ? ORDER BY seq"
        return await self._db.run(lambda db: [record_of(row) for row in db.execute(query, (session_id,))])

    async def get(self, session_id: str, seq: int) -> CheckpointRecord | None:
        query = f"SELECT {COLUMNS} FROM checkpoints WHERE session_id = ? AND seq = ?"
        row = await self._db.run(lambda db: db.execute(query, (session_id, seq)).fetchone())
        return None if row is None else record_of(row)

    async def prune(self, session_id: str, keep: int, older_than: int) -> list[str]:
        return await self._remove(
            "DELETE FROM checkpoints WHERE session_id = ? AND seq NOT IN (SELECT seq FROM checkpoints"
            " WHERE session_id = ? ORDER BY seq DESC LIMIT 1) AND (created_at < ? OR seq NOT IN"
            " (SELECT seq FROM checkpoints WHERE session_id = ? ORDER BY seq DESC LIMIT ?))"
            " RETURNING workspace, tree",
            (session_id, session_id, older_than, session_id, keep),
        )

    async def forget(self, session_id: str) -> list[str]:
        return await self._remove(
            "DELETE FROM checkpoints WHERE session_id = ? RETURNING workspace, tree", (session_id,)
        )

    async def _remove(self, statement: str, values: tuple[object, ...]) -> list[str]:
        """Run a DELETE ... RETURNING workspace, tree; the trees no checkpoint names any more."""

        def write(db: sqlite3.Connection) -> list[str]:
            with transaction(db):
                gone = db.execute(statement, values).fetchall()
                return [
                    tree
                    for workspace, tree in set(gone)
                    if db.execute(
                        "SELECT 1 FROM checkpoints WHERE workspace = ? AND tree = ? LIMIT 1",
                        (workspace, tree),
                    ).fetchone()
                    is None
                ]

        return await self._db.run(write)
