"""Events: every AgentEvent (and every generation chunk worth replaying) is appended to its
session's durable log (core/store/protocol.py LogEntry) and, once committed, handed to the subscribers.

Publishing never waits: `publish` queues the entry and a writer commits whatever has queued in
one transaction (a group commit). A write that changes state carries its events in the same
transaction (`EventBus.write`). Subscribers read committed entries in seq order with no gap and
no repeat: a subscriber that falls behind (its bounded queue is full) or resumes from a cursor
reads the log at its own pace, so a slow subscriber never slows the agent nor loses an event.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ...base import metrics
from ...base.errors import FailedPrecondition, InvalidArgument
from .protocol import LogEntry, Store

log = logging.getLogger(__name__)

DEFAULT_QUEUE_SIZE = 1000
PAGE = 500  # entries read from the log at a time while catching up
EVENT = "event"
CHUNK = "chunk"
T = TypeVar("T")


class EventType(enum.IntEnum):
    """Numbers match the wire enum AgentEvent.EventType."""

    SESSION_CREATED = 1
    SESSION_DESTROYED = 2
    GENERATION_STARTED = 3
    GENERATION_COMPLETED = 4
    TOOL_CALLED = 5
    TOOL_COMPLETED = 6
    ERROR = 7
    WARNING = 8
    INFO = 9
    CONFIRMATION_REQUIRED = 10
    CONFIRMATION_RECEIVED = 11
    CONFIRMATION_TIMEOUT = 12
    EXTERNAL_TASK_PENDING = 13
    EXTERNAL_TASK_COMPLETED = 14
    PERMISSION_DENIED = 15


def parse_event_types(names: Iterable[str]) -> set[EventType]:
    """Accept `EVENT_TYPE_TOOL_CALLED`, `TOOL_CALLED` and `tool_called`; InvalidArgument otherwise."""
    types = set()
    for name in names:
        key = name.strip().upper().removeprefix("EVENT_TYPE_")
        if key not in EventType.__members__:
            valid = ", ".join(t.name.lower() for t in EventType)
            raise InvalidArgument(f"event_types: unknown event type {name!r} (valid: {valid})")
        types.add(EventType[key])
    return types


class Resync(FailedPrecondition):
    """A cursor older than the retained log: the entries after it are gone."""

    def __init__(self, after_seq: int, oldest: int) -> None:
        shown = f"the oldest available is {oldest}" if oldest else "none is retained"
        super().__init__(
            f"resync: the events after seq {after_seq} are no longer retained ({shown});"
            " read the session's state again and subscribe from there"
        )
        self.oldest = oldest


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Event:
    type: EventType
    session_id: str | None
    message: str
    data: dict[str, str] = field(default_factory=dict)
    timestamp: int = field(default_factory=now_ms)
    seq: int = 0


def event_entry(
    type: EventType, session_id: str, message: str, data: Mapping[str, object] | None = None
) -> LogEntry:
    body = {"type": int(type), "message": message, "data": {k: str(v) for k, v in (data or {}).items()}}
    return LogEntry(session_id, EVENT, body, now_ms())


def entry_event(entry: LogEntry) -> Event:
    """The event an entry of kind "event" records, its seq also in `data["seq"]`."""
    body = entry.body
    data = {**body["data"], "seq": str(entry.seq)}
    return Event(EventType(body["type"]), entry.session_id, body["message"], data, entry.timestamp, entry.seq)


@dataclass(frozen=True)
class Filter:
    """Which entries a subscriber wants."""

    session_id: str | None = None  # None: every session
    kind: str = EVENT
    types: frozenset[EventType] = frozenset()  # events: empty means every type
    run_id: str = ""  # chunks: of this run only

    def wants(self, entry: LogEntry) -> bool:
        if self.session_id is not None and entry.session_id != self.session_id:
            return False
        if entry.kind != self.kind:
            return False
        if self.kind == EVENT:
            return not self.types or entry.body["type"] in self.types
        return not self.run_id or entry.body.get("run") == self.run_id


class _Behind:
    """Queued when a subscription's queue overflowed: a reader waiting on the queue wakes to read
    the log instead."""


_BEHIND = _Behind()


class Subscription:
    """Committed entries matching a filter, per session in seq order, each once. Iterate it
    (`async for entry in subscription`); it ends when the bus closes or `close` is called."""

    def __init__(self, bus: EventBus, wanted: Filter, size: int, after_seq: int | None) -> None:
        self._bus = bus
        self.filter = wanted
        self._size = size
        self._queue: asyncio.Queue[LogEntry | _Behind | None] = asyncio.Queue()
        self._next: dict[str, int] = {}  # per session: the seq to deliver next
        self._missed: dict[str, int] = {}
        """Per session, the first seq of the wanted entries not queued (dropped when the queue
        overflowed, or offered while behind): the log is read from there, or from `_next`."""
        if after_seq is not None and wanted.session_id is not None:
            self._next[wanted.session_id] = self._missed[wanted.session_id] = after_seq + 1
        self._behind = after_seq is not None  # read the log before the live entries
        self._closed = False

    def offer(self, entry: LogEntry | None) -> None:
        if entry is None:
            self._queue.put_nowait(None)
        elif self._behind:
            self._miss(entry)
        elif self._queue.qsize() >= self._size:
            # Too far behind: drop what is queued and read the log of their sessions instead.
            # Each session's own (by seq), not the whole log's by position: on a shared store,
            # transactions commit out of position order.
            self._behind = True
            ended = False
            while not self._queue.empty():
                queued = self._queue.get_nowait()
                if queued is None:
                    ended = True
                elif isinstance(queued, LogEntry):
                    self._miss(queued)
            self._miss(entry)
            self._queue.put_nowait(_BEHIND)
            if ended:
                self._queue.put_nowait(None)  # the end stays, after the catching up
        else:
            self._queue.put_nowait(entry)

    def _miss(self, entry: LogEntry) -> None:
        if self.filter.wants(entry):
            first = self._missed.get(entry.session_id, entry.seq)
            self._missed[entry.session_id] = min(first, entry.seq)

    @property
    def queued(self) -> int:
        """Entries offered and not taken yet: how far the subscriber lags the log."""
        return self._queue.qsize()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._bus._forget(self)
            self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[LogEntry]:
        return self._entries()

    async def _entries(self) -> AsyncIterator[LogEntry]:
        try:
            while not self._closed:
                if self._behind:
                    self._behind = False  # live entries queue again from here; duplicates are skipped
                    async for entry in self._catch_up():
                        yield entry
                    continue
                queued = await self._queue.get()
                if queued is None:
                    return
                if isinstance(queued, _Behind):
                    continue
                for ready in await self._in_order(queued):
                    yield ready
        finally:
            self.close()

    async def _catch_up(self) -> AsyncIterator[LogEntry]:
        missed, self._missed = self._missed, {}
        for session_id, first in missed.items():
            after = self._next.get(session_id, first) - 1
            while True:
                page = await self._bus.store.read_log(session_id, after, PAGE)
                for entry in page:
                    for ready in await self._in_order(entry):
                        yield ready
                if len(page) < PAGE:
                    break
                after = page[-1].seq

    async def _in_order(self, entry: LogEntry) -> list[LogEntry]:
        """`entry` once, after any entries of its session between the last delivered and it
        (read from the log: another replica's, or committed while this one was starting), as
        far as the filter wants them. A list, not a generator: one per entry is the hot path."""
        expected = self._next.get(entry.session_id)
        if expected is not None and entry.seq < expected:
            return []  # delivered already
        ready = []
        if expected is not None and entry.seq > expected:
            missing = await self._bus.store.read_log(entry.session_id, expected - 1, entry.seq - expected)
            for earlier in missing:
                if earlier.seq < entry.seq:
                    self._deliver(earlier)
                    if self.filter.wants(earlier):
                        ready.append(earlier)
        self._deliver(entry)
        if self.filter.wants(entry):
            ready.append(entry)
        return ready

    def _deliver(self, entry: LogEntry) -> None:
        self._next[entry.session_id] = entry.seq + 1


class EventBus:
    """The log writer and the live fan-out of one process."""

    def __init__(self, store: Store, fence_for: Callable[[str], int | None] = lambda _: None) -> None:
        self.store = store
        self.fence_for = fence_for  # the lease token this process holds for a session, if any
        self.on_fenced: Callable[[str], None] = lambda _: None  # told when a session's entries were refused
        self._subscriptions: dict[str | None, set[Subscription]] = {}
        """By the session they follow (None: every session), so that an entry is offered only to
        its session's subscribers and to those of every session."""
        self._pending: list[LogEntry] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()  # one log-bearing write at a time keeps each session's order
        self._closed = False

    # --- subscribing ------------------------------------------------------------------------

    async def subscribe(
        self, wanted: Filter, size: int = DEFAULT_QUEUE_SIZE, after_seq: int | None = None
    ) -> Subscription:
        """A subscription in place at once (it sees every entry committed from now on), starting
        after `after_seq` when given (of `wanted.session_id`): Resync when the entries after it
        are no longer retained, InvalidArgument when it is past the last."""
        if after_seq is not None:
            if wanted.session_id is None:
                raise InvalidArgument("a cursor (after_seq) needs a session: each session's log is numbered")
            await self.check_cursor(wanted.session_id, after_seq)
        subscription = Subscription(self, wanted, size, after_seq)
        self._subscriptions.setdefault(wanted.session_id, set()).add(subscription)
        return subscription

    def _forget(self, subscription: Subscription) -> None:
        followers = self._subscriptions.get(subscription.filter.session_id)
        if followers is not None:
            followers.discard(subscription)
            if not followers:
                del self._subscriptions[subscription.filter.session_id]

    def _all(self) -> list[Subscription]:
        return [s for followers in self._subscriptions.values() for s in followers]

    async def check_cursor(self, session_id: str, after_seq: int) -> None:
        """InvalidArgument for a cursor past the last seq, Resync for one older than the log."""
        if after_seq < 0:
            raise InvalidArgument(f"after_seq must be 0 or more, not {after_seq}")
        oldest, last = await self.store.log_bounds(session_id)
        if after_seq > last:
            raise InvalidArgument(
                f"after_seq {after_seq} is past the last event of session {session_id!r} (seq {last})"
            )
        if after_seq < last and (oldest == 0 or oldest > after_seq + 1):
            raise Resync(after_seq, oldest)

    @property
    def subscriber_count(self) -> int:
        """Subscriptions open now: a client's subscription is in place once this counts it."""
        return sum(len(followers) for followers in self._subscriptions.values())

    def subscriber_lag(self) -> int:
        """The most entries any subscription has queued and not taken yet (0 with none)."""
        return max((s.queued for s in tuple(self._all())), default=0)

    # --- writing ----------------------------------------------------------------------------

    def publish(
        self, type: EventType, session_id: str, message: str, data: Mapping[str, object] | None = None
    ) -> None:
        """Queue an event for the log; it reaches subscribers once committed."""
        self.submit(event_entry(type, session_id, message, data))

    def submit(self, entry: LogEntry) -> None:
        if self._closed:
            return
        entry.fence = self.fence_for(entry.session_id)
        self._pending.append(entry)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_pending())

    async def append(self, entry: LogEntry) -> LogEntry:
        """Queue an entry and wait until it is committed (its seq set; 0 when it was refused)."""
        self.submit(entry)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter
        return entry

    async def flush(self) -> None:
        """Wait until everything published so far is committed."""
        if self._pending or (self._writer is not None and not self._writer.done()):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            if self._writer is None or self._writer.done():
                self._writer = asyncio.get_running_loop().create_task(self._write_pending())
            await waiter

    async def _write_pending(self) -> None:
        while self._pending or self._waiters:
            async with self._writing:
                batch, self._pending = self._pending, []
                waiters, self._waiters = self._waiters, []
                try:
                    if batch:
                        started = time.perf_counter()
                        await self.store.append_log(batch)
                        _committed("events", started)
                except Exception:
                    log.exception("could not append %d event(s) to the log", len(batch))
                    for entry in batch:
                        entry.seq = 0
                    batch = []
            self._delivered(batch)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def write(
        self, session_id: str, entries: Sequence[LogEntry], change: Callable[[list[LogEntry]], Awaitable[T]]
    ) -> T:
        """Run a state change that carries log entries in its transaction (`change(entries)`),
        preceded by the session's queued entries so that its log keeps the order of events."""
        fence = self.fence_for(session_id)
        for entry in entries:
            entry.fence = fence
        async with self._writing:
            queued = [e for e in self._pending if e.session_id == session_id]
            self._pending = [e for e in self._pending if e.session_id != session_id]
            carried = [*queued, *entries]
            try:
                started = time.perf_counter()
                result = await change(carried)
                _committed("state", started)
            except BaseException:
                self._pending[:0] = queued  # not written: they go with the next batch
                raise
        self._delivered(carried)
        return result

    def deliver(self, entries: Iterable[LogEntry]) -> None:
        """Hand committed entries (another replica's) to the subscribers."""
        subscriptions = self._subscriptions
        for entry in entries:
            for session_id in (entry.session_id, None):
                followers = subscriptions.get(session_id)
                if followers:
                    for subscription in tuple(followers):
                        subscription.offer(entry)

    def _delivered(self, entries: Sequence[LogEntry]) -> None:
        refused = {e.session_id for e in entries if e.seq == 0}
        for session_id in refused:
            self.on_fenced(session_id)
        self.deliver(e for e in entries if e.seq)

    async def close(self) -> None:
        """Commit what is queued, then end every subscription (at shutdown)."""
        await self.flush()
        self._closed = True
        for subscription in self._all():
            subscription.offer(None)
        self._subscriptions.clear()

    def end_subscriptions(self) -> None:
        """End every event subscription now (at a stop: streams would otherwise run through the
        grace); those following a generation go on while it runs."""
        for subscription in self._all():
            if subscription.filter.kind == EVENT:
                subscription.offer(None)
                self._forget(subscription)


def _committed(kind: str, started: float) -> None:
    """A commit's duration: of log entries alone (`events`) or of a state change carrying them (`state`)."""
    if metrics.enabled():
        metrics.record(metrics.STORE_COMMIT, time.perf_counter() - started, {"a3s.store.commit.kind": kind})
