"""SQLite store in WAL mode, off the event loop.

Every write is one transaction, so a crash (even `kill -9`) never leaves a half-written session.
Commits are synced as `connect`'s `durability` says: "full" (the default) survives a power loss too.

The connection lives on one dedicated thread and each store operation runs there as a single
function: a transaction costs one hop from the event loop and back, where aiosqlite (which this
replaced) makes one per statement, four for a BEGIN/INSERT/UPDATE/COMMIT.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from .errors import AlreadyExists
from .models import Message, Session, SessionConfig, SessionState, Usage

T = TypeVar("T")
Durability = Literal["full", "normal"]
DURABILITY_LEVELS: tuple[Durability, ...] = ("full", "normal")
_SYNCHRONOUS_NAMES = {0: "off", 1: "normal", 2: "full", 3: "extra"}  # PRAGMA synchronous's numbers

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
    # Per-session settings that are not SessionConfig: policies, lane handlers, loaded skills.
    "ALTER TABLE sessions ADD COLUMN extras TEXT NOT NULL DEFAULT '{}'",
    # The last Initialize's configuration (one row), restored at start.
    """
    CREATE TABLE initialization (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        data TEXT NOT NULL,
        updated_at INTEGER NOT NULL
    )
    """,
]


class SqliteStore:
    backend = "sqlite"

    def __init__(self, path: Path, durability: Durability = "full") -> None:
        self.path = path
        # What was asked for until `open`; then what the connection reports (PRAGMA synchronous).
        self.durability: str = durability
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="a3s-store")

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run fn with the connection on the store's thread, which serialises every operation."""
        if self._db is None:
            raise RuntimeError("store is not open")
        db = self._db
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, db)

    async def open(self) -> None:
        self._db = await asyncio.get_running_loop().run_in_executor(
            self._thread, connect, self.path, MIGRATIONS, self.durability
        )
        self.durability = await self._run(synchronous_level)

    async def close(self) -> None:
        if self._db is not None:
            await self._run(lambda db: db.close())
            self._db = None
        self._thread.shutdown(wait=True)

    async def create_session(self, session: Session, messages: list[Message]) -> None:
        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO sessions (id, config, state, created_at, updated_at, extras)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        session.id,
                        json.dumps(session.config.to_storable()),
                        int(session.state),
                        session.created_at,
                        session.updated_at,
                        json.dumps(session.extras),
                    ),
                )
                _insert_messages(db, session.id, messages, session.created_at)

        try:
            await self._run(write)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"session {session.id!r} already exists") from exc

    async def list_sessions(self) -> list[Session]:
        query = """
            SELECT s.id, s.config, s.state, s.created_at, s.updated_at, s.prompt_tokens,
                   s.completion_tokens, s.extras,
                   (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND m.archived = 0)
            FROM sessions s ORDER BY s.created_at, s.id
        """

        def read(db: sqlite3.Connection) -> list[Session]:
            return [
                Session(
                    id=row[0],
                    config=SessionConfig.from_storable(json.loads(row[1])),
                    state=SessionState(row[2]),
                    created_at=row[3],
                    updated_at=row[4],
                    usage=Usage(prompt_tokens=row[5], completion_tokens=row[6]),
                    extras=json.loads(row[7]),
                    message_count=row[8],
                )
                for row in db.execute(query)
            ]

        return await self._run(read)

    async def update_session(self, session: Session) -> None:
        values = (
            json.dumps(session.config.to_storable()),
            int(session.state),
            session.updated_at,
            session.usage.prompt_tokens,
            session.usage.completion_tokens,
            json.dumps(session.extras),
            session.id,
        )

        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "UPDATE sessions SET config = ?, state = ?, updated_at = ?, prompt_tokens = ?,"
                    " completion_tokens = ?, extras = ? WHERE id = ?",
                    values,
                )

        await self._run(write)

    async def delete_session(self, session_id: str) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                return db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

        return await self._run(write)

    async def append_messages(
        self, session_id: str, messages: list[Message], updated_at: int, usage: Usage | None = None
    ) -> None:
        """Append messages (and, when given, the session's new usage totals) in one transaction."""

        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                _insert_messages(db, session_id, messages, updated_at)
                if usage is None:
                    db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (updated_at, session_id))
                else:
                    db.execute(
                        "UPDATE sessions SET updated_at = ?, prompt_tokens = ?, completion_tokens = ? WHERE id = ?",
                        (updated_at, usage.prompt_tokens, usage.completion_tokens, session_id),
                    )

        await self._run(write)

    async def replace_history(self, session_id: str, messages: list[Message], updated_at: int) -> None:
        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "UPDATE messages SET archived = 1 WHERE session_id = ? AND archived = 0", (session_id,)
                )
                _insert_messages(db, session_id, messages, updated_at)
                db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (updated_at, session_id))

        await self._run(write)

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

        return await self._run(read)

    async def save_initialization(self, data: dict[str, Any]) -> None:
        stored = (json.dumps(data), time.time_ns() // 1_000_000)

        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO initialization (id, data, updated_at) VALUES (1, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at",
                    stored,
                )

        await self._run(write)

    async def load_initialization(self) -> dict[str, Any] | None:
        def read(db: sqlite3.Connection) -> dict[str, Any] | None:
            row = db.execute("SELECT data FROM initialization WHERE id = 1").fetchone()
            return None if row is None else json.loads(row[0])

        return await self._run(read)


def connect(path: Path, migrations: list[str], durability: Durability = "full") -> sqlite3.Connection:
    """A WAL-mode connection (for use on one thread at a time) with the schema migrated up.

    `durability` "full" (PRAGMA synchronous=FULL) syncs the log at every commit, so a commit that
    returned survives a power loss; "normal" syncs only at checkpoints: commits survive a crash of
    the process, but a power loss may drop the last ones (each commit is then cheaper).
    `migrations[n]` takes a database from version n to n + 1; PRAGMA user_version keeps the count."""
    if durability not in DURABILITY_LEVELS:
        raise ValueError(f"durability must be one of {DURABILITY_LEVELS}, not {durability!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={durability.upper()}")
    db.execute("PRAGMA foreign_keys=ON")
    (version,) = db.execute("PRAGMA user_version").fetchone()
    for number, script in enumerate(migrations[version:], start=version + 1):
        db.executescript(f"BEGIN; {script}; PRAGMA user_version={number}; COMMIT;")
    return db


def synchronous_level(db: sqlite3.Connection) -> str:
    """How the connection syncs commits, by PRAGMA synchronous's name: "full", "normal", ..."""
    (number,) = db.execute("PRAGMA synchronous").fetchone()
    return _SYNCHRONOUS_NAMES.get(number, str(number))


class _transaction:
    """BEGIN ... COMMIT, or ROLLBACK when the body raises."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN")

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.db.execute("ROLLBACK" if kind is not None else "COMMIT")


def _insert_messages(
    db: sqlite3.Connection, session_id: str, messages: list[Message], created_at: int
) -> None:
    db.executemany(
        "INSERT INTO messages (session_id, role, content, data, created_at) VALUES (?, ?, ?, ?, ?)",
        [(session_id, m.role, m.content, json.dumps(m.to_json()), created_at) for m in messages],
    )
