"""The session store on SQLite (`<data_dir>/sessions.db`; the connection, durability and thread
are `sqlite.py`'s).

Every write is one transaction, so a crash (even `kill -9`) never leaves a half-written session.
One process uses the file (`shared` False): the replica channel is a loop back to this process.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import astuple, fields, replace
from pathlib import Path
from typing import Any

from ...base.errors import AlreadyExists
from ...base.models import Message, SessionConfig, SessionState, Usage
from ...base.sqlite import Database, Durability, transaction
from .a2a_tasks import A2aTaskTable
from .a2a_tasks_sqlite import SCHEMA as A2A_TASK_SCHEMA
from .a2a_tasks_sqlite import SqliteA2aTasks
from .checkpoints import CheckpointTable
from .checkpoints_sqlite import SCHEMA as CHECKPOINT_SCHEMA
from .checkpoints_sqlite import SqliteCheckpoints
from .cron_sqlite import SCHEMA as CRON_SCHEMA
from .cron_sqlite import SqliteCronStore
from .memories import MemoryTable
from .protocol import ControlHandler, EntriesHandler, Lease, LeaseLost, LogEntry, StaleHeader
from .providers import ProviderTable
from .providers_sqlite import SCHEMA as PROVIDER_SCHEMA
from .providers_sqlite import SqliteProviders
from .session import Session, SessionSettings
from .session_links import LINK_COLUMNS, link_of, link_values
from .session_links import MIGRATION as LINK_MIGRATION
from .sqlite_memories import MIGRATION as MEMORY_MIGRATION
from .sqlite_memories import SqliteMemories

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
    # Per-session settings that are not SessionConfig (core/store/session.py, in its JSON shape).
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
    # Each session's event log (core/store/protocol.py LogEntry) and the leases of running generations.
    """
    ALTER TABLE sessions ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE event_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX event_log_by_session ON event_log(session_id, seq);
    CREATE TABLE run_leases (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        token INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        expires_at INTEGER NOT NULL
    );
    CREATE TABLE lease_tokens (id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL);
    INSERT INTO lease_tokens VALUES (1, 0)
    """,
    # The A3S harness protocol's runs (app/harness.py), by the caller's run id within a session.
    """
    CREATE TABLE harness_runs (
        session_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (session_id, run_id)
    )
    """,
    # Memories (core/store/memories.py), with their full-text index.
    MEMORY_MIGRATION,
    # Scheduled jobs and their firings (core/store/cron.py).
    CRON_SCHEMA,
    # Provider entries and the default model (core/store/providers.py).
    PROVIDER_SCHEMA,
    # A subagent's session: its parent, the tool call that started it, its agent (session.py ParentLink).
    LINK_MIGRATION,
    # Checkpoints of sessions' workspaces (core/store/checkpoints.py).
    CHECKPOINT_SCHEMA,
    # The trace a run was started in, for the replica that takes it over (Lease.trace).
    "ALTER TABLE run_leases ADD COLUMN trace TEXT NOT NULL DEFAULT ''",
    # The A2A face's tasks (core/store/a2a_tasks.py).
    A2A_TASK_SCHEMA,
]
# The session row's usage columns: one per field of Usage, named as the field.
_USAGE_COLUMNS = tuple(item.name for item in fields(Usage))
_SET_USAGE = ", ".join(f"{column} = ?" for column in _USAGE_COLUMNS)
_SESSION_COLUMNS = "s.id, s.config, s.state, s.created_at, s.updated_at, s.extras, {}, {}, {}".format(
    "(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND m.archived = 0)",
    ", ".join(f"s.{column}" for column in _USAGE_COLUMNS),
    LINK_COLUMNS,
)
_LEASE_COLUMNS = "session_id, owner, token, run_id, expires_at, trace"


class SqliteStore:
    backend = "sqlite"
    shared = False

    def __init__(self, path: Path, durability: Durability = "full") -> None:
        self.path = path
        # What was asked for until `open`; then what the connection reports (PRAGMA synchronous).
        self.durability: str = durability
        self._db = Database(path, MIGRATIONS, durability, "sessions")
        self.memories: MemoryTable = SqliteMemories(self._db, _append_log)
        self._on_control: ControlHandler | None = None
        self.cron = SqliteCronStore(self._db)
        self.providers: ProviderTable = SqliteProviders(self._db)
        self.checkpoints: CheckpointTable = SqliteCheckpoints(self._db, _append_log)
        self.a2a_tasks: A2aTaskTable = SqliteA2aTasks(self._db)

    async def open(self) -> None:
        self.durability = await self._db.open()

    async def close(self) -> None:
        self._on_control = None
        await self._db.close()

    # --- sessions and messages ---------------------------------------------------------------

    async def create_session(
        self, session: Session, messages: list[Message], log: Sequence[LogEntry] = ()
    ) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    f"INSERT INTO sessions (id, config, state, created_at, updated_at, extras, last_seq,"
                    f" {LINK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?,"
                    " (SELECT COALESCE(MAX(seq), 0) FROM event_log WHERE session_id = ?), ?, ?, ?)",
                    (
                        session.id,
                        json.dumps(session.config.to_storable()),
                        int(session.state),
                        session.created_at,
                        session.updated_at,
                        json.dumps(session.settings.to_json()),
                        session.id,
                        *link_values(session.parent),
                    ),
                )
                _insert_messages(db, session.id, messages, session.created_at)
                _append_log(db, log)

        try:
            await self._db.run(write)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"session {session.id!r} already exists") from exc

    async def list_sessions(self) -> list[Session]:
        query = f"SELECT {_SESSION_COLUMNS} FROM sessions s ORDER BY s.created_at, s.id"
        return await self._db.run(lambda db: [_session(row) for row in db.execute(query)])

    async def load_session(self, session_id: str) -> Session | None:
        query = f"SELECT {_SESSION_COLUMNS} FROM sessions s WHERE s.id = ?"
        row = await self._db.run(lambda db: db.execute(query, (session_id,)).fetchone())
        return None if row is None else _session(row)

    async def session_stamp(self, session_id: str) -> int | None:
        row = await self._db.run(
            lambda db: db.execute("SELECT updated_at FROM sessions WHERE id = ?", (session_id,)).fetchone()
        )
        return None if row is None else int(row[0])

    async def update_session(
        self,
        session: Session,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
        since: int | None = None,
    ) -> None:
        values = (
            json.dumps(session.config.to_storable()),
            int(session.state),
            session.updated_at,
            json.dumps(session.settings.to_json()),
            *session.usage.counts().values(),
            session.id,
            since,
            since,
        )

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                _check_fence(db, session.id, fence)
                updated = db.execute(
                    f"UPDATE sessions SET config = ?, state = ?, updated_at = ?, extras = ?, {_SET_USAGE}"
                    " WHERE id = ? AND (? IS NULL OR updated_at = ?)",
                    values,
                )
                if since is not None and updated.rowcount == 0:
                    raise StaleHeader(session.id)
                _append_log(db, log)

        await self._db.run(write)

    async def delete_session(self, session_id: str, log: Sequence[LogEntry] = ()) -> bool:
        def write(db: sqlite3.Connection) -> bool:
            with transaction(db):
                _append_log(db, log)  # first: the numbering continues from the session's row
                db.execute("DELETE FROM run_leases WHERE session_id = ?", (session_id,))  # its run is fenced
                return db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

        return await self._db.run(write)

    async def append_messages(
        self,
        session_id: str,
        messages: list[Message],
        updated_at: int,
        usage: Usage | None = None,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
    ) -> None:
        """Append messages (and, when given, the session's new usage totals) in one transaction."""

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                _check_fence(db, session_id, fence)
                _insert_messages(db, session_id, messages, updated_at)
                if usage is None:
                    db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (updated_at, session_id))
                else:
                    db.execute(
                        f"UPDATE sessions SET updated_at = ?, {_SET_USAGE} WHERE id = ?",
                        (updated_at, *usage.counts().values(), session_id),
                    )
                _append_log(db, log)

        await self._db.run(write)

    async def replace_history(
        self,
        session_id: str,
        messages: list[Message],
        updated_at: int,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
    ) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                _check_fence(db, session_id, fence)
                db.execute(
                    "UPDATE messages SET archived = 1 WHERE session_id = ? AND archived = 0", (session_id,)
                )
                _insert_messages(db, session_id, messages, updated_at)
                db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (updated_at, session_id))
                _append_log(db, log)

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
        stored = (json.dumps(data), _now_ms())

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

    # --- A3S harness runs ---------------------------------------------------------------------

    async def reserve_harness_run(
        self, session_id: str, run_id: str, record: dict[str, Any]
    ) -> dict[str, Any] | None:
        def write(db: sqlite3.Connection) -> dict[str, Any] | None:
            with transaction(db):
                row = db.execute(
                    "SELECT record FROM harness_runs WHERE session_id = ? AND run_id = ?",
                    (session_id, run_id),
                ).fetchone()
                if row is not None:
                    return dict(json.loads(row[0]))
                db.execute(
                    "INSERT INTO harness_runs (session_id, run_id, record) VALUES (?, ?, ?)",
                    (session_id, run_id, json.dumps(record)),
                )
                return None

        return await self._db.run(write)

    async def save_harness_run(self, session_id: str, run_id: str, record: dict[str, Any]) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                db.execute(
                    "UPDATE harness_runs SET record = ? WHERE session_id = ? AND run_id = ?",
                    (json.dumps(record), session_id, run_id),
                )

        await self._db.run(write)

    async def load_harness_run(self, session_id: str, run_id: str) -> dict[str, Any] | None:
        def read(db: sqlite3.Connection) -> dict[str, Any] | None:
            row = db.execute(
                "SELECT record FROM harness_runs WHERE session_id = ? AND run_id = ?", (session_id, run_id)
            ).fetchone()
            return None if row is None else dict(json.loads(row[0]))

        return await self._db.run(read)

    # --- the event log -----------------------------------------------------------------------

    async def append_log(self, entries: Sequence[LogEntry]) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                _append_fenced(db, entries)

        await self._db.run(write)

    async def read_log(self, session_id: str, after_seq: int, limit: int) -> list[LogEntry]:
        query = (
            "SELECT id, session_id, seq, kind, body, created_at FROM event_log"
            " WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        )
        rows = await self._db.run(lambda db: db.execute(query, (session_id, after_seq, limit)).fetchall())
        return [_entry(row) for row in rows]

    async def read_log_since(self, after_id: int, limit: int) -> list[LogEntry]:
        query = "SELECT id, session_id, seq, kind, body, created_at FROM event_log WHERE id > ? ORDER BY id LIMIT ?"
        rows = await self._db.run(lambda db: db.execute(query, (after_id, limit)).fetchall())
        return [_entry(row) for row in rows]

    async def log_bounds(self, session_id: str) -> tuple[int, int]:
        def read(db: sqlite3.Connection) -> tuple[int, int]:
            first, last = db.execute(
                "SELECT MIN(seq), MAX(seq) FROM event_log WHERE session_id = ?", (session_id,)
            ).fetchone()
            row = db.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
            handed_out = max(last or 0, row[0] if row else 0)
            return (first or 0), handed_out

        return await self._db.run(read)

    async def prune_log(self, older_than: int, keep: int) -> int:
        def write(db: sqlite3.Connection) -> int:
            with transaction(db):
                removed = db.execute("DELETE FROM event_log WHERE created_at < ?", (older_than,)).rowcount
                removed += db.execute(
                    "DELETE FROM event_log WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER"
                    " (PARTITION BY session_id ORDER BY seq DESC) AS newest FROM event_log) WHERE newest > ?)",
                    (keep,),
                ).rowcount
            return removed

        return await self._db.run(write)

    # --- leases (the clock is this machine's: one process uses the file) ------------------------

    async def acquire_lease(
        self, session_id: str, owner: str, run_id: str, ttl_ms: int, trace: str = ""
    ) -> Lease | None:
        def write(db: sqlite3.Connection) -> Lease | None:
            with transaction(db):
                now = _now_ms()
                held = db.execute(
                    "SELECT expires_at FROM run_leases WHERE session_id = ?", (session_id,)
                ).fetchone()
                if held is not None and held[0] >= now:
                    return None
                (token,) = db.execute("UPDATE lease_tokens SET last = last + 1 RETURNING last").fetchone()
                lease = Lease(session_id, owner, token, run_id, now + ttl_ms, trace)
                db.execute(
                    f"INSERT OR REPLACE INTO run_leases ({_LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    astuple(lease),
                )
                return lease

        return await self._db.run(write)

    async def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease | None:
        def write(db: sqlite3.Connection) -> Lease | None:
            expires = _now_ms() + ttl_ms
            cursor = db.execute(
                "UPDATE run_leases SET expires_at = ? WHERE session_id = ? AND token = ?",
                (expires, lease.session_id, lease.token),
            )
            return replace(lease, expires_at=expires) if cursor.rowcount else None

        return await self._db.run(write)

    async def release_lease(self, lease: Lease, log: Sequence[LogEntry] = ()) -> None:
        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                _append_fenced(db, log)
                db.execute(
                    "DELETE FROM run_leases WHERE session_id = ? AND token = ?",
                    (lease.session_id, lease.token),
                )

        await self._db.run(write)

    async def lease_of(self, session_id: str) -> Lease | None:
        query = f"SELECT {_LEASE_COLUMNS} FROM run_leases WHERE session_id = ?"
        row = await self._db.run(lambda db: db.execute(query, (session_id,)).fetchone())
        return None if row is None else Lease(*row)

    async def expired_leases(self) -> list[Lease]:
        query = f"SELECT {_LEASE_COLUMNS} FROM run_leases WHERE expires_at < ?"
        rows = await self._db.run(lambda db: db.execute(query, (_now_ms(),)).fetchall())
        return [Lease(*row) for row in rows]

    async def expire_leases(self, owner: str | None) -> int:
        query = "UPDATE run_leases SET expires_at = 0 WHERE ? IS NULL OR owner = ?"
        return await self._db.run(lambda db: db.execute(query, (owner, owner)).rowcount)

    # --- the replica channel: only this process -------------------------------------------------

    async def listen(self, on_entries: EntriesHandler, on_control: ControlHandler) -> None:
        self._on_control = on_control  # no other process appends: on_entries is never called

    async def send_control(self, message: dict[str, Any]) -> None:
        if self._on_control is not None:
            asyncio.get_running_loop().call_soon(self._on_control, message)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _session(row: Sequence[Any]) -> Session:
    return Session(
        id=row[0],
        config=SessionConfig.from_storable(json.loads(row[1])),
        state=SessionState(row[2]),
        created_at=row[3],
        updated_at=row[4],
        settings=SessionSettings.from_json(json.loads(row[5])),
        message_count=row[6],
        usage=Usage(*row[7 : 7 + len(_USAGE_COLUMNS)]),
        parent=link_of(row[7 + len(_USAGE_COLUMNS) :]),
    )


def _entry(row: Sequence[Any]) -> LogEntry:
    return LogEntry(
        session_id=row[1], kind=row[3], body=json.loads(row[4]), timestamp=row[5], seq=row[2], id=row[0]
    )


def _holds(db: sqlite3.Connection, session_id: str, token: int) -> bool:
    row = db.execute("SELECT token FROM run_leases WHERE session_id = ?", (session_id,)).fetchone()
    return row is not None and row[0] == token


def _check_fence(db: sqlite3.Connection, session_id: str, fence: int | None) -> None:
    if fence is not None and not _holds(db, session_id, fence):
        raise LeaseLost(
            f"the run of session {session_id!r} is no longer this replica's: another took it over"
        )


def _append_fenced(db: sqlite3.Connection, entries: Sequence[LogEntry]) -> None:
    """`_append_log` of the entries whose fence still holds (the others keep seq 0)."""
    stale = {
        entry.session_id
        for entry in entries
        if entry.fence is not None and not _holds(db, entry.session_id, entry.fence)
    }
    _append_log(db, [entry for entry in entries if entry.session_id not in stale])


def _append_log(db: sqlite3.Connection, entries: Sequence[LogEntry]) -> None:
    """Number and insert entries, each session's continuing from its last seq."""
    counts = Counter(entry.session_id for entry in entries)
    next_seq: dict[str, int] = {}
    for session_id, count in counts.items():
        row = db.execute(
            "UPDATE sessions SET last_seq = last_seq + ? WHERE id = ? RETURNING last_seq", (count, session_id)
        ).fetchone()
        if row is None:  # a destroyed session: continue its retained log
            row = db.execute(
                "SELECT COALESCE(MAX(seq), 0) + ? FROM event_log WHERE session_id = ?", (count, session_id)
            ).fetchone()
        next_seq[session_id] = row[0] - count + 1
    for entry in entries:
        entry.seq = next_seq[entry.session_id]
        next_seq[entry.session_id] += 1
        cursor = db.execute(
            "INSERT INTO event_log (session_id, seq, kind, body, created_at) VALUES (?, ?, ?, ?, ?)",
            (entry.session_id, entry.seq, entry.kind, json.dumps(entry.body), entry.timestamp),
        )
        entry.id = cursor.lastrowid or 0


def _insert_messages(
    db: sqlite3.Connection, session_id: str, messages: list[Message], created_at: int
) -> None:
    db.executemany(
        "INSERT INTO messages (session_id, role, content, data, created_at) VALUES (?, ?, ?, ?, ?)",
        [(session_id, m.role, m.content, json.dumps(m.to_json()), created_at) for m in messages],
    )
