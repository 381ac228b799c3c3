"""SQLite store over aiosqlite, in WAL mode.

Every write is one transaction, so a crash (even `kill -9`) never leaves a
half-written session. `synchronous=NORMAL` in WAL mode keeps committed data
safe across process crashes; only a power loss may drop the last commits.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite

from .errors import AlreadyExists
from .models import Message, Session, SessionConfig, SessionState, Usage

# Each entry moves the schema one version up; PRAGMA user_version records where a file is.
_MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        config TEXT NOT NULL,
        state INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        data TEXT NOT NULL,
        archived INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, archived, seq);
    """,
]


class SqliteStore:
    backend = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        # One connection is shared by every coroutine: writes take turns so that one
        # coroutine's statements never land inside another's open transaction.
        self._write_lock = asyncio.Lock()

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path, isolation_level=None)
        await self.db.execute("PRAGMA journal_mode=WAL")
        await self.db.execute("PRAGMA synchronous=NORMAL")
        await self.db.execute("PRAGMA foreign_keys=ON")
        await self._migrate()

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def _migrate(self) -> None:
        async with self.db.execute("PRAGMA user_version") as cursor:
            (version,) = await cursor.fetchone()  # type: ignore[misc]
        for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
            await self.db.executescript(f"BEGIN; {script}; PRAGMA user_version={number}; COMMIT;")

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._write_lock:
            await self.db.execute("BEGIN")
            try:
                yield self.db
            except BaseException:
                await self.db.execute("ROLLBACK")
                raise
            await self.db.execute("COMMIT")

    async def create_session(self, session: Session, messages: list[Message]) -> None:
        try:
            async with self._transaction() as db:
                await db.execute(
                    "INSERT INTO sessions (id, config, state, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                    (
                        session.id,
                        json.dumps(session.config.to_storable()),
                        int(session.state),
                        session.created_at,
                        session.updated_at,
                    ),
                )
                await self._insert_messages(session.id, messages, session.created_at)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"session {session.id!r} already exists") from exc

    async def list_sessions(self) -> list[Session]:
        query = """
            SELECT s.id, s.config, s.state, s.created_at, s.updated_at, s.prompt_tokens,
                   s.completion_tokens,
                   (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND m.archived = 0)
            FROM sessions s ORDER BY s.created_at, s.id
        """
        async with self.db.execute(query) as cursor:
            rows = await cursor.fetchall()
        return [
            Session(
                id=row[0],
                config=SessionConfig.from_storable(json.loads(row[1])),
                state=SessionState(row[2]),
                created_at=row[3],
                updated_at=row[4],
                usage=Usage(prompt_tokens=row[5], completion_tokens=row[6]),
                message_count=row[7],
            )
            for row in rows
        ]

    async def update_session(self, session: Session) -> None:
        async with self._transaction() as db:
            await db.execute(
                "UPDATE sessions SET config = ?, state = ?, updated_at = ?, prompt_tokens = ?,"
                " completion_tokens = ? WHERE id = ?",
                (
                    json.dumps(session.config.to_storable()),
                    int(session.state),
                    session.updated_at,
                    session.usage.prompt_tokens,
                    session.usage.completion_tokens,
                    session.id,
                ),
            )

    async def delete_session(self, session_id: str) -> bool:
        async with self._transaction() as db:
            cursor = await db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        return cursor.rowcount > 0

    async def append_messages(self, session_id: str, messages: list[Message], updated_at: int) -> None:
        async with self._transaction() as db:
            await self._insert_messages(session_id, messages, updated_at)
            await db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (updated_at, session_id))

    async def load_messages(self, session_id: str) -> list[Message]:
        async with self.db.execute(
            "SELECT role, content, data FROM messages WHERE session_id = ? AND archived = 0 ORDER BY seq",
            (session_id,),
        ) as cursor:
            rows = await cursor.fetchall()
        return [Message.from_json(role, content, json.loads(data)) for role, content, data in rows]

    async def _insert_messages(self, session_id: str, messages: list[Message], created_at: int) -> None:
        await self.db.executemany(
            "INSERT INTO messages (session_id, role, content, data, created_at) VALUES (?, ?, ?, ?, ?)",
            [(session_id, m.role, m.content, json.dumps(m.to_json()), created_at) for m in messages],
        )
