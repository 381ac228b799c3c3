"""Session updates leave in the order they are made, and the maker never waits for the pipe: the
agent loop's task only queues them, so a cancel always lands inside the loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from acp.interfaces import Client
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    SessionInfoUpdate,
    ToolCallProgress,
    ToolCallStart,
    UsageUpdate,
    UserMessageChunk,
)

log = logging.getLogger(__name__)

SessionUpdate = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCallStart
    | ToolCallProgress
    | AgentPlanUpdate
    | SessionInfoUpdate
    | UsageUpdate
)


class Outbox:
    """`session/update` notifications for one connection, written one after another."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._queue: asyncio.Queue[tuple[str, SessionUpdate] | asyncio.Future[None]] = asyncio.Queue()
        self._gone = False
        self._task = asyncio.create_task(self._write(), name="acp-outbox")

    def send(self, session_id: str, update: SessionUpdate) -> None:
        self._queue.put_nowait((session_id, update))

    async def drain(self) -> None:
        """Wait until everything sent before this call is written (or dropped: the editor is gone)."""
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(written)
        await written

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, asyncio.Future) and not item.done():
                item.set_result(None)

    async def _write(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, asyncio.Future):
                if not item.done():
                    item.set_result(None)
                continue
            if self._gone:
                continue
            session_id, update = item
            try:
                await self._client.session_update(session_id=session_id, update=update)
            except (ConnectionError, OSError) as exc:
                log.warning("the editor's pipe is closed; session updates are dropped: %s", exc)
                self._gone = True
            except Exception:  # one update that cannot be sent must not stop the others
                log.exception("a session update for %s could not be sent", session_id)
