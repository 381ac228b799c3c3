"""A2A tasks on SQLite (core/store/a2a_tasks.py), in the session store's file: its table is a
migration of sqlite_store.py, its statements run on that store's connection."""

from __future__ import annotations

import sqlite3

from ...base.sqlite import Database, transaction
from .a2a_tasks import COLUMNS, REPLACED, A2aTaskRecord, record_of

SCHEMA = """
    CREATE TABLE a2a_tasks (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        context_id TEXT NOT NULL,
        ended INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        task BLOB NOT NULL
    );
    CREATE INDEX a2a_tasks_by_owner ON a2a_tasks(owner, updated_at)
"""


class SqliteA2aTasks:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def save_a2a_task(self, record: A2aTaskRecord, keep: int) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    f"INSERT INTO a2a_tasks ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE"
                    f" SET {REPLACED} WHERE NOT a2a_tasks.ended",
                    record.row(),
                )
                (count,) = db.execute("SELECT COUNT(*) FROM a2a_tasks").fetchone()
                if count > keep:
                    db.execute(
                        "DELETE FROM a2a_tasks WHERE id IN (SELECT id FROM a2a_tasks WHERE ended"
                        " ORDER BY updated_at, id LIMIT ?)",
                        (count - keep,),
                    )

        await self._db.run(write)

    async def load_a2a_task(self, task_id: str) -> A2aTaskRecord | None:
        def read(db: sqlite3.Connection) -> A2aTaskRecord | None:
            row = db.execute(f"SELECT {COLUMNS} FROM a2a_tasks WHERE id = ?", (task_id,)).fetchone()
            return None if row is None else record_of(row)

        return await self._db.run(read)

    async def a2a_tasks_of(self, owner: str, context_id: str) -> list[A2aTaskRecord]:
        def read(db: sqlite3.Connection) -> list[A2aTaskRecord]:
            rows = db.execute(
                f"SELECT {COLUMNS} FROM a2a_tasks WHERE owner = ? AND (? = '' OR context_id = ?)"
                " ORDER BY updated_at DESC, id DESC",
                (owner, context_id, context_id),
            ).fetchall()
            return [record_of(row) for row in rows]

        return await self._db.run(read)

    async def delete_a2a_task(self, task_id: str) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute("DELETE FROM a2a_tasks WHERE id = ?", (task_id,))

        await self._db.run(write)
