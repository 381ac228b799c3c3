"""Event subscriptions, live or from a cursor in a session's log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from ..base.errors import InvalidArgument, NotFound
from ..core.store.events import EVENT, Event, EventType, Filter, Subscription, entry_event, parse_event_types
from ..core.store.protocol import LogEntry
from ..runtime import Runtime

MAX_PAGE = 1000


class Feed:
    """Events of a subscription in place (it sees everything committed after it was made); iterate
    it, then close it. Only those of the types `shown` are passed on (none: all), and a feed that
    `ends_with` a session ends after that session's SESSION_DESTROYED (nothing can follow it)."""

    def __init__(
        self,
        subscription: Subscription,
        shown: frozenset[EventType] = frozenset(),
        ends_with: str | None = None,
    ) -> None:
        self._subscription = subscription
        self._shown = shown
        self._ends_with = ends_with

    async def __aiter__(self) -> AsyncIterator[Event]:
        async for entry in self._subscription:
            event = entry_event(entry)
            if not self._shown or event.type in self._shown:
                yield event
            if event.type is EventType.SESSION_DESTROYED and event.session_id == self._ends_with:
                return

    def close(self) -> None:
        self._subscription.close()


class Events:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def subscribe(
        self, session_id: str | None, event_types: Iterable[str], after_seq: int | None = None
    ) -> AsyncIterator[Event]:
        """The events of `open`'s feed, closed when the caller stops."""
        feed = await self.open(session_id, event_types, after_seq)
        try:
            async for event in feed:
                yield event
        finally:
            feed.close()

    async def open(
        self, session_id: str | None, event_types: Iterable[str], after_seq: int | None = None
    ) -> Feed:
        """A subscription in place on return: events of one session (None: of all) and of the
        named types (none: every type), until the server closes the bus or, for one session,
        until it is destroyed (the feed ends after its SESSION_DESTROYED, or where it would be
        when filtered out); with `after_seq`, first those of the session's log after it (Resync
        when they are no longer retained). NotFound for an unknown session. Iterate, then close it."""
        wanted = parse_event_types(event_types)
        watched = wanted | {EventType.SESSION_DESTROYED} if wanted and session_id else wanted
        subscription = await self._subscribe(session_id, watched, after_seq)
        return Feed(subscription, frozenset(wanted), session_id)

    async def subscription(
        self, session_id: str | None, types: Iterable[EventType], after_seq: int | None = None
    ) -> Feed:
        """A subscription in place at once, so that it sees everything a call started next
        publishes; the caller iterates and closes it. NotFound for an unknown session."""
        return Feed(await self._subscribe(session_id, types, after_seq))

    async def _subscribe(
        self, session_id: str | None, types: Iterable[EventType], after_seq: int | None
    ) -> Subscription:
        if session_id is not None:
            await self._check_session(session_id, with_log=after_seq is not None)
        return await self._rt.events.subscribe(
            Filter(session_id, EVENT, frozenset(types)), after_seq=after_seq
        )

    async def page(self, session_id: str, after_seq: int, limit: int) -> tuple[list[Event | LogEntry], int]:
        """Up to `limit` entries of the session's log after `after_seq` (events as Events, chunks
        as they are stored), and the last seq handed out; Resync when the entries after the cursor
        are no longer retained."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidArgument(f"limit must be 1 to {MAX_PAGE}, not {limit}")
        await self._check_session(session_id, with_log=True)
        await self._rt.events.check_cursor(session_id, after_seq)
        entries = await self._rt.store.read_log(session_id, after_seq, limit)
        _, last = await self._rt.store.log_bounds(session_id)
        return [entry_event(e) if e.kind == EVENT else e for e in entries], last

    async def _check_session(self, session_id: str, *, with_log: bool) -> None:
        """NotFound for an unknown session; `with_log`: unless it left a log (a destroyed
        session's log can still be read from a cursor until retention removes it)."""
        await self._rt.sessions.refresh(session_id)
        try:
            self._rt.sessions.get(session_id)
        except NotFound:
            if not with_log or (await self._rt.store.log_bounds(session_id))[1] == 0:
                raise

    def end_all(self) -> None:
        """End every event subscription now (at a stop: streams would otherwise run through the
        grace); streams following a generation go on while it runs."""
        self._rt.events.end_subscriptions()
