"""A2A tasks on PostgreSQL (core/store/a2a_tasks.py), in the session store's database: its table is a
migration of postgres_schema.py, its statements run on that store's pooled connections."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection

from .a2a_tasks import COLUMNS, REPLACED, A2aTaskRecord, record_of

SCHEMA = """
    CREATE TABLE a2a_tasks (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        context_id TEXT NOT NULL,
        ended BOOLEAN NOT NULL,
        updated_at BIGINT NOT NULL,
        task BYTEA NOT NULL
    );
    CREATE INDEX a2a_tasks_by_owner ON a2a_tasks(owner, updated_at);
    REVOKE ALL ON a2a_tasks FROM PUBLIC;
"""

Connect = Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]]


class PostgresA2aTasks:
    def __init__(self, connection: Connect) -> None:
        self._connection = connection

    async def save_a2a_task(self, record: A2aTaskRecord, keep: int) -> None:
        async with self._connection() as conn, conn.transaction():
            await conn.execute(
                f"INSERT INTO a2a_tasks ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE"
                f" SET {REPLACED} WHERE NOT a2a_tasks.ended",
                record.row(),
            )
            row = await (await conn.execute("SELECT COUNT(*) FROM a2a_tasks")).fetchone()
            excess = (row[0] if row else 0) - keep
            if excess > 0:
                await conn.execute(
                    "DELETE FROM a2a_tasks WHERE id IN (SELECT id FROM a2a_tasks WHERE ended"
                    " ORDER BY updated_at, id LIMIT %s)",
                    (excess,),
                )

    async def load_a2a_task(self, task_id: str) -> A2aTaskRecord | None:
        async with self._connection() as conn:
            row = await (
                await conn.execute(f"SELECT {COLUMNS} FROM a2a_tasks WHERE id = %s", (task_id,))
            ).fetchone()
        return None if row is None else record_of(row)

    async def a2a_tasks_of(self, owner: str, context_id: str) -> list[A2aTaskRecord]:
        async with self._connection() as conn:
            rows = await (
                await conn.execute(
                    f"SELECT {COLUMNS} FROM a2a_tasks WHERE owner = %s AND (%s = '' OR context_id = %s)"
                    " ORDER BY updated_at DESC, id DESC",
                    (owner, context_id, context_id),
                )
            ).fetchall()
        return [record_of(row) for row in rows]

    async def delete_a2a_task(self, task_id: str) -> None:
        async with self._connection() as conn:
            await conn.execute("DELETE FROM a2a_tasks WHERE id = %s", (task_id,))
