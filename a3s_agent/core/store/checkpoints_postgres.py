"""Checkpoints on PostgreSQL (core/store/checkpoints.py), in the session store's database: its table
is a migration of postgres_schema.py, its statements run on that store's pooled connections."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any

from psycopg import AsyncConnection

from .checkpoints import COLUMNS, CheckpointRecord, record_of
from .protocol import LogEntry

SCHEMA = """
    CREATE TABLE checkpoints (
        session_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        workspace TEXT NOT NULL,
        tree TEXT NOT NULL,
        kind TEXT NOT NULL,
        message_count BIGINT NOT NULL,
        archived_count BIGINT NOT NULL,
        user_message TEXT NOT NULL,
        changed TEXT NOT NULL,
        skipped TEXT NOT NULL,
        outside TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE INDEX checkpoints_by_tree ON checkpoints(workspace, tree);
    REVOKE ALL ON checkpoints FROM PUBLIC;
"""

Transaction = Callable[[Sequence[LogEntry]], AbstractAsyncContextManager[AsyncConnection[Any]]]
Connect = Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]]
Append = Callable[[AsyncConnection[Any], Sequence[LogEntry]], Awaitable[None]]


class PostgresCheckpoints:
    def __init__(self, transaction: Transaction, connection: Connect, append: Append) -> None:
        self._transaction = transaction
        self._connection = connection
        self._append = append

    async def add(self, record: CheckpointRecord, log: Sequence[LogEntry]) -> CheckpointRecord | None:
        async with self._transaction(log) as conn:
            await self._append(conn, log)
            seq = log[-1].seq
            if not seq:
                return None
            session_id, *rest = record.row()
            await conn.execute(
                f"INSERT INTO checkpoints ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (session_id, seq, *rest),
            )
        return replace(record, seq=seq)

    async def archived_count(self, session_id: str) -> int:
        async with self._connection() as conn:
            found = await (
                await conn.execute(
                    "SELECT COUNT(*) FROM messages WHERE session_id = %s AND archived", (session_id,)
                )
            ).fetchone()
        return int(found[0]) if found else 0

    async def of_session(self, session_id: str) -> list[CheckpointRecord]:
        async with self._connection() as conn:
            rows = await (
                await conn.execute(
                    f"SELECT {COLUMNS} FROM checkpoints WHERE session_id = %s ORDER BY seq", (session_id,)
                )
            ).fetchall()
        return [record_of(row) for row in rows]

    async def get(self, session_id: str, seq: int) -> CheckpointRecord | None:
        async with self._connection() as conn:
            row = await (
                await conn.execute(
                    f"SELECT {COLUMNS} FROM checkpoints WHERE session_id = %s AND seq = %s", (session_id, seq)
                )
            ).fetchone()
        return None if row is None else record_of(row)

    async def prune(self, session_id: str, keep: int, older_than: int) -> list[str]:
        return await self._remove(
            "DELETE FROM checkpoints WHERE session_id = %s AND seq <> (SELECT MAX(seq) FROM checkpoints"
            " WHERE session_id = %s) AND (created_at < %s OR seq NOT IN (SELECT seq FROM checkpoints"
            " WHERE session_id = %s ORDER BY seq DESC LIMIT %s)) RETURNING workspace, tree",
            (session_id, session_id, older_than, session_id, keep),
        )

    async def forget(self, session_id: str) -> list[str]:
        return await self._remove(
            "DELETE FROM checkpoints WHERE session_id = %s RETURNING workspace, tree", (session_id,)
        )

    async def _remove(self, statement: str, values: tuple[object, ...]) -> list[str]:
        """Run a DELETE ... RETURNING workspace, tree; the trees no checkpoint names any more."""
        async with self._transaction(()) as conn:
            gone = await (await conn.execute(statement, values)).fetchall()
            unused = []
            for workspace, tree in set(gone):
                named = await (
                    await conn.execute(
                        "SELECT 1 FROM checkpoints WHERE workspace = %s AND tree = %s LIMIT 1",
                        (workspace, tree),
                    )
                ).fetchone()
                if named is None:
                    unused.append(tree)
        return unused
