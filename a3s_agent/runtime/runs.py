"""Generations that outlive their stream: a run goes on when its caller goes away (Cancel stops it),
every event it yields is committed to the session's log as a chunk before anyone sees it, and any
caller on any replica follows it from a seq: the first from the start, one that lost its stream
from the last seq it saw, each chunk exactly once."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from ..base.errors import AgentError, Internal, InvalidArgument, Unavailable
from ..base.models import Message
from ..core.loop.agent import Agent, AgentEvent, DoneEvent, GenerateOptions
from ..core.loop.chunks import chunk_entry, entry_chunk, failure_entry
from ..core.sessions.manager import SessionManager
from ..core.store.events import CHUNK, EventBus, Filter, Subscription
from ..core.store.protocol import LeaseLost, LogEntry

log = logging.getLogger(__name__)

Chunk = tuple[AgentEvent, int]
"""An event of a run and its seq in the session's log."""


class Runs:
    def __init__(self, agent: Agent, bus: EventBus, sessions: SessionManager) -> None:
        self._agent = agent
        self._bus = bus
        self._sessions = sessions
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(
        self, session_id: str, messages: list[Message], options: GenerateOptions
    ) -> AsyncIterator[Chunk]:
        """Start a generation and follow it. What fails before its first event (validation, a
        paused session, no model) raises here and leaves nothing in the log."""
        await self._sessions.refresh(session_id)
        run_id = options.run_id or f"run_{uuid.uuid4().hex}"
        subscription = await self._bus.subscribe(Filter(session_id, CHUNK, run_id=run_id))
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved if the caller left
        task = asyncio.get_running_loop().create_task(
            self._execute(session_id, messages, replace(options, run_id=run_id), started)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            await asyncio.shield(started)
        except BaseException:
            subscription.close()
            raise
        return _follow(subscription)

    async def resume(self, session_id: str, after_seq: int) -> AsyncIterator[Chunk]:
        """Follow the run that wrote the chunk `after_seq` from the chunk after it (to its end,
        which may be in the log already)."""
        await self._sessions.refresh(session_id)
        self._sessions.get(session_id)
        await self._bus.check_cursor(session_id, after_seq)  # Resync when the log no longer has it
        named = await self._bus.store.read_log(session_id, after_seq - 1, 1) if after_seq > 0 else []
        if not named or named[0].seq != after_seq or named[0].kind != CHUNK:
            raise InvalidArgument(
                f"a3s-after-seq {after_seq} names no generation chunk of session {session_id!r}:"
                " resume from the seq of the last chunk received"
            )
        if "done" in named[0].body.get("chunk", {}):
            return _ended()  # the run's last chunk: nothing follows it
        wanted = Filter(session_id, CHUNK, run_id=named[0].body["run"])
        return _follow(await self._bus.subscribe(wanted, after_seq=after_seq))

    async def follow_run(self, session_id: str, run_id: str, after_seq: int) -> AsyncIterator[Chunk]:
        """Follow the run `run_id` from its first chunk after `after_seq` (to its end, which may
        be in the log already): for a caller that kept the run's id from its start, and the seq
        it had seen, which need not be one of the run's chunks."""
        await self._sessions.refresh(session_id)
        self._sessions.get(session_id)
        await self._bus.check_cursor(session_id, after_seq)  # Resync when the log no longer has it
        return _follow(
            await self._bus.subscribe(Filter(session_id, CHUNK, run_id=run_id), after_seq=after_seq)
        )

    async def here(
        self, session_id: str, messages: list[Message], options: GenerateOptions
    ) -> AsyncIterator[AgentEvent]:
        """A generation run by the caller's task (a subagent's, in its parent's tool call), its
        events committed to the log as chunks as `start`'s are, so that anyone may follow it; it
        stops when the caller does. What ends it is raised after its stream is ended in the log."""
        run_id = options.run_id or f"run_{uuid.uuid4().hex}"
        logged = False
        try:
            async for event in self._logged(session_id, messages, replace(options, run_id=run_id)):
                logged = True
                yield event
        except BaseException as exc:
            if logged:
                await self._end(session_id, run_id, exc)
            raise

    async def _logged(
        self, session_id: str, messages: list[Message], options: GenerateOptions
    ) -> AsyncIterator[AgentEvent]:
        """The run's events, each once it is committed to the log as a chunk."""
        carried: dict[int, AgentEvent] = {}  # logged with the write they report (kept: ids stay unique)

        def log_chunk(event: AgentEvent) -> LogEntry:
            carried[id(event)] = event
            return chunk_entry(session_id, options.run_id, event)

        async for event in self._agent.run(session_id, messages, options, log_chunk):
            # Committed in order with the run's events (a refused one stops the run: runtime
            # on_fenced); followers see it once it is.
            if carried.pop(id(event), None) is not event:
                self._bus.submit(chunk_entry(session_id, options.run_id, event))
            yield event

    async def _end(self, session_id: str, run_id: str, exc: BaseException) -> None:
        """End the stream of a run that logged events and then stopped with `exc`."""
        if isinstance(exc, LeaseLost):  # the replica that took the run over ended its stream
            log.warning("the generation of session %s stopped: %s", session_id, exc)
            return
        error = (
            exc if isinstance(exc, AgentError) else Unavailable("the server stopped while the generation ran")
        )
        if not isinstance(exc, (AgentError, asyncio.CancelledError)):
            log.exception("generation of session %s failed", session_id)
            error = Internal(f"the generation failed: {exc}")
        await self._bus.append(failure_entry(session_id, run_id, error))

    async def _execute(
        self,
        session_id: str,
        messages: list[Message],
        options: GenerateOptions,
        started: asyncio.Future[None],
    ) -> None:
        logged = False
        try:
            async for _ in self._logged(session_id, messages, options):
                if not logged:
                    logged = True
                    started.set_result(None)
        except BaseException as exc:
            if not logged:
                if not started.done():
                    if isinstance(exc, Exception):
                        started.set_exception(exc)
                    else:
                        started.cancel()
                if not isinstance(exc, Exception):
                    raise
                return
            await self._end(session_id, options.run_id, exc)
            if not isinstance(exc, Exception):
                raise

    async def stop(self) -> None:
        """Cancel every run (at shutdown, after the grace): each ends its stream for resumers."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def running(self) -> int:
        """Runs going on now (their callers may have gone)."""
        return len(self._tasks)


async def _ended() -> AsyncIterator[Chunk]:
    return
    yield


async def _follow(subscription: Subscription) -> AsyncIterator[Chunk]:
    try:
        async for entry in subscription:
            event = entry_chunk(entry)  # raises the run's error for its last entry
            yield event, entry.seq
            if isinstance(event, DoneEvent):
                return
    finally:
        subscription.close()
