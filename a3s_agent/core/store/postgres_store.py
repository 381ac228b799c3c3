"""The session store on PostgreSQL: any number of replicas on one database. The schema and its
migrations are `postgres_schema.py`'s, the channel between replicas `postgres_channel.py`'s.

Every write is one transaction on a pooled connection. A session's log seqs are handed out under
the session row's lock (`last_seq`), so replicas appending to one session are serialised and the
numbers have no gap; a fenced write first locks the session's lease row and checks its token.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from psycopg import AsyncConnection, OperationalError
from psycopg.errors import UniqueViolation
from psycopg_pool import AsyncConnectionPool

from ...base.errors import AlreadyExists, Unavailable
from ...base.models import Message, SessionConfig, SessionState, Usage
from .a2a_tasks import A2aTaskTable
from .a2a_tasks_postgres import PostgresA2aTasks
from .channel_seal import ChannelSeal
from .checkpoints import CheckpointTable
from .checkpoints_postgres import PostgresCheckpoints
from .cron_postgres import PostgresCronStore
from .memories import MemoryTable
from .postgres_bounds import RETENTION_TIMEOUT_MS, bound_waits, pooled
from .postgres_channel import (
    CONTROL_CHANNEL,
    CONTROL_WINDOW_S,
    LOG_CHANNEL,
    TEXT_LIMIT,
    Listener,
    control_payload,
    control_text,
    log_payloads,
)
from .postgres_memories import PostgresMemories
from .postgres_schema import (
    CONNECT_TIMEOUT_S,
    LOG_COLUMNS,
    NOW_MS,
    SESSION_LOCK_SPACE,
    USAGE_COLUMNS,
    entry_from_row,
    migrate,
)
from .protocol import ControlHandler, EntriesHandler, Lease, LeaseLost, LogEntry, StaleHeader
from .providers import ProviderTable
from .providers_postgres import PostgresProviders
from .session import Session, SessionSettings
from .session_links import LINK_COLUMNS, link_of, link_values

POOL_MIN_SIZE = 1
POOL_MAX_SIZE = 10
STORE_NAME = "the PostgreSQL store (--store)"
CONTROL_KEPT_MS = int(4 * CONTROL_WINDOW_S * 1000)  # a stored control message outlives its window

_SET_USAGE = ", ".join(f"{column} = %s" for column in USAGE_COLUMNS)
_SESSION_COLUMNS = """
    s.id, s.config, s.state, s.created_at, s.updated_at, s.extras,
    (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND NOT m.archived),
    {}, {}
""".format(", ".join(f"s.{column}" for column in USAGE_COLUMNS), LINK_COLUMNS)
_LEASE_COLUMNS = "session_id, owner, token, run_id, expires_at, trace"
_LOCK_SESSION = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"


class PostgresStore:
    backend = "postgresql"
    shared = True

    def __init__(self, url: str, replica_id: str) -> None:
        self.url = url
        self.replica_id = replica_id
        # Until `open`: what a default server does; then what the server reports.
        self.durability = "full"
        self._pool = AsyncConnectionPool(
            url,
            min_size=POOL_MIN_SIZE,
            max_size=POOL_MAX_SIZE,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
            configure=bound_waits,
        )
        self._listener: Listener | None = None
        self._seal: ChannelSeal | None = None  # read at `open`
        self.memories: MemoryTable = PostgresMemories(self._transaction, self._connection, self._append)
        self.cron = PostgresCronStore(self._connection)
        self.providers: ProviderTable = PostgresProviders(self._connection)
        self.checkpoints: CheckpointTable = PostgresCheckpoints(
            self._transaction, self._connection, self._append
        )
        self.a2a_tasks: A2aTaskTable = PostgresA2aTasks(self._connection)

    async def open(self) -> None:
        # A connection of its own first: it fails with the server's reason (a pool only times out).
        try:
            conn = await AsyncConnection.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except OperationalError as exc:
            raise Unavailable(f"cannot reach {STORE_NAME}: {exc}") from exc
        async with conn:
            await migrate(conn)
            self.durability = await _durability(conn)
            self._seal = await _channel_seal(conn)
        await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await self._pool.close()

    def _sealing(self) -> ChannelSeal:
        if self._seal is None:
            raise RuntimeError(f"{STORE_NAME} is not open")
        return self._seal

    def _connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """A pooled connection; what fails on the database raises Unavailable (postgres_bounds.py)."""
        return pooled(self._pool, STORE_NAME)

    @asynccontextmanager
    async def _transaction(self, log: Sequence[LogEntry] = ()) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection in a transaction, committed when the block ends; when it fails, the `log`
        entries it was to append are left as they came (seq and id 0)."""
        try:
            async with self._connection() as conn, conn.transaction():
                yield conn
        except BaseException:
            for entry in log:
                entry.seq = entry.id = 0
            raise

    # --- sessions and messages ---------------------------------------------------------------

    async def create_session(
        self, session: Session, messages: list[Message], log: Sequence[LogEntry] = ()
    ) -> None:
        async with self._transaction(log) as conn:
            # Locked like an append to a session without a row, so the retained seqs are final.
            await conn.execute(_LOCK_SESSION, (SESSION_LOCK_SPACE, session.id))
            try:
                await conn.execute(
                    f"INSERT INTO sessions (id, config, state, created_at, updated_at, extras, {LINK_COLUMNS},"
                    " last_seq) SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, COALESCE(MAX(seq), 0)"
                    " FROM event_log WHERE session_id = %s",
                    (
                        session.id,
                        json.dumps(session.config.to_storable()),
                        int(session.state),
                        session.created_at,
                        session.updated_at,
                        json.dumps(session.settings.to_json()),
                        *link_values(session.parent),
                        session.id,
                    ),
                )
            except UniqueViolation as exc:
                raise AlreadyExists(f"session {session.id!r} already exists") from exc
            await _insert_messages(conn, session.id, messages, session.created_at)
            await self._append(conn, log)

    async def list_sessions(self) -> list[Session]:
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions s ORDER BY s.created_at, s.id"
            )
            return [_session_from_row(row) for row in await cursor.fetchall()]

    async def load_session(self, session_id: str) -> Session | None:
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions s WHERE s.id = %s", (session_id,)
            )
            row = await cursor.fetchone()
        return None if row is None else _session_from_row(row)

    async def session_stamp(self, session_id: str) -> int | None:
        async with self._connection() as conn:
            cursor = await conn.execute("SELECT updated_at FROM sessions WHERE id = %s", (session_id,))
            row = await cursor.fetchone()
        return None if row is None else int(row[0])

    async def update_session(
        self,
        session: Session,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
        since: int | None = None,
    ) -> None:
        async with self._transaction(log) as conn:
            await _check_fence(conn, session.id, fence)
            cursor = await conn.execute(
                f"UPDATE sessions SET config = %s, state = %s, updated_at = %s, extras = %s, {_SET_USAGE}"
                " WHERE id = %s AND (%s::bigint IS NULL OR updated_at = %s)",
                (
                    json.dumps(session.config.to_storable()),
                    int(session.state),
                    session.updated_at,
                    json.dumps(session.settings.to_json()),
                    *session.usage.counts().values(),
                    session.id,
                    since,
                    since,
                ),
            )
            if since is not None and cursor.rowcount == 0:
                raise StaleHeader(session.id)
            await self._append(conn, log)

    async def delete_session(self, session_id: str, log: Sequence[LogEntry] = ()) -> bool:
        async with self._transaction(log) as conn:
            await self._append(conn, log)  # first: the numbering continues from the session's row
            await conn.execute("DELETE FROM run_leases WHERE session_id = %s", (session_id,))
            cursor = await conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))
            return cursor.rowcount > 0

    async def append_messages(
        self,
        session_id: str,
        messages: list[Message],
        updated_at: int,
        usage: Usage | None = None,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
    ) -> None:
        async with self._transaction(log) as conn:
            await _check_fence(conn, session_id, fence)
            await _insert_messages(conn, session_id, messages, updated_at)
            if usage is None:
                await conn.execute(
                    "UPDATE sessions SET updated_at = %s WHERE id = %s", (updated_at, session_id)
                )
            else:
                await conn.execute(
                    f"UPDATE sessions SET updated_at = %s, {_SET_USAGE} WHERE id = %s",
                    (updated_at, *usage.counts().values(), session_id),
                )
            await self._append(conn, log)

    async def replace_history(
        self,
        session_id: str,
        messages: list[Message],
        updated_at: int,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
    ) -> None:
        async with self._transaction(log) as conn:
            await _check_fence(conn, session_id, fence)
            await conn.execute(
                "UPDATE messages SET archived = TRUE WHERE session_id = %s AND NOT archived", (session_id,)
            )
            await _insert_messages(conn, session_id, messages, updated_at)
            await conn.execute("UPDATE sessions SET updated_at = %s WHERE id = %s", (updated_at, session_id))
            await self._append(conn, log)

    async def load_messages(self, session_id: str) -> list[Message]:
        return await self._load(session_id, archived=False)

    async def load_archived(self, session_id: str) -> list[Message]:
        return await self._load(session_id, archived=True)

    async def _load(self, session_id: str, *, archived: bool) -> list[Message]:
        async with self._connection() as conn:
            cursor = await conn.execute(
                "SELECT role, content, data FROM messages WHERE session_id = %s AND archived = %s ORDER BY seq",
                (session_id, archived),
            )
            rows = await cursor.fetchall()
        return [
            Message.from_json(role, bytes(content).decode(), json.loads(data)) for role, content, data in rows
        ]

    async def save_initialization(self, data: dict[str, Any]) -> None:
        async with self._transaction() as conn:
            await conn.execute(
                "INSERT INTO initialization (id, data, updated_at) VALUES (1, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at",
                (json.dumps(data), time.time_ns() // 1_000_000),
            )

    async def load_initialization(self) -> dict[str, Any] | None:
        async with self._connection() as conn:
            row = await (await conn.execute("SELECT data FROM initialization WHERE id = 1")).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    # --- A3S harness runs ---------------------------------------------------------------------

    async def reserve_harness_run(
        self, session_id: str, run_id: str, record: dict[str, Any]
    ) -> dict[str, Any] | None:
        async with self._transaction() as conn:
            inserted = await conn.execute(
                "INSERT INTO harness_runs (session_id, run_id, record) VALUES (%s, %s, %s)"
                " ON CONFLICT (session_id, run_id) DO NOTHING",
                (session_id, run_id, json.dumps(record)),
            )
            if inserted.rowcount == 1:
                return None
            row = await (
                await conn.execute(
                    "SELECT record FROM harness_runs WHERE session_id = %s AND run_id = %s",
                    (session_id, run_id),
                )
            ).fetchone()
        assert row is not None  # conflicting rows are never deleted
        return dict(json.loads(row[0]))

    async def save_harness_run(self, session_id: str, run_id: str, record: dict[str, Any]) -> None:
        async with self._transaction() as conn:
            await conn.execute(
                "UPDATE harness_runs SET record = %s WHERE session_id = %s AND run_id = %s",
                (json.dumps(record), session_id, run_id),
            )

    async def load_harness_run(self, session_id: str, run_id: str) -> dict[str, Any] | None:
        async with self._connection() as conn:
            row = await (
                await conn.execute(
                    "SELECT record FROM harness_runs WHERE session_id = %s AND run_id = %s",
                    (session_id, run_id),
                )
            ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    # --- the event log -----------------------------------------------------------------------

    async def append_log(self, entries: Sequence[LogEntry]) -> None:
        async with self._transaction(entries) as conn:
            await self._append_fenced(conn, entries)

    async def _append_fenced(self, conn: AsyncConnection[Any], entries: Sequence[LogEntry]) -> None:
        """`_append` of the entries whose fence still holds (the others keep seq 0)."""
        stale: set[str] = set()
        # Lease rows are locked in one order (session ids sorted), as every writer does.
        for session_id, fence in sorted({(e.session_id, e.fence) for e in entries if e.fence is not None}):
            try:
                await _check_fence(conn, session_id, fence)
            except LeaseLost:
                stale.add(session_id)  # its run moved on: none of its entries are written
        await self._append(conn, [e for e in entries if e.session_id not in stale])

    async def _append(self, conn: AsyncConnection[Any], entries: Sequence[LogEntry]) -> None:
        """Append `entries` in the transaction of `conn`, setting their seq and id, and notify them on
        the channel (delivered when the transaction commits)."""
        if not entries:
            return
        by_session: dict[str, list[LogEntry]] = {}
        for entry in entries:
            by_session.setdefault(entry.session_id, []).append(entry)
        for session_id in sorted(by_session):  # session rows locked in one order by every writer
            group = by_session[session_id]
            last = await _allocate(conn, session_id, len(group))
            for seq, entry in enumerate(group, start=last - len(group) + 1):
                entry.seq = seq
        cursor = await conn.execute(
            "INSERT INTO event_log (session_id, seq, kind, body, created_at, origin)"
            " SELECT s, q, k, b, t, %s FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::bigint[])"
            " WITH ORDINALITY AS u(s, q, k, b, t, n) ORDER BY n RETURNING session_id, seq, id, txid::text",
            (
                self.replica_id,
                [e.session_id for e in entries],
                [e.seq for e in entries],
                [e.kind for e in entries],
                [json.dumps(e.body) for e in entries],
                [e.timestamp for e in entries],
            ),
        )
        rows = await cursor.fetchall()
        ids = {(session_id, seq): entry_id for session_id, seq, entry_id, _ in rows}
        for entry in entries:
            entry.id = ids[entry.session_id, entry.seq]
        await conn.execute(
            "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) WITH ORDINALITY AS p(payload, n) ORDER BY n",
            (LOG_CHANNEL, log_payloads(self._sealing(), self.replica_id, int(rows[0][3]), entries)),
        )

    async def read_log(self, session_id: str, after_seq: int, limit: int) -> list[LogEntry]:
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {LOG_COLUMNS} FROM event_log WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s",
                (session_id, after_seq, limit),
            )
            return [entry_from_row(row) for row in await cursor.fetchall()]

    async def read_log_since(self, after_id: int, limit: int) -> list[LogEntry]:
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {LOG_COLUMNS} FROM event_log WHERE id > %s ORDER BY id LIMIT %s", (after_id, limit)
            )
            return [entry_from_row(row) for row in await cursor.fetchall()]

    async def log_bounds(self, session_id: str) -> tuple[int, int]:
        async with self._connection() as conn:
            cursor = await conn.execute(
                "SELECT COALESCE(MIN(seq), 0), GREATEST(COALESCE(MAX(seq), 0),"
                " COALESCE((SELECT last_seq FROM sessions WHERE id = %s), 0))"
                " FROM event_log WHERE session_id = %s",
                (session_id, session_id),
            )
            row = await cursor.fetchone()
        assert row is not None  # an aggregate always has its row
        return int(row[0]), int(row[1])

    async def prune_log(self, older_than: int, keep: int) -> int:
        async with self._transaction() as conn:
            # Background work over the whole log, which no call waits for: a longer bound of its own.
            await conn.execute(
                "SELECT set_config('statement_timeout', %s, true)", (f"{RETENTION_TIMEOUT_MS}ms",)
            )
            cursor = await conn.execute(
                "DELETE FROM event_log WHERE created_at < %s OR id IN (SELECT id FROM"
                " (SELECT id, row_number() OVER (PARTITION BY session_id ORDER BY seq DESC) AS rank"
                " FROM event_log) AS ranked WHERE rank > %s)",
                (older_than, keep),
            )
            return cursor.rowcount

    # --- leases -----------------------------------------------------------------------------

    async def acquire_lease(
        self, session_id: str, owner: str, run_id: str, ttl_ms: int, trace: str = ""
    ) -> Lease | None:
        async with self._transaction() as conn:
            # `excluded.expires_at - ttl` is the database's now: a row expired before it is taken over.
            cursor = await conn.execute(
                f"INSERT INTO run_leases ({_LEASE_COLUMNS})"
                f" SELECT %s, %s, nextval('run_lease_tokens'), %s, {NOW_MS} + %s, %s"
                " ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, token = excluded.token,"
                " run_id = excluded.run_id, expires_at = excluded.expires_at, trace = excluded.trace"
                f" WHERE run_leases.expires_at < excluded.expires_at - %s RETURNING {_LEASE_COLUMNS}",
                (session_id, owner, run_id, ttl_ms, trace, ttl_ms),
            )
            row = await cursor.fetchone()
        return None if row is None else Lease(*row)

    async def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease | None:
        async with self._transaction() as conn:
            cursor = await conn.execute(
                f"UPDATE run_leases SET expires_at = {NOW_MS} + %s WHERE session_id = %s AND token = %s"
                f" RETURNING {_LEASE_COLUMNS}",
                (ttl_ms, lease.session_id, lease.token),
            )
            row = await cursor.fetchone()
        return None if row is None else Lease(*row)

    async def release_lease(self, lease: Lease, log: Sequence[LogEntry] = ()) -> None:
        async with self._transaction(log) as conn:
            await self._append_fenced(conn, log)
            await conn.execute(
                "DELETE FROM run_leases WHERE session_id = %s AND token = %s", (lease.session_id, lease.token)
            )

    async def lease_of(self, session_id: str) -> Lease | None:
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM run_leases WHERE session_id = %s", (session_id,)
            )
            row = await cursor.fetchone()
        return None if row is None else Lease(*row)

    async def expired_leases(self) -> list[Lease]:
        async with self._connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM run_leases WHERE expires_at < {NOW_MS} ORDER BY expires_at"
            )
            return [Lease(*row) for row in await cursor.fetchall()]

    async def expire_leases(self, owner: str | None) -> int:
        async with self._transaction() as conn:
            cursor = await conn.execute(
                "UPDATE run_leases SET expires_at = 0 WHERE %s::text IS NULL OR owner = %s", (owner, owner)
            )
            return cursor.rowcount

    # --- the channel between replicas --------------------------------------------------------

    async def listen(self, on_entries: EntriesHandler, on_control: ControlHandler) -> None:
        if self._listener is not None:
            raise RuntimeError("the store is listening already")
        listener = Listener(self.url, self.replica_id, self._pool, self._sealing(), on_entries, on_control)
        await listener.start()
        self._listener = listener

    async def send_control(self, message: dict[str, Any]) -> None:
        text = control_text(message)
        async with self._transaction() as conn:
            if len(text) > TEXT_LIMIT:  # by reference: the row is there when the notification is
                await conn.execute(
                    f"DELETE FROM control_messages WHERE created_at < {NOW_MS} - %s", (CONTROL_KEPT_MS,)
                )
                cursor = await conn.execute(
                    f"INSERT INTO control_messages (body, created_at) VALUES (%s, {NOW_MS}) RETURNING id",
                    (text,),
                )
                row = await cursor.fetchone()
                assert row is not None  # INSERT ... RETURNING gives its row
                text = json.dumps({"ref": row[0]})
            await conn.execute(
                "SELECT pg_notify(%s, %s)", (CONTROL_CHANNEL, control_payload(self._sealing(), text))
            )


async def _channel_seal(conn: AsyncConnection[Any]) -> ChannelSeal:
    row = await (await conn.execute("SELECT key FROM channel_key")).fetchone()
    if row is None:
        raise Unavailable(f"{STORE_NAME} has no channel key (the table channel_key is empty)")
    return ChannelSeal(bytes(row[0]))


async def _durability(conn: AsyncConnection[Any]) -> str:
    """Durability "full" when a commit returns only once the server flushed it to disk (synchronous_commit
    on, local or remote_*, each of which flushes locally first, with fsync on): it survives a power
    loss of the database's machine. "normal" when synchronous_commit is off (a crash of the server
    may lose the last commits, a crash of a replica loses none) or fsync is off."""
    settings = []
    for name in ("synchronous_commit", "fsync"):
        row = await (await conn.execute(f"SHOW {name}")).fetchone()
        settings.append(row[0] if row else "")
    return "normal" if "off" in settings else "full"


async def _check_fence(conn: AsyncConnection[Any], session_id: str, fence: int | None) -> None:
    """LeaseLost unless `fence` is the token of the session's lease (whose row stays locked until
    the transaction ends, so it cannot be taken over meanwhile); nothing when unfenced."""
    if fence is None:
        return
    cursor = await conn.execute(
        "SELECT token FROM run_leases WHERE session_id = %s FOR UPDATE", (session_id,)
    )
    row = await cursor.fetchone()
    if row is None or row[0] != fence:
        raise LeaseLost(
            f"the run of session {session_id!r} is no longer this replica's: another took it over"
        )


async def _allocate(conn: AsyncConnection[Any], session_id: str, count: int) -> int:
    """Hand out `count` seqs of a session's log; the last of them. The session row's lock keeps
    them in order; without a row (a destroyed session, or none yet) a lock on the id does, and the
    numbering continues from what is retained."""
    bump = "UPDATE sessions SET last_seq = last_seq + %s WHERE id = %s RETURNING last_seq"
    row = await (await conn.execute(bump, (count, session_id))).fetchone()
    if row is None:
        await conn.execute(_LOCK_SESSION, (SESSION_LOCK_SPACE, session_id))
        row = await (await conn.execute(bump, (count, session_id))).fetchone()  # created meanwhile?
    if row is None:
        cursor = await conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + %s FROM event_log WHERE session_id = %s", (count, session_id)
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def _insert_messages(
    conn: AsyncConnection[Any], session_id: str, messages: list[Message], created_at: int
) -> None:
    if not messages:
        return
    # content as bytes: PostgreSQL text cannot hold a NUL character, a tool's output can.
    await conn.execute(
        "INSERT INTO messages (session_id, role, content, data, created_at)"
        " SELECT %s, r, c, d, %s FROM unnest(%s::text[], %s::bytea[], %s::text[])"
        " WITH ORDINALITY AS m(r, c, d, n) ORDER BY n",
        (
            session_id,
            created_at,
            [m.role for m in messages],
            [m.content.encode() for m in messages],
            [json.dumps(m.to_json()) for m in messages],
        ),
    )


def _session_from_row(row: tuple[Any, ...]) -> Session:
    return Session(
        id=row[0],
        config=SessionConfig.from_storable(json.loads(row[1])),
        state=SessionState(row[2]),
        created_at=row[3],
        updated_at=row[4],
        settings=SessionSettings.from_json(json.loads(row[5])),
        message_count=row[6],
        usage=Usage(*row[7 : 7 + len(USAGE_COLUMNS)]),
        parent=link_of(row[7 + len(USAGE_COLUMNS) :]),
    )
