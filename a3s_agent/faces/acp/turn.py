"""One `session/prompt`: the agent run on the session, its events sent as session updates, answered
with the stop reason. Nothing here waits on the editor while the run goes on (updates are queued,
permission requests run in tasks), so a `session/cancel` always stops the run where it waits."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import aclosing
from pathlib import Path

from acp.schema import AgentMessageChunk, AgentThoughtChunk, StopReason, UsageUpdate

from ...app import Application
from ...app.types import (
    AgentEvent,
    DoneEvent,
    GenerateOptions,
    NoticeEvent,
    TextEvent,
    ThinkingEvent,
    Tool,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from ...base.errors import Cancelled
from ...base.models import Message
from .content import text_block
from .outbox import Outbox, SessionUpdate
from .permissions import Asker
from .tool_calls import WATCHED_EVENTS, ToolCalls

# How a generation's finish_reason ends the turn; "tool_calls" is the max_tool_calls limit.
STOP_REASONS: Mapping[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "content_filter": "refusal",
    "tool_calls": "max_turn_requests",
}


class Turn:
    def __init__(
        self, app: Application, outbox: Outbox, asker: Asker, session_id: str, workspace: Path
    ) -> None:
        self._app = app
        self._outbox = outbox
        self._session_id = session_id
        tools: dict[str, Tool] = {t.name: t for t in app.tools.available(session_id)}
        self.calls = ToolCalls(session_id, workspace, tools, self._send, asker)
        self.task: asyncio.Task[object] | None = None
        self.cancel_requested = False
        self._window = app.context.window(session_id)
        self._text: list[str] = []  # of the model turn going on
        self._last_text = ""  # of the last finished model turn
        self._stop: StopReason = "end_turn"

    def cancel(self) -> None:
        """session/cancel: stop the run (or, before it started, this turn's task)."""
        self.cancel_requested = True
        if self.task is None or self.task.done():
            return
        if not self._app.control.cancel_own(self._session_id, self.task):
            self.task.cancel()

    async def run(self, message: Message) -> StopReason:
        if self.cancel_requested:  # before the run started
            return "cancelled"
        self.task = asyncio.current_task()
        subscription = await self._app.events.subscription(self._session_id, WATCHED_EVENTS)
        follower = asyncio.create_task(self.calls.follow(subscription))
        reason = "the turn ended"
        try:
            events = self._app.generation.stream(self._session_id, [message], GenerateOptions())
            async with aclosing(events) as run:
                async for event in run:
                    self._on(event)
        except Cancelled:
            self._stop, reason = "cancelled", "cancelled"
        except asyncio.CancelledError:
            if not self.cancel_requested or self.task is None:
                raise
            self.task.uncancel()
            self._stop, reason = "cancelled", "cancelled"
        finally:
            follower.cancel()
            subscription.close()
            self.calls.close(reason)
        return "cancelled" if self.cancel_requested else self._stop

    def _send(self, update: SessionUpdate) -> None:
        self._outbox.send(self._session_id, update)

    def _on(self, event: AgentEvent) -> None:
        if isinstance(event, TextEvent):
            self._text.append(event.text)
            self._send(
                AgentMessageChunk(session_update="agent_message_chunk", content=text_block(event.text))
            )
        elif isinstance(event, ThinkingEvent):
            self._send(
                AgentThoughtChunk(session_update="agent_thought_chunk", content=text_block(event.text))
            )
        elif isinstance(event, ToolCallEvent):
            self.calls.requested(event.call)
        elif isinstance(event, ToolResultEvent):
            self.calls.finished(event.call, event.result)
        elif isinstance(event, TurnEvent):
            self._last_text, self._text = "".join(self._text), []
            used = event.usage.prompt_tokens + event.usage.completion_tokens
            if used:
                self._send(
                    UsageUpdate(session_update="usage_update", used=used, size=max(self._window, used))
                )
        elif isinstance(event, NoticeEvent):
            if event.data.get("type") == "confirmation_required":
                self.calls.confirmation_required(event.data)
            elif event.data.get("type", "").startswith("subagent_"):
                self.calls.subagent(event.data)
        elif isinstance(event, DoneEvent):
            generation = event.generation
            # A run a limit stopped says so after the last turn's text, which alone was streamed.
            final = generation.message.content.strip()
            note = (
                final.removeprefix(self._last_text.strip()).strip()
                if generation.finish_reason != "stop"
                else ""
            )
            if note:
                self._send(
                    AgentMessageChunk(session_update="agent_message_chunk", content=text_block(f"\n\n{note}"))
                )
            self._stop = STOP_REASONS.get(generation.finish_reason, "end_turn")
