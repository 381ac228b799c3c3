"""The channel between replicas on PostgreSQL: LISTEN/NOTIFY on two channels.

`a3s_log`: every transaction that appends log entries notifies them (delivered when it commits, in
commit order) as {"origin": replica, "entries": [...]} while a payload stays under NOTIFY_LIMIT,
and as {"origin": replica, "refs": [[session_id, seq], ...]} for an entry too big for one, which
listeners read from the table. `a3s_control`: control messages, JSON, delivered to every listener.

A listener holds one dedicated connection (not the pool's). When it is lost, the listener
reconnects with a bounded backoff and, once listening again, reads from the table the entries other
replicas appended meanwhile, so that a dropped connection loses nothing that was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from psycopg import AsyncConnection, Notify, OperationalError
from psycopg_pool import AsyncConnectionPool

from ..base.backoff import Backoff
from ..base.errors import ResourceExhausted
from .postgres_schema import CONNECT_TIMEOUT_S, LOG_COLUMNS, entry_from_row
from .store import ControlHandler, EntriesHandler, LogEntry

log = logging.getLogger(__name__)
T = TypeVar("T")

LOG_CHANNEL = "a3s_log"
CONTROL_CHANNEL = "a3s_control"
# The largest payload we send, in bytes: PostgreSQL refuses one of 8,000 bytes or more.
NOTIFY_LIMIT = 7_500
CATCH_UP_PAGE = 1_000


def log_payloads(origin: str, entries: Sequence[LogEntry]) -> list[str]:
    """The notifications that announce `entries`, in their order: the entries inline, as many per
    payload as fit under NOTIFY_LIMIT; an entry too big for a payload of its own as a reference."""
    head = len(_payload(origin, "entries", []))
    payloads: list[str] = []
    kind, items, size = "entries", list[str](), head
    for entry in entries:
        item = json.dumps(_entry_json(entry), separators=(",", ":"))
        item_kind = "entries"
        if head + len(item) > NOTIFY_LIMIT:
            item, item_kind = json.dumps([entry.session_id, entry.seq]), "refs"
        if items and (item_kind != kind or size + 1 + len(item) > NOTIFY_LIMIT):
            payloads.append(_payload(origin, kind, items))
            items, size = [], head
        kind = item_kind
        size += len(item) + (1 if items else 0)
        items.append(item)
    if items:
        payloads.append(_payload(origin, kind, items))
    return payloads


def control_payload(message: dict[str, Any]) -> str:
    """A control message as a notification's payload; ResourceExhausted when it is too big for one."""
    payload = json.dumps(message, separators=(",", ":"))
    if len(payload) > NOTIFY_LIMIT:
        raise ResourceExhausted(
            f"a control message is {len(payload)} bytes of JSON, over the {NOTIFY_LIMIT}-byte limit"
            " of a PostgreSQL notification"
        )
    return payload


def _payload(origin: str, kind: str, items: list[str]) -> str:
    # ASCII only (json.dumps escapes the rest), so that characters and bytes count the same.
    return f'{{"origin":{json.dumps(origin)},"{kind}":[{",".join(items)}]}}'


def _entry_json(entry: LogEntry) -> dict[str, Any]:
    return {
        "session_id": entry.session_id,
        "kind": entry.kind,
        "body": entry.body,
        "timestamp": entry.timestamp,
        "seq": entry.seq,
        "id": entry.id,
    }


class Listener:
    """LISTENs on both channels and hands what arrives to the handlers, on the event loop; log
    entries whose origin is `replica_id` are skipped (their writer delivered them already)."""

    def __init__(
        self,
        url: str,
        replica_id: str,
        pool: AsyncConnectionPool[Any],
        on_entries: EntriesHandler,
        on_control: ControlHandler,
    ) -> None:
        self._url = url
        self._replica_id = replica_id
        self._pool = pool
        self._on_entries = on_entries
        self._on_control = on_control
        self._conn: AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_id = 0  # the largest log id seen: a catch-up after a reconnect reads past it
        self._caught_up: set[int] = set()  # ids the last catch-up delivered, not to deliver twice

    async def start(self) -> None:
        """Listen (what commits from now on is delivered), then keep reading in a task."""
        self._conn = await self._connect()
        async with self._pool.connection() as conn:
            row = await (await conn.execute("SELECT COALESCE(MAX(id), 0) FROM event_log")).fetchone()
        self._last_id = row[0] if row else 0
        self._task = asyncio.create_task(self._run(), name="a3s-postgres-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _connect(self) -> AsyncConnection[Any]:
        conn = await AsyncConnection.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        await conn.execute(f"LISTEN {LOG_CHANNEL}")
        await conn.execute(f"LISTEN {CONTROL_CHANNEL}")
        return conn

    async def _run(self) -> None:
        backoff = Backoff(0.1, 5.0, jitter=0.2)
        while True:
            try:
                if self._conn is None:
                    self._conn = await self._connect()
                    await self._catch_up()
                    log.info("the PostgreSQL channel is listening again")
                backoff.reset()
                async for notify in self._conn.notifies():
                    await self._dispatch(notify)
            except OperationalError as exc:
                delay = backoff.next_s()
                log.warning(
                    "the PostgreSQL channel lost its connection (%s); reconnecting in %.1f s", exc, delay
                )
                if self._conn is not None:
                    await self._conn.close()
                    self._conn = None
                await asyncio.sleep(delay)

    async def _dispatch(self, notify: Notify) -> None:
        try:
            await self._handle(notify)
        except OperationalError:
            raise  # the connection: reconnect
        except Exception as exc:
            # Anyone who may connect can NOTIFY on these channels: what is not ours is skipped.
            log.warning("ignored a malformed notification on %s (%r)", notify.channel, exc)

    async def _handle(self, notify: Notify) -> None:
        message = json.loads(notify.payload)
        if not isinstance(message, dict):
            raise TypeError("not a JSON object")
        if notify.channel == CONTROL_CHANNEL:
            self._call(self._on_control, message)
            return
        own = message.get("origin") == self._replica_id
        if "refs" in message:
            entries = [] if own else await self._read_refs(message["refs"])
        else:
            entries = [_entry_from_json(item) for item in message["entries"]]
        self._last_id = max([self._last_id, *(int(entry.id) for entry in entries)])
        entries = [entry for entry in entries if entry.id not in self._caught_up]
        if entries and not own:
            self._call(self._on_entries, entries)

    async def _read_refs(self, refs: list[list[Any]]) -> list[LogEntry]:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {LOG_COLUMNS} FROM event_log WHERE (session_id, seq) IN"
                " (SELECT * FROM unnest(%s::text[], %s::bigint[])) ORDER BY id",
                ([ref[0] for ref in refs], [ref[1] for ref in refs]),
            )
            return [entry_from_row(row) for row in await cursor.fetchall()]

    async def _catch_up(self) -> None:
        """Deliver what other replicas appended while the connection was down."""
        self._caught_up = set()
        while True:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(
                    f"SELECT {LOG_COLUMNS} FROM event_log WHERE id > %s AND origin <> %s ORDER BY id LIMIT %s",
                    (self._last_id, self._replica_id, CATCH_UP_PAGE),
                )
                entries = [entry_from_row(row) for row in await cursor.fetchall()]
            if not entries:
                return
            self._last_id = entries[-1].id
            self._caught_up.update(entry.id for entry in entries)
            self._call(self._on_entries, entries)

    @staticmethod
    def _call(handler: Callable[[T], None], argument: T) -> None:
        try:
            handler(argument)
        except Exception:
            log.exception("a PostgreSQL channel handler failed")


def _entry_from_json(item: dict[str, Any]) -> LogEntry:
    return LogEntry(
        item["session_id"], item["kind"], item["body"], item["timestamp"], seq=item["seq"], id=item["id"]
    )
