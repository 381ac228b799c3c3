"""The channel between replicas on PostgreSQL: LISTEN/NOTIFY on two channels.

`a3s_log`: every transaction that appends log entries notifies them (delivered when it commits, in
commit order) as {"origin": replica, "entries": [...]} while a payload stays under NOTIFY_LIMIT,
and as {"origin": replica, "refs": [[session_id, seq], ...]} for an entry too big for one, which
listeners read from the table. `a3s_control`: control messages, JSON, delivered to every listener;
one too big for a notification is stored in `control_messages` and notified as {"ref": id}.

Every payload is sealed (channel_seal.py: anyone who may connect may listen and notify). A log
notification that does not open is taken only as a hint: the entries it names are read from the
table, so what it says of them is never believed (and a replica of a version before the seal is
still heard). A control message that does not open is dropped, as is one sent more than
CONTROL_WINDOW_S ago (by the sender's clock) or heard before: a captured one cannot be replayed.

A listener holds one dedicated connection (not the pool's). When it is lost, the listener
reconnects with a bounded backoff and, once listening again, reads from the table the entries other
replicas appended meanwhile, so that a dropped connection loses nothing that was committed.

What it missed is found by transaction, not by id: ids are handed out at insert and transactions
commit in any order, so "the ids above the last one seen" would miss an entry whose transaction
took its id before that one and committed while the connection was down. Each entry records its
transaction (`event_log.txid`, also in the notification), and the listener keeps a horizon: every
transaction older than it had ended, and its entries had reached the listener (or were there
before it started). A catch-up reads the entries of the transactions from the horizon on, each
session's in order, skipping those already delivered (per session: the seqs below the next one
expected); it then moves the horizon to the oldest transaction running when it began reading.
A notification is skipped only when that catch-up delivered its entry.
While listening, the oldest running transaction is sampled every HORIZON_EVERY_S and becomes the
horizon one period later, on the same connection, by when every notification of what had ended
before the sample has arrived and been handed on.
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

from ...base.backoff import Backoff
from .channel_seal import ChannelSeal, sealed_capacity
from .events import now_ms
from .postgres_schema import CONNECT_TIMEOUT_S, LOG_COLUMNS, entry_from_row
from .protocol import ControlHandler, EntriesHandler, LogEntry

log = logging.getLogger(__name__)
T = TypeVar("T")

LOG_CHANNEL = "a3s_log"
CONTROL_CHANNEL = "a3s_control"
# The largest payload we send, in bytes: PostgreSQL refuses one of 8,000 bytes or more.
NOTIFY_LIMIT = 7_500
TEXT_LIMIT = sealed_capacity(NOTIFY_LIMIT)  # the most JSON a payload carries, sealed within the limit
CONTROL_WINDOW_S = 60.0
"""A control message sent longer ago than this (or later than this ahead, by the receiver's clock)
is dropped: replicas' clocks must agree within it."""
CATCH_UP_PAGE = 1_000
HORIZON_EVERY_S = 5.0
ANSWER_WITHIN_S = 10.0
"""A listening connection whose server does not answer a sample within this long is taken as lost
(a network that dropped it without a word): it is replaced."""
LISTENER_NAME = "a3s-agent listener"
"""The listening connection's application_name (followed by the replica id)."""
_OLDEST_RUNNING = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"
_WITH_TXID = f"{LOG_COLUMNS}, txid::text"  # an entry's columns and its transaction: _entry_and_txid


def log_payloads(seal: ChannelSeal, origin: str, txid: int, entries: Sequence[LogEntry]) -> list[str]:
    """The notifications that announce `entries`, written by transaction `txid`, in their order,
    sealed: the entries inline, as many per payload as fit under NOTIFY_LIMIT; an entry too big for
    a payload of its own as a reference."""
    head = len(_payload(origin, txid, "entries", []))
    payloads: list[str] = []
    kind, items, size = "entries", list[str](), head
    for entry in entries:
        item = json.dumps(_entry_json(entry), separators=(",", ":"))
        item_kind = "entries"
        if head + len(item) > TEXT_LIMIT:
            item, item_kind = json.dumps([entry.session_id, entry.seq]), "refs"
        if items and (item_kind != kind or size + 1 + len(item) > TEXT_LIMIT):
            payloads.append(_payload(origin, txid, kind, items))
            items, size = [], head
        kind = item_kind
        size += len(item) + (1 if items else 0)
        items.append(item)
    if items:
        payloads.append(_payload(origin, txid, kind, items))
    return [seal.seal(payload, LOG_CHANNEL) for payload in payloads]


def control_text(message: dict[str, Any]) -> str:
    """A control message as JSON, with the time it was sent."""
    return json.dumps({**message, "sent": now_ms()}, separators=(",", ":"))


def control_payload(seal: ChannelSeal, text: str) -> str:
    """A control message's JSON (control_text, or {"ref": id} for one stored in control_messages)
    as a sealed notification's payload."""
    return seal.seal(text, CONTROL_CHANNEL)


def _payload(origin: str, txid: int, kind: str, items: list[str]) -> str:
    # ASCII only (json.dumps escapes the rest), so that characters and bytes count the same.
    return f'{{"origin":{json.dumps(origin)},"txid":{txid},"{kind}":[{",".join(items)}]}}'


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
        seal: ChannelSeal,
        on_entries: EntriesHandler,
        on_control: ControlHandler,
    ) -> None:
        self._url = url
        self._replica_id = replica_id
        self._pool = pool
        self._seal = seal
        self._heard: dict[bytes, float] = {}  # the control messages' nonces, until their window passes
        self._on_entries = on_entries
        self._on_control = on_control
        self._conn: AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._horizon = 0  # see the module's docstring
        self._sampled: int | None = None  # the next horizon, sampled on the current connection
        # Per session: the seq after the entries delivered, and the newest transaction among them
        # (None when one was unknown); a session is forgotten once the horizon passes it. The newest,
        # not the last: a session's transactions commit in the order of their seqs, not of their ids.
        # A catch-up skips what it finds below; notifications are skipped only when the last catch-up
        # delivered them.
        self._next: dict[str, tuple[int, int | None]] = {}
        self._caught_up: set[tuple[str, int]] = set()

    async def start(self) -> None:
        """Listen (what commits from now on is delivered), then keep reading in a task."""
        conn = await self._connect(listening=False)
        # What is there before it listens counts as delivered; what commits after that is not.
        rows = await _answer(
            conn,
            f"WITH oldest AS ({_OLDEST_RUNNING} AS txid) SELECT oldest.txid, e.session_id, MAX(e.seq),"
            " MAX(e.txid::text::bigint) FROM oldest LEFT JOIN event_log e ON e.txid >= oldest.txid::xid8"
            " GROUP BY oldest.txid, e.session_id",
        )
        self._horizon = int(rows[0][0])
        self._next = {
            session_id: (last + 1, newest) for _, session_id, last, newest in rows if session_id is not None
        }
        await self._listen(conn)
        self._conn = conn
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

    async def _connect(self, listening: bool = True) -> AsyncConnection[Any]:
        conn = await AsyncConnection.connect(
            self._url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=f"{LISTENER_NAME} {self._replica_id}"[:63],  # for pg_stat_activity
        )
        if listening:
            await self._listen(conn)
        return conn

    @staticmethod
    async def _listen(conn: AsyncConnection[Any]) -> None:
        await conn.execute(f"LISTEN {LOG_CHANNEL}")
        await conn.execute(f"LISTEN {CONTROL_CHANNEL}")

    async def _run(self) -> None:
        backoff = Backoff(0.1, 5.0, jitter=0.2)
        while True:
            try:
                if self._conn is None:
                    self._conn = await self._connect()
                    await self._catch_up()
                    log.info("the PostgreSQL channel is listening again")
                backoff.reset()
                async for notify in self._conn.notifies(timeout=HORIZON_EVERY_S):
                    await self._dispatch(notify)
                await self._advance(self._conn)
            except OperationalError as exc:
                self._sampled = None  # a sample counts only on the connection it was taken on
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
            log.warning("ignored a notification on %s: %s", notify.channel, exc)

    async def _handle(self, notify: Notify) -> None:
        opened = self._seal.open(notify.payload, notify.channel)
        if notify.channel == CONTROL_CHANNEL:
            if opened is None:
                raise ValueError("a control message not sealed with the replicas' key")
            text, nonce = opened
            message = _object(text)
            if "ref" in message:
                message = _object(await self._stored_control(message["ref"]))
            self._call(self._on_control, self._fresh(message, nonce))
            return
        if opened is None:  # a hint at most: what it names is read from the table
            hinted = _object(notify.payload)
            named = _refs(hinted.get("entries", [])) + _refs(hinted.get("refs", []))
            self._hand_on(await self._read_refs(named), caught_up=False)
            return
        message = _object(opened[0])
        if message.get("origin") == self._replica_id:
            return  # its writer delivered them
        if "refs" in message:
            self._hand_on(await self._read_refs(_refs(message["refs"])), caught_up=False)
            return
        txid = message.get("txid")
        if type(txid) is not int:
            raise TypeError(f"not a transaction id: {str(txid)[:200]}")
        entries = [_entry_from_json(item) for item in message["entries"]]
        self._hand_on([(entry, txid) for entry in entries], caught_up=False)

    async def _stored_control(self, ref: Any) -> str:
        """The JSON of a control message stored in control_messages; LookupError once it is gone."""
        if type(ref) is not int:
            raise TypeError(f"not a control message's id: {str(ref)[:200]}")
        async with self._pool.connection() as conn:
            row = await (
                await conn.execute("SELECT body FROM control_messages WHERE id = %s", (ref,))
            ).fetchone()
        if row is None:
            raise LookupError(f"control message {ref} is no longer stored")
        return str(row[0])

    def _fresh(self, message: dict[str, Any], nonce: bytes) -> dict[str, Any]:
        """The control message without its send time; ValueError when it is outside the window or
        was heard before."""
        now = now_ms() / 1000
        self._heard = {heard: until for heard, until in self._heard.items() if until > now}
        sent = message.pop("sent", None)
        if type(sent) is not int or abs(now - sent / 1000) > CONTROL_WINDOW_S:
            raise ValueError(f"a control message sent outside the last {CONTROL_WINDOW_S:g} s")
        if nonce in self._heard:
            raise ValueError("a control message heard before (replayed)")
        self._heard[nonce] = now + 2 * CONTROL_WINDOW_S
        return message

    async def _read_refs(self, refs: list[tuple[str, int]]) -> list[tuple[LogEntry, int]]:
        """The entries named (session id, seq) that are in the table, each with its transaction."""
        if not refs:
            return []
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_WITH_TXID} FROM event_log WHERE (session_id, seq) IN"
                " (SELECT * FROM unnest(%s::text[], %s::bigint[])) ORDER BY id",
                ([ref[0] for ref in refs], [ref[1] for ref in refs]),
            )
            return [_entry_and_txid(row) for row in await cursor.fetchall()]

    async def _catch_up(self) -> None:
        """Deliver what other replicas committed while the connection was down (module docstring)."""
        async with self._pool.connection() as conn:
            row = await (await conn.execute(_OLDEST_RUNNING)).fetchone()
        oldest = int(row[0]) if row else self._horizon  # every older transaction had ended: all read below
        self._caught_up.clear()
        after: tuple[str, int] = ("", 0)
        while True:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(
                    f"SELECT {_WITH_TXID} FROM event_log WHERE txid >= %s::xid8"
                    " AND origin <> %s AND (session_id, seq) > (%s, %s) ORDER BY session_id, seq LIMIT %s",
                    (str(self._horizon), self._replica_id, *after, CATCH_UP_PAGE),
                )
                rows = await cursor.fetchall()
            found = [_entry_and_txid(row) for row in rows]
            self._hand_on(found, caught_up=True)
            if len(rows) < CATCH_UP_PAGE:
                break
            after = (found[-1][0].session_id, found[-1][0].seq)
        self._move_horizon(oldest)

    async def _advance(self, conn: AsyncConnection[Any]) -> None:
        """The sample of one period ago becomes the horizon; a new one is taken on `conn`."""
        [(oldest,)] = await _answer(conn, _OLDEST_RUNNING)
        # The server sends what it holds for us before the answer: hand that on before moving on.
        async for notify in conn.notifies(timeout=0):
            await self._dispatch(notify)
        self._caught_up.clear()  # the notifications of what a catch-up found came a period ago
        if self._sampled is not None:
            self._move_horizon(self._sampled)
        self._sampled = int(oldest)

    def _move_horizon(self, horizon: int) -> None:
        self._horizon = max(self._horizon, horizon)
        self._next = {
            session_id: expected
            for session_id, expected in self._next.items()
            if expected[1] is None or expected[1] >= self._horizon
        }

    def _hand_on(self, found: Sequence[tuple[LogEntry, int | None]], *, caught_up: bool) -> None:
        """Hand the entries not delivered yet to the handler (each with its transaction's id), from a
        catch-up or from a notification."""
        fresh = []
        for entry, txid in found:
            key = (entry.session_id, entry.seq)
            expected = self._next.get(entry.session_id)
            if caught_up:
                if expected is not None and entry.seq < expected[0]:
                    continue  # delivered before the connection dropped
                self._caught_up.add(key)
            elif key in self._caught_up:
                continue
            if expected is None:
                self._next[entry.session_id] = (entry.seq + 1, txid)
            else:
                newest = None if txid is None or expected[1] is None else max(txid, expected[1])
                self._next[entry.session_id] = (max(entry.seq + 1, expected[0]), newest)
            fresh.append(entry)
        if fresh:
            self._call(self._on_entries, fresh)

    @staticmethod
    def _call(handler: Callable[[T], None], argument: T) -> None:
        try:
            handler(argument)
        except Exception:
            log.exception("a PostgreSQL channel handler failed")


async def _answer(conn: AsyncConnection[Any], sql: str) -> list[Any]:
    """The rows of `sql` on the listening connection (which no statement_timeout bounds); a server
    that gives no answer within ANSWER_WITHIN_S counts as a lost connection."""
    try:
        async with asyncio.timeout(ANSWER_WITHIN_S):
            return await (await conn.execute(sql)).fetchall()
    except TimeoutError:
        raise OperationalError(f"no answer within {ANSWER_WITHIN_S:g} s") from None


_ENTRY_FIELDS = {"session_id": str, "kind": str, "body": dict, "timestamp": int, "seq": int, "id": int}


def _entry_and_txid(row: tuple[Any, ...]) -> tuple[LogEntry, int]:
    return entry_from_row(row[:-1]), int(row[-1])


def _object(text: str) -> dict[str, Any]:
    message = json.loads(text)
    if not isinstance(message, dict):
        raise TypeError("not a JSON object")
    return message


def _refs(items: Any) -> list[tuple[str, int]]:
    """(session id, seq) of each entry or reference in a notification's list; TypeError for
    anything else."""
    if not isinstance(items, list):
        raise TypeError("not a list")
    refs = []
    for item in items:
        if isinstance(item, dict):
            item = [item.get("session_id"), item.get("seq")]
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is str and type(item[1]) is int):
            raise TypeError(f"not an entry or a reference: {str(item)[:200]}")
        refs.append((item[0], item[1]))
    return refs


def _entry_from_json(item: Any) -> LogEntry:
    """An entry of a notification; TypeError for anything else (such as what another client sent)."""
    if not isinstance(item, dict) or not all(
        type(item.get(name)) is kind for name, kind in _ENTRY_FIELDS.items()
    ):
        raise TypeError(f"not a log entry: {str(item)[:200]}")
    return LogEntry(
        item["session_id"], item["kind"], item["body"], item["timestamp"], seq=item["seq"], id=item["id"]
    )
