"""Live events: published by the core as things happen, fanned out to any number of subscribers.

Publishing never waits: each subscriber has a bounded queue, and a subscriber that falls behind
loses events and is then told how many with a WARNING event. A slow subscriber never slows the agent.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field

from ..base.errors import InvalidArgument

DEFAULT_QUEUE_SIZE = 1000
_GAP = object()


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


@dataclass
class Event:
    type: EventType
    session_id: str | None
    message: str
    data: dict[str, str] = field(default_factory=dict)
    timestamp: int = field(default_factory=lambda: time.time_ns() // 1_000_000)


class Subscription:
    """An async iterator of events matching a session and a set of types."""

    def __init__(self, bus: EventBus, session_id: str | None, types: set[EventType], size: int) -> None:
        self._bus = bus
        self.session_id = session_id
        self.types = types
        self._size = size
        # Unbounded underneath; the size is enforced in offer() so the end marker and the
        # marker of a gap always fit.
        self._queue: asyncio.Queue[Event | object | None] = asyncio.Queue()
        self.dropped = 0

    def wants(self, event: Event) -> bool:
        if self.session_id and event.session_id != self.session_id:
            return False
        return not self.types or event.type in self.types

    def offer(self, event: Event | None) -> None:
        if event is not None and self._queue.qsize() >= self._size:
            if not self.dropped:
                self._queue.put_nowait(_GAP)  # where the lost events were
            self.dropped += 1
            return
        self._queue.put_nowait(event)

    def close(self) -> None:
        self._bus._subscriptions.discard(self)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self._queue.get()
                if event is None:
                    return
                if event is _GAP:
                    count, self.dropped = self.dropped, 0
                    yield Event(
                        EventType.WARNING,
                        self.session_id,
                        f"{count} events were dropped because this subscriber fell behind",
                        {"dropped": str(count)},
                    )
                else:
                    assert isinstance(event, Event)
                    yield event
        finally:
            self.close()


class EventBus:
    def __init__(self) -> None:
        self._subscriptions: set[Subscription] = set()

    def subscribe(
        self,
        session_id: str | None = None,
        types: set[EventType] | None = None,
        size: int = DEFAULT_QUEUE_SIZE,
    ) -> Subscription:
        subscription = Subscription(self, session_id, types or set(), size)
        self._subscriptions.add(subscription)
        return subscription

    @property
    def subscriber_count(self) -> int:
        """Subscriptions open now: a client's subscription is in place once this counts it."""
        return len(self._subscriptions)

    def publish(
        self, type: EventType, session_id: str | None, message: str, data: Mapping[str, object] | None = None
    ) -> None:
        if not self._subscriptions:
            return
        event = Event(type, session_id, message, {k: str(v) for k, v in (data or {}).items()})
        for subscription in tuple(self._subscriptions):
            if subscription.wants(event):
                subscription.offer(event)

    def close(self) -> None:
        """End every subscription (at shutdown)."""
        for subscription in tuple(self._subscriptions):
            subscription.offer(None)
        self._subscriptions.clear()
