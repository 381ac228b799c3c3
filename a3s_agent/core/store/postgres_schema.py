"""The PostgreSQL store's schema: its migrations (applied at start, under a lock so that replicas
starting together do not race), and how an event-log row reads back as a LogEntry.

Tables: `sessions` (one row per session: config, state, times, extras, usage, and `last_seq`, the
last log seq handed out), `messages` (every message, live or archived), `initialization` (one row:
the last Initialize), `event_log` (every session's events and chunks, kept until retention), and
`run_leases` (the owner of each running generation), whose tokens come from the sequence
`run_lease_tokens`, shared by all sessions so that a token is larger than every earlier one, and
`channel_key` (one row: the key that seals the notifications between replicas) and
`control_messages` (control messages too big for a notification, briefly), and `memories`
(postgres_memories.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from psycopg import AsyncConnection

from ...base.models import Usage
from .a2a_tasks_postgres import SCHEMA as A2A_TASK_SCHEMA
from .checkpoints_postgres import SCHEMA as CHECKPOINT_SCHEMA
from .cron_postgres import SCHEMA as CRON_SCHEMA
from .postgres_memories import MIGRATION as MEMORY_MIGRATION
from .protocol import LogEntry
from .providers_postgres import SCHEMA as PROVIDER_SCHEMA
from .session_links import MIGRATION as LINK_MIGRATION

# Advisory lock keys. The migration lock is a single bigint key; per-session locks use the two-int4
# form (this namespace, hashtext(session id)), a key space that cannot meet the bigint one.
MIGRATION_LOCK = 0x0A35_A6E7_0001
SESSION_LOCK_SPACE = 0x0A35

# Each entry moves the schema one version up; the table a3s_schema records where a database is.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        config TEXT NOT NULL,
        state INTEGER NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        extras TEXT NOT NULL DEFAULT '{}',
        prompt_tokens BIGINT NOT NULL DEFAULT 0,
        completion_tokens BIGINT NOT NULL DEFAULT 0,
        cache_read_tokens BIGINT NOT NULL DEFAULT 0,
        cache_write_tokens BIGINT NOT NULL DEFAULT 0,
        reasoning_tokens BIGINT NOT NULL DEFAULT 0,
        last_seq BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE messages (
        seq BIGSERIAL PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content BYTEA NOT NULL,  -- UTF-8: a text column cannot hold a NUL character, a message can
        data TEXT NOT NULL,
        archived BOOLEAN NOT NULL DEFAULT FALSE,
        created_at BIGINT NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, archived, seq);
    CREATE TABLE initialization (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        data TEXT NOT NULL,
        updated_at BIGINT NOT NULL
    );
    -- No foreign key to sessions: a destroyed session's log stays until retention removes it.
    -- origin: the replica that wrote the entry (the channel's catch-up skips a replica's own).
    CREATE TABLE event_log (
        id BIGSERIAL NOT NULL,
        session_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        origin TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE UNIQUE INDEX event_log_by_id ON event_log(id);
    CREATE INDEX event_log_by_time ON event_log(created_at);
    CREATE TABLE run_leases (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        token BIGINT NOT NULL,
        run_id TEXT NOT NULL,
        expires_at BIGINT NOT NULL
    );
    CREATE SEQUENCE run_lease_tokens;
    """,
    # The A3S harness protocol's runs (app/harness.py), by the caller's run id within a session.
    """
    CREATE TABLE harness_runs (
        session_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (session_id, run_id)
    );
    """,
    # The transaction that wrote each entry (PostgreSQL 13 or later): the channel's catch-up finds
    # by it what committed while a listener was down (postgres_channel.py).
    """
    ALTER TABLE event_log ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();
    CREATE INDEX event_log_by_txid ON event_log(txid);
    """,
    # The key that seals the replicas' notifications (channel_seal.py), from the server's strong
    # random source (gen_random_uuid, PostgreSQL 13 or later), granted to nobody.
    """
    CREATE TABLE channel_key (id INTEGER PRIMARY KEY CHECK (id = 1), key BYTEA NOT NULL);
    REVOKE ALL ON channel_key FROM PUBLIC;
    INSERT INTO channel_key
        SELECT 1, sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8'));
    """,
    # Control messages too big for a notification, which carries their id instead; kept only as long
    # as a listener would still take them (postgres_channel.py), granted to nobody.
    """
    CREATE TABLE control_messages (
        id BIGSERIAL PRIMARY KEY,
        body TEXT NOT NULL,
        created_at BIGINT NOT NULL
    );
    CREATE INDEX control_messages_by_time ON control_messages(created_at);
    REVOKE ALL ON control_messages FROM PUBLIC;
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
USAGE_COLUMNS = tuple(item.name for item in fields(Usage))
# What `entry_from_row` reads, in its order.
LOG_COLUMNS = "session_id, kind, body, created_at, seq, id"
# The database's clock, in ms since the epoch (leases expire by it, whichever replica looks).
NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout: an unreachable database fails, it does not hang


async def migrate(
    conn: AsyncConnection[Any],
    migrations: Sequence[str] = MIGRATIONS,
    table: str = "a3s_schema",
    lock: int = MIGRATION_LOCK,
) -> int:
    """Bring a schema up to its last migration in one transaction, holding an advisory lock so
    that one replica migrates while the others wait and then find nothing to do; the version.
    `table` (one row) records the version; `migrations[n]` takes it from n to n + 1."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)")
        row = await (await conn.execute(f"SELECT version FROM {table}")).fetchone()
        if row is None:
            await conn.execute(f"INSERT INTO {table} (version) VALUES (0)")
        version: int = 0 if row is None else row[0]
        for number, script in enumerate(migrations[version:], start=version + 1):
            await conn.execute(script)
            await conn.execute(f"UPDATE {table} SET version = %s", (number,))
        return max(version, len(migrations))


def entry_from_row(row: tuple[Any, ...]) -> LogEntry:
    """A LogEntry from the columns of LOG_COLUMNS."""
    session_id, kind, body, created_at, seq, entry_id = row
    return LogEntry(session_id, kind, json.loads(body), created_at, seq=seq, id=entry_id)
