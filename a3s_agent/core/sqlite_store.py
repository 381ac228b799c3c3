"""The session store on SQLite (`<data_dir>/sessions.db`; the connection, durability and thread
are `sqlite.py`'s).

Every write is one transaction, so a crash (even `kill -9`) never leaves a half-written session.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import astuple, fields
from pathlib import Path
from typing import Any

from ..base.errors import AlreadyExists
from ..base.models import Message, SessionConfig, SessionState, Usage
from ..base.sqlite import Database, Durability, transaction
from ..core.session import Session
from .session import SessionSettings

# Each entry moves the schema one version up; PRAGMA user_version records where a file is.
MIGRATIONS: list[str] = [
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
    # Per-session settings that are not SessionConfig (core/session.py, in its JSON shape).
    "ALTER TABLE sessions ADD COLUMN extras TEXT NOT NULL DEFAULT '{}'",
    # The last Initialize's configuration (one row), restored at start.
    """
    CREATE TABLE initialization (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        data TEXT NOT NULL,
        updated_at INTEGER NOT NULL
    )
    """,
    # The parts of a session's usage that pricing needs (base/models.py Usage); older rows read 0.
    """
    ALTER TABLE sessions ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0
    """,
]
# The session row's usage columns: one per field of Usage, named as the field.
_USAGE_COLUMNS = tuple(item.name for item in fields(Usage))
_SET_USAGE = ", ".join(f"{column} = ?" for column in _USAGE_COLUMNS)


class SqliteStore:
    backend = "sqlite"

    def __init__(self, path: Path, durability: Durability = "full") -> None:
        self.path = path
        # What was asked for until `open`; then what the connection reports (PRAGMA synchronous).
        self.durability: str = durability
        self._db = Database(path, MIGRATIONS, durability, "sessions")

    async def open(self) -> None:
        self.durability = await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def create_session(self, session: Session, messages: list[Message]) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    "INSERT INTO sessions (id, config, state, created_at, updated_at, extras)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        session.id,
                        json.dumps(session.config.to_storable()),
                        int(session.state),
                        session.created_at,
                        session.updated_at,
                        json.dumps(session.settings.to_json()),
                    ),
                )
                _insert_messages(db, session.id, messages, session.created_at)

        try:
            await self._db.run(write)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"session {session.id!r} already exists") from exc

    async def list_sessions(self) -> list[Session]:
        query = """
            SELECT s.id, s.config, s.state, s.created_at, s.updated_at, s.extras,
                   (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND m.archived = 0),
                   {}
            FROM sessions s ORDER BY s.created_at, s.id
        """.format(", ".join(f"s.{column}" for column in _USAGE_COLUMNS))

        def read(db: sqlite3.Connection) -> list[Session]:
            return [
                Session(
                    id=row[0],
                    config=SessionConfig.from_storable(json.loads(row[1])),
                    state=SessionState(row[2]),
                    created_at=row[3],
                    updated_at=row[4],
                    settings=SessionSettings.from_json(json.loads(row[5])),
                    message_count=row[6],
                    usage=Usage(*row[7:]),
                )
                for row in db.execute(query)
            ]

        return await self._db.run(read)

    async def update_session(self, session: Session) -> None:
        values = (
            json.dumps(session.config.to_storable()),
            int(session.state),
            session.updated_at,
            json.dumps(session.settings.to_json()),
            *astuple(session.usage),
            session.id,
        )

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    f"UPDATE sessions SET config = ?, state = ?, updated_at = ?, extras = ?, {_SET_USAGE}"
                    " WHERE id = ?",
                    values,
                )

        await self._db.run(write)

    async def delete_session(self, session_id: str) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                return db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

        return await self._db.run(write)

    async def append_messages(
        self, session_id: str, messages: list[Message], updated_at: int, usage: Usage | None = None
    ) -> None:
        """Append messages (and, when given, the session's new usage totals) in one transaction."""

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                _insert_messages(db, session_id, messages, updated_at)
                if usage is None:
                    db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (updated_at, session_id))
                else:
                    db.execute(
                        f"UPDATE sessions SET updated_at = ?, {_SET_USAGE} WHERE id = ?",
                        (updated_at, *astuple(usage), session_id),
                    )

        await self._db.run(write)

    async def replace_history(self, session_id: str, messages: list[Message], updated_at: int) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    "UPDATE messages SET archived = 1 WHERE session_id = ? AND archived = 0", (session_id,)
                )
                _insert_messages(db, session_id, messages, updated_at)
                db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (updated_at, session_id))

        await self._db.run(write)

    async def load_messages(self, session_id: str) -> list[Message]:
        return await self._load(session_id, archived=False)

    async def load_archived(self, session_id: str) -> list[Message]:
        return await self._load(session_id, archived=True)

    async def _load(self, session_id: str, *, archived: bool) -> list[Message]:
        def read(db: sqlite3.Connection) -> list[Message]:
            rows = db.execute(
                "SELECT role, content, data FROM messages WHERE session_id = ? AND archived = ? ORDER BY seq",
                (session_id, int(archived)),
            )
            return [Message.from_json(role, content, json.loads(data)) for role, content, data in rows]

        return await self._db.run(read)

    async def save_initialization(self, data: dict[str, Any]) -> None:
        stored = (json.dumps(data), time.time_ns() // 1_000_000)

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    "INSERT INTO initialization (id, data, updated_at) VALUES (1, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at",
                    stored,
                )

        await self._db.run(write)

    async def load_initialization(self) -> dict[str, Any] | None:
        def read(db: sqlite3.Connection) -> dict[str, Any] | None:
            row = db.execute("SELECT data FROM initialization WHERE id = 1").fetchone()
            return None if row is None else json.loads(row[0])

        return await self._db.run(read)


def _insert_messages(
    db: sqlite3.Connection, session_id: str, messages: list[Message], created_at: int
) -> None:
    db.executemany(
        "INSERT INTO messages (session_id, role, content, data, created_at) VALUES (?, ?, ?, ?, ?)",
        [(session_id, m.role, m.content, json.dumps(m.to_json()), created_at) for m in messages],
    )
