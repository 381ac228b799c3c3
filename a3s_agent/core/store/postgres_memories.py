"""Memories on PostgreSQL (core/store/memories.py): the `memories` table, searched through an
English tsvector of content and tags (GIN-indexed), shared by every replica on the database.

As on SQLite, `private_to` (a working memory's session) and `short_term_of` are foreign keys to
the session, so destroying it removes its working memories and empties its short-term memory. Adds
to one workspace are serialised by an advisory lock, so its bound (checked against
`memory_counts`, kept by triggers) and a session's working-memory bound hold across replicas.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection

from ...base.memories import Memory, MemoryQuery, MemoryScope, MemoryStats, MemoryType
from .memories import (
    COLUMNS,
    DAY_MS,
    DECAY_DAYS,
    Bounds,
    common_filters,
    full,
    memory_from_row,
    query_words,
    score,
)
from .protocol import LogEntry

MEMORY_LOCK_SPACE = 0x0A36
"""Advisory locks on a workspace's memories: (this namespace, hashtext(workspace)); the sessions'
namespace is postgres_schema.py's SESSION_LOCK_SPACE."""

MIGRATION = """
    CREATE TABLE memories (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        workspace TEXT NOT NULL,
        session_id TEXT NOT NULL,
        private_to TEXT REFERENCES sessions(id) ON DELETE CASCADE,
        short_term_of TEXT REFERENCES sessions(id) ON DELETE SET NULL,
        memory_type SMALLINT NOT NULL,
        content TEXT NOT NULL,
        importance DOUBLE PRECISION NOT NULL,
        tags TEXT[] NOT NULL,
        metadata TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        access_count BIGINT NOT NULL DEFAULT 0,
        last_accessed BIGINT,
        search TSVECTOR NOT NULL
    );
    CREATE INDEX memories_shared ON memories(workspace, created_at) WHERE private_to IS NULL;
    CREATE INDEX memories_private ON memories(private_to, created_at) WHERE private_to IS NOT NULL;
    CREATE INDEX memories_short_term ON memories(short_term_of, created_at) WHERE short_term_of IS NOT NULL;
    CREATE INDEX memories_search ON memories USING GIN (search);
    CREATE INDEX memories_tags ON memories USING GIN (tags);
    CREATE TABLE memory_counts (workspace TEXT PRIMARY KEY, shared BIGINT NOT NULL);
    CREATE FUNCTION memories_count() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO memory_counts VALUES (NEW.workspace, 1)
            ON CONFLICT (workspace) DO UPDATE SET shared = memory_counts.shared + 1;
        ELSE
            UPDATE memory_counts SET shared = shared - 1 WHERE workspace = OLD.workspace;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER memories_counted AFTER INSERT ON memories
        FOR EACH ROW WHEN (NEW.private_to IS NULL) EXECUTE FUNCTION memories_count();
    CREATE TRIGGER memories_uncounted AFTER DELETE ON memories
        FOR EACH ROW WHEN (OLD.private_to IS NULL) EXECUTE FUNCTION memories_count();
"""
"""The migration that adds memories (appended to postgres_schema.py's MIGRATIONS)."""

Connection = AsyncConnection[Any]
Transaction = Callable[[Sequence[LogEntry]], AbstractAsyncContextManager[Connection]]
Pooled = Callable[[], AbstractAsyncContextManager[Connection]]
Append = Callable[[Connection, Sequence[LogEntry]], Awaitable[None]]

_SEEN = "(m.private_to = %(session)s OR (m.private_to IS NULL AND m.workspace = %(workspace)s))"
_SHARED = "private_to IS NULL AND workspace = %(workspace)s"
_SHARED_COUNT = "SELECT COALESCE(MAX(shared), 0) FROM memory_counts WHERE workspace = %(workspace)s"
# exp() of a very old memory's age would underflow a double: its recency is 0 either way.
_RECENCY = f"exp(GREATEST((m.created_at - %(now)s) / {DAY_MS}.0 / {DECAY_DAYS}, -700))"


class PostgresMemories:
    def __init__(self, transaction: Transaction, connection: Pooled, append: Append) -> None:
        self._transaction = transaction
        self._connection = connection
        self._append = append

    async def add(self, scope: MemoryScope, memory: Memory, bounds: Bounds, log: Sequence[LogEntry]) -> None:
        private = memory.memory_type is MemoryType.WORKING
        row = {
            **_scope(scope),
            "id": memory.id,
            "private_to": scope.session_id if private else None,
            "short_term_of": None if private else scope.session_id,
            "memory_type": int(memory.memory_type),
            "content": memory.content,
            "importance": memory.importance,
            "tags": memory.tags,
            "metadata": json.dumps(memory.metadata),
            "created_at": memory.created_at,
            "bound": bounds.working if private else bounds.short_term,
        }
        async with self._transaction(log) as conn:
            await conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (MEMORY_LOCK_SPACE, scope.workspace)
            )
            if not private:
                cursor = await conn.execute(_SHARED_COUNT, row)
                counted = await cursor.fetchone()
                if counted is not None and counted[0] >= bounds.per_workspace:
                    raise full(scope, bounds)
            await conn.execute(
                "INSERT INTO memories (id, workspace, session_id, private_to, short_term_of, memory_type,"
                " content, importance, tags, metadata, created_at, search) VALUES (%(id)s, %(workspace)s,"
                " %(session)s, %(private_to)s, %(short_term_of)s, %(memory_type)s, %(content)s,"
                " %(importance)s, %(tags)s, %(metadata)s, %(created_at)s, to_tsvector('english',"
                " %(content)s || ' ' || array_to_string(%(tags)s::text[], ' ')))",
                row,
            )
            if private:  # the least important (then oldest) make room
                await conn.execute(
                    "DELETE FROM memories WHERE seq IN (SELECT seq FROM memories WHERE private_to = %(session)s"
                    " ORDER BY importance DESC, created_at DESC, seq DESC OFFSET %(bound)s)",
                    row,
                )
            else:  # the oldest leave short-term memory, staying long-term
                await conn.execute(
                    "UPDATE memories SET short_term_of = NULL WHERE seq IN (SELECT seq FROM memories"
                    " WHERE short_term_of = %(session)s ORDER BY created_at DESC, seq DESC OFFSET %(bound)s)",
                    row,
                )
            await self._append(conn, log)

    async def get(self, scope: MemoryScope, memory_id: str, now: int) -> Memory | None:
        async with self._transaction(()) as conn:
            cursor = await conn.execute(
                f"UPDATE memories AS m SET access_count = access_count + 1, last_accessed = %(now)s"
                f" WHERE m.id = %(id)s AND {_SEEN} RETURNING {COLUMNS}",
                {"now": now, "id": memory_id, **_scope(scope)},
            )
            row = await cursor.fetchone()
        return None if row is None else memory_from_row(row)

    async def touch(self, ids: Sequence[str], now: int) -> None:
        if ids:
            async with self._transaction(()) as conn:
                await conn.execute(
                    "UPDATE memories SET access_count = access_count + 1, last_accessed = %s WHERE id = ANY(%s)",
                    (now, list(ids)),
                )

    async def search(self, scope: MemoryScope, query: MemoryQuery, now: int) -> tuple[list[Memory], int]:
        params: dict[str, Any] = {"now": now, "limit": query.limit, **_scope(scope)}
        words = query_words(query.text)
        if query.text.strip() and not words:
            return [], 0
        conditions = [_SEEN]
        text = "0.0"
        if words:
            params["match"] = " | ".join(words)
            conditions.append("m.search @@ to_tsquery('english', %(match)s)")
            text = "ts_rank_cd(m.search, to_tsquery('english', %(match)s), 32)"
        if query.tags:
            params["tags"] = list(query.tags)
            conditions.append("m.tags && %(tags)s::text[]")
        if query.types:
            params["types"] = [int(t) for t in query.types]
            conditions.append("m.memory_type = ANY(%(types)s::smallint[])")
        common, values = common_filters(query, lambda name: f"%({name})s")
        conditions += common
        params.update(values)
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {COLUMNS}, COUNT(*) OVER () FROM memories m WHERE {' AND '.join(conditions)}"
                f" ORDER BY {score(query, text, _RECENCY)} DESC, m.seq DESC LIMIT %(limit)s",
                params,
            )
            rows = await cursor.fetchall()
        return [memory_from_row(row) for row in rows], (int(rows[0][-1]) if rows else 0)

    async def delete(self, scope: MemoryScope, memory_id: str) -> bool:
        async with self._transaction(()) as conn:
            cursor = await conn.execute(
                f"DELETE FROM memories AS m WHERE m.id = %(id)s AND {_SEEN}",
                {"id": memory_id, **_scope(scope)},
            )
            return cursor.rowcount > 0

    async def clear(self, scope: MemoryScope, long_term: bool, short_term: bool, working: bool) -> int:
        touched = 0
        params = _scope(scope)
        async with self._transaction(()) as conn:
            if long_term:  # the session's short-term ones are among them
                touched += (await conn.execute(f"DELETE FROM memories WHERE {_SHARED}", params)).rowcount
            elif short_term:
                cursor = await conn.execute(
                    "UPDATE memories SET short_term_of = NULL WHERE short_term_of = %(session)s", params
                )
                touched += cursor.rowcount
            if working:
                touched += (
                    await conn.execute("DELETE FROM memories WHERE private_to = %(session)s", params)
                ).rowcount
        return touched

    async def stats(self, scope: MemoryScope) -> MemoryStats:
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT ({_SHARED_COUNT}),"
                " (SELECT COUNT(*) FROM memories WHERE short_term_of = %(session)s),"
                " (SELECT COUNT(*) FROM memories WHERE private_to = %(session)s)",
                _scope(scope),
            )
            row = await cursor.fetchone()
        assert row is not None  # a SELECT of scalars has its row
        return MemoryStats(*(int(count) for count in row))


def _scope(scope: MemoryScope) -> dict[str, Any]:
    return {"workspace": scope.workspace, "session": scope.session_id}
