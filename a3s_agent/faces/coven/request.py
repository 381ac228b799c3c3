"""One SendMessage: our agent run on the thread's session, streamed back as MessageResponses that
end with exactly one done, error or cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

from ...app import Application
from ...app.types import DoneEvent, GenerateOptions, TextEvent, ToolCallEvent, ToolResultEvent, TurnEvent
from ...base.errors import AgentError, Cancelled, InvalidArgument, NotFound
from ...base.models import Attachment, Message, Usage
from ...proto import coven_pb2 as pb
from .threads import Threads, session_id_for
from .tools import WATCHED_EVENTS, ToolStates

log = logging.getLogger(__name__)

THINKING = "thinking"

# Queues one message for the gateway; never blocks.
Send = Callable[[pb.AgentMessage], None]


def response(request_id: str, **event: Any) -> pb.AgentMessage:
    return pb.AgentMessage(response=pb.MessageResponse(request_id=request_id, **event))


def user_message(request: pb.SendMessage) -> Message:
    attachments = [
        Attachment(
            kind="image" if item.mime_type.startswith("image/") else "file",
            name=item.filename,
            mime_type=item.mime_type,
            content=item.data,
        )
        for item in request.attachments
    ]
    metadata = {"coven_request_id": request.request_id, "coven_sender": request.sender}
    return Message(role="user", content=request.content, attachments=attachments, metadata=metadata)


def injected_message(inject: pb.InjectContext) -> Message:
    source = inject.source if inject.HasField("source") else "gateway"
    return Message(
        role="user",
        content=f"[context from {source}]\n{inject.content}",
        metadata={"coven_injection_id": inject.injection_id, "coven_source": source},
    )


class RequestRun:
    def __init__(self, app: Application, request: pb.SendMessage, threads: Threads, send: Send) -> None:
        self.request = request
        self._app = app
        self._threads = threads
        self._send = send
        self._session_id = session_id_for(request.thread_id) if request.thread_id else ""
        self._tools = ToolStates(app.control, self._session_id, self._respond)
        self._task: asyncio.Task[Any] | None = None
        self._cancel_reason: str | None = None
        self._ended = False  # the terminal response was sent
        self._text: list[str] = []
        self._usage = Usage()
        # InjectContext content: IMMEDIATE is stored at the next turn boundary, the rest after the run.
        self._immediate: list[Message] = []
        self._later: list[Message] = []

    def _respond(self, **event: Any) -> None:
        self._send(response(self.request.request_id, **event))

    # --- driven by the gateway while the run goes on ---------------------------------------

    def cancel(self, reason: str) -> None:
        """CancelRequest: stop the run, or the request itself when its run is not going."""
        if self._ended or self._cancel_reason is not None or self._task is None:
            return
        self._cancel_reason = reason
        if not self._app.control.cancel_own(self._session_id, self._task):  # the run raises Cancelled
            self._task.cancel()

    def approve(self, answer: pb.ToolApprovalResponse) -> bool:
        return self._tools.approve(answer)

    def inject(self, message: Message, *, immediate: bool) -> None:
        """IMMEDIATE goes to the running generation's next model call when one runs."""
        task = self._task
        if immediate and task is not None and self._app.control.inject_own(self._session_id, task, [message]):
            return
        (self._immediate if immediate else self._later).append(message)

    # --- the run ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Answer the request; only the connection going away (a bare cancel) ends it without
        a terminal response."""
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._respond(thinking=THINKING)
        try:
            await self._generate()
        except asyncio.CancelledError:
            if self._cancel_reason is None:
                raise
            task.uncancel()
            self._end(cancelled=pb.Cancelled(reason=self._cancel_reason))
        except Cancelled:
            self._end(cancelled=pb.Cancelled(reason=self._cancel_reason or "cancelled"))
        except AgentError as exc:
            self._end(error=str(exc))
        except Exception as exc:
            log.exception("coven request %s failed", self.request.request_id)
            self._end(error=f"internal error: {type(exc).__name__}: {exc}")

    async def flush(self) -> None:
        """Store what was injected for after the run (looping: more may arrive meanwhile)."""
        while self._immediate or self._later:
            batch = [*self._immediate, *self._later]
            self._immediate.clear()
            self._later.clear()
            await self._store(batch)

    async def _generate(self) -> None:
        if not self.request.thread_id:
            raise InvalidArgument("send_message.thread_id is required")
        await self._threads.session_for(self.request.thread_id)
        subscription = await self._app.events.subscription(self._session_id, WATCHED_EVENTS)
        follower = asyncio.create_task(self._tools.follow(subscription))
        run = self._app.generation.stream(self._session_id, [user_message(self.request)], GenerateOptions())
        try:
            async with aclosing(run) as events:
                async for event in events:
                    await self._on(event)
        finally:
            follower.cancel()
            subscription.close()
        self._end(done=pb.Done(full_response="".join(self._text)))

    async def _on(self, event: object) -> None:
        if isinstance(event, TextEvent):
            self._text.append(event.text)
            self._respond(text=event.text)
        elif isinstance(event, ToolCallEvent):
            self._tools.used(event.call)
        elif isinstance(event, ToolResultEvent):
            self._tools.finished(event.call, event.result)
            if self._tools.all_answered:
                # A turn boundary: the history is whole again, and the model is called next.
                if self._immediate:
                    immediate = self._immediate[:]
                    self._immediate.clear()
                    await asyncio.shield(self._store(immediate))
                self._respond(thinking=THINKING)
        elif isinstance(event, TurnEvent):
            self._usage += event.usage
        elif isinstance(event, DoneEvent) and event.generation.budget_spent is not None:
            # The run stopped before a model call: say why, as the last text of the answer.
            note = event.generation.budget_spent.message
            self._text.append(("\n\n" if self._text else "") + note)
            self._respond(text=self._text[-1])

    async def _store(self, messages: list[Message]) -> None:
        if not messages:
            return
        try:
            await self._app.sessions.append(self._session_id, messages)
        except (NotFound, InvalidArgument):
            log.warning(
                "dropped %d injected messages: thread session %r is gone", len(messages), self._session_id
            )

    def _end(self, **terminal: Any) -> None:
        self._ended = True
        if "done" not in terminal:
            self._tools.abandon(self._cancel_reason or "the request ended early")
        if self._usage.total_tokens:
            self._respond(
                usage=pb.TokenUsage(
                    input_tokens=self._usage.prompt_tokens,
                    output_tokens=self._usage.completion_tokens,
                    cache_read_tokens=self._usage.cache_read_tokens,
                    cache_write_tokens=self._usage.cache_write_tokens,
                    thinking_tokens=self._usage.reasoning_tokens,
                )
            )
        self._respond(**terminal)
