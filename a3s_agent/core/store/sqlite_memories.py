"""Memories on SQLite (core/store/memories.py): the `memories` table, searched through its FTS5
index `memories_fts` (content and tags, porter-stemmed), kept in step by triggers, as is `memory_counts`, the shared memories of each workspace (its bound
is checked without counting them).

A working memory is `private_to` its session and a kept memory is in its session's short-term
memory while `short_term_of` names it: both are foreign keys, so destroying the session removes its
working memories and empties its short-term memory in the same transaction.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from ...base.memories import Memory, MemoryQuery, MemoryScope, MemoryStats, MemoryType
from ...base.sqlite import Database, transaction
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

MIGRATION = """
    CREATE TABLE memories (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        workspace TEXT NOT NULL,
        session_id TEXT NOT NULL,
        private_to TEXT REFERENCES sessions(id) ON DELETE CASCADE,
        short_term_of TEXT REFERENCES sessions(id) ON DELETE SET NULL,
        memory_type INTEGER NOT NULL,
        content TEXT NOT NULL,
        importance REAL NOT NULL,
        tags TEXT NOT NULL,
        metadata TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_accessed INTEGER
    );
    CREATE INDEX memories_shared ON memories(workspace, created_at) WHERE private_to IS NULL;
    CREATE INDEX memories_private ON memories(private_to, created_at) WHERE private_to IS NOT NULL;
    CREATE INDEX memories_short_term ON memories(short_term_of, created_at) WHERE short_term_of IS NOT NULL;
    CREATE VIRTUAL TABLE memories_fts USING fts5(
        content, tags, content='memories', content_rowid='seq', tokenize='porter unicode61'
    );
    CREATE TRIGGER memories_indexed AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts (rowid, content, tags) VALUES (new.seq, new.content, new.tags);
    END;
    CREATE TRIGGER memories_unindexed AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, content, tags)
        VALUES ('delete', old.seq, old.content, old.tags);
    END;
    CREATE TABLE memory_counts (workspace TEXT PRIMARY KEY, shared INTEGER NOT NULL);
    CREATE TRIGGER memories_counted AFTER INSERT ON memories WHEN new.private_to IS NULL BEGIN
        INSERT INTO memory_counts VALUES (new.workspace, 1)
        ON CONFLICT (workspace) DO UPDATE SET shared = shared + 1;
    END;
    CREATE TRIGGER memories_uncounted AFTER DELETE ON memories WHEN old.private_to IS NULL BEGIN
        UPDATE memory_counts SET shared = shared - 1 WHERE workspace = old.workspace;
    END
"""
"""The migration that adds memories (appended to sqlite_store.py's MIGRATIONS)."""

AppendLog = Callable[[sqlite3.Connection, Sequence[LogEntry]], None]

_SEEN = "(m.private_to = :session OR (m.private_to IS NULL AND m.workspace = :workspace))"
_SHARED = "private_to IS NULL AND workspace = ?"
_SHARED_COUNT = "SELECT COALESCE(MAX(shared), 0) FROM memory_counts WHERE workspace = ?"
_RECENCY = f"exp((m.created_at - :now) / {DAY_MS}.0 / {DECAY_DAYS})"


class SqliteMemories:
    def __init__(self, db: Database, append_log: AppendLog) -> None:
        self._db = db
        self._append_log = append_log

    async def add(self, scope: MemoryScope, memory: Memory, bounds: Bounds, log: Sequence[LogEntry]) -> None:
        private = memory.memory_type is MemoryType.WORKING
        row = {
            "id": memory.id,
            "workspace": scope.workspace,
            "session": scope.session_id,
            "private_to": scope.session_id if private else None,
            "short_term_of": None if private else scope.session_id,
            "memory_type": int(memory.memory_type),
            "content": memory.content,
            "importance": memory.importance,
            "tags": json.dumps(memory.tags),
            "metadata": json.dumps(memory.metadata),
            "created_at": memory.created_at,
        }

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                if not private:
                    (count,) = db.execute(_SHARED_COUNT, (scope.workspace,)).fetchone()
                    if count >= bounds.per_workspace:
                        raise full(scope, bounds)
                db.execute(
                    "INSERT INTO memories (id, workspace, session_id, private_to, short_term_of, memory_type,"
                    " content, importance, tags, metadata, created_at) VALUES (:id, :workspace, :session,"
                    " :private_to, :short_term_of, :memory_type, :content, :importance, :tags, :metadata,"
                    " :created_at)",
                    row,
                )
                if private:  # the least important (then oldest) make room
                    db.execute(
                        "DELETE FROM memories WHERE seq IN (SELECT seq FROM memories WHERE private_to = ?"
                        " ORDER BY importance DESC, created_at DESC, seq DESC LIMIT -1 OFFSET ?)",
                        (scope.session_id, bounds.working),
                    )
                else:  # the oldest leave short-term memory, staying long-term
                    db.execute(
                        "UPDATE memories SET short_term_of = NULL WHERE seq IN (SELECT seq FROM memories"
                        " WHERE short_term_of = ? ORDER BY created_at DESC, seq DESC LIMIT -1 OFFSET ?)",
                        (scope.session_id, bounds.short_term),
                    )
                self._append_log(db, log)

        await self._db.run(write)

    async def get(self, scope: MemoryScope, memory_id: str, now: int) -> Memory | None:
        def read(db: sqlite3.Connection) -> Memory | None:
            with transaction(db):
                db.execute(
                    f"UPDATE memories AS m SET access_count = access_count + 1, last_accessed = :now"
                    f" WHERE m.id = :id AND {_SEEN}",
                    {"now": now, "id": memory_id, **_scope(scope)},
                )
                row = db.execute(f"SELECT {COLUMNS} FROM memories m WHERE m.id = :id AND {_SEEN}",
                                 {"id": memory_id, **_scope(scope)}).fetchone()  # fmt: skip
            return None if row is None else memory_from_row(row)

        return await self._db.run(read)

    async def touch(self, ids: Sequence[str], now: int) -> None:
        if not ids:
            return

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.executemany(
                    "UPDATE memories SET access_count = access_count + 1, last_accessed = ? WHERE id = ?",
                    [(now, memory_id) for memory_id in ids],
                )

        await self._db.run(write)

    async def search(self, scope: MemoryScope, query: MemoryQuery, now: int) -> tuple[list[Memory], int]:
        params: dict[str, Any] = {"now": now, "limit": query.limit, **_scope(scope)}
        words = query_words(query.text)
        if query.text.strip() and not words:
            return [], 0
        if words:
            params["match"] = " OR ".join(f'"{word}"' for word in words)
            source = "memories_fts f JOIN memories m ON m.seq = f.rowid"
            conditions = ["memories_fts MATCH :match"]
            text = "(-bm25(memories_fts)) / (1.0 - bm25(memories_fts))"
        else:
            source, conditions, text = "memories m", [], "0.0"
        conditions.append(_SEEN)
        if query.tags:
            tags = {f"tag{i}": tag for i, tag in enumerate(query.tags)}
            params.update(tags)
            listed = ", ".join(f":{name}" for name in tags)
            conditions.append(f"EXISTS (SELECT 1 FROM json_each(m.tags) t WHERE t.value IN ({listed}))")
        if query.types:
            conditions.append(f"m.memory_type IN ({', '.join(str(int(t)) for t in query.types)})")
        common, values = common_filters(query, lambda name: f":{name}")
        conditions += common
        params.update(values)
        # FTS5's bm25() is not allowed beside a window function: the matches are ranked first.
        sql = (
            f"SELECT *, COUNT(*) OVER () FROM (SELECT {COLUMNS}, {score(query, text, _RECENCY)} AS score, m.seq AS seq"
            f" FROM {source} WHERE {' AND '.join(conditions)}) ORDER BY score DESC, seq DESC LIMIT :limit"
        )

        def read(db: sqlite3.Connection) -> tuple[list[Memory], int]:
            _with_exp(db)
            rows = db.execute(sql, params).fetchall()
            return [memory_from_row(row) for row in rows], (rows[0][-1] if rows else 0)

        return await self._db.run(read)

    async def delete(self, scope: MemoryScope, memory_id: str) -> bool:
        sql = f"DELETE FROM memories AS m WHERE m.id = :id AND {_SEEN}"
        removed = await self._db.run(lambda db: db.execute(sql, {"id": memory_id, **_scope(scope)}).rowcount)
        return bool(removed)

    async def clear(self, scope: MemoryScope, long_term: bool, short_term: bool, working: bool) -> int:
        def write(db: sqlite3.Connection) -> int:
            touched = 0
            with transaction(db):
                if long_term:  # the session's short-term ones are among them
                    touched += db.execute(
                        f"DELETE FROM memories WHERE {_SHARED}", (scope.workspace,)
                    ).rowcount
                elif short_term:
                    touched += db.execute(
                        "UPDATE memories SET short_term_of = NULL WHERE short_term_of = ?",
                        (scope.session_id,),
                    ).rowcount
                if working:
                    touched += db.execute(
                        "DELETE FROM memories WHERE private_to = ?", (scope.session_id,)
                    ).rowcount
            return touched

        return await self._db.run(write)

    async def stats(self, scope: MemoryScope) -> MemoryStats:
        def read(db: sqlite3.Connection) -> MemoryStats:
            counts = db.execute(
                f"SELECT ({_SHARED_COUNT}),"
                " (SELECT COUNT(*) FROM memories WHERE short_term_of = ?),"
                " (SELECT COUNT(*) FROM memories WHERE private_to = ?)",
                (scope.workspace, scope.session_id, scope.session_id),
            ).fetchone()
            return MemoryStats(*counts)

        return await self._db.run(read)


def _scope(scope: MemoryScope) -> dict[str, str]:
    return {"workspace": scope.workspace, "session": scope.session_id}


def _with_exp(db: sqlite3.Connection) -> None:
    """SQLite built without its math functions gets exp() from Python's math (once per connection)."""
    try:
        db.execute("SELECT exp(0)")
    except sqlite3.OperationalError:
        db.create_function("exp", 1, math.exp, deterministic=True)
