"""Event subscriptions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from ..core.events import Event, EventType, Subscription, parse_event_types
from ..runtime import Runtime


class Events:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def subscribe(self, session_id: str | None, event_types: Iterable[str]) -> AsyncIterator[Event]:
        """Events of one session (None: of all) and of the named types (none: every type), until
        the server closes the bus; NotFound for an unknown session."""
        if session_id is not None:
            self._rt.sessions.get(session_id)
        types = parse_event_types(event_types)
        subscription = self._rt.events.subscribe(session_id, types)
        try:
            async for event in subscription:
                yield event
        finally:
            subscription.close()

    def subscription(self, session_id: str, types: Iterable[EventType]) -> Subscription:
        """A subscription in place at once, so that it sees everything a call started next
        publishes; the caller iterates and closes it. NotFound for an unknown session."""
        self._rt.sessions.get(session_id)
        return self._rt.events.subscribe(session_id, set(types))

    def end_all(self) -> None:
        """End every subscription now (at a stop: streams would otherwise run through the grace)."""
        self._rt.events.close()
