"""A task's turns as the SDK runs them: the first message starts a generation of the context's
session, a question the run waits on ends the turn in input-required, and the next message to the
task answers it and follows the run on from the last chunk the task had. A turn without a message
(a resubscription to a working task no turn here follows: its server stopped, or it runs on
another replica; http.py) follows the run on from the last chunk the stored task shows.

What the task needs between turns (the run's id, the last chunk's seq, the session's last seq
before the run, the question waiting) is in its metadata under `a3s`, which the task store keeps
(tasks.py); the response artifact's metadata names the seq of the last chunk it holds."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types.a2a_pb2 import Part, Role, Task, TaskState
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from ...app import Application
from ...app.asking import Question
from ...app.types import DoneEvent, TextEvent
from ...base.errors import AgentError, Cancelled, InvalidArgument

STATE = "a3s"
"""The task's metadata key of what a3s-agent keeps of it between turns."""
RESPONSE = "response"
CHANGES = "changes"


class Executor(AgentExecutor):
    def __init__(self, app: Application) -> None:
        self._app = app
        self.turning: set[str] = set()
        """The tasks a turn runs for in this process now."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        self.turning.add(task_id)
        try:
            if context.message is None:
                await self._follow_on(context, event_queue)
            else:
                await self._execute(context, event_queue)
        finally:
            self.turning.discard(task_id)

    async def _follow_on(self, context: RequestContext, event_queue: EventQueue) -> None:
        """The turn of a resubscription: follow the run on from what the stored task holds."""
        task = context.current_task
        if task is None or task.status.state != TaskState.TASK_STATE_WORKING:
            return  # another turn ended it meanwhile
        kept = _kept(task)
        response = next((a for a in task.artifacts if a.artifact_id == RESPONSE), None)
        if response is not None and "seq" in response.metadata:
            kept["cursor"] = max(int(kept.get("cursor", 0)), int(response.metadata["seq"]))
        session_id = task.context_id
        updater = TaskUpdater(event_queue, task.id, session_id)
        # First, the task this turn goes on from: the resubscriber is shown it (http.py).
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, metadata={STATE: {**kept, "question": None}}
        )
        items = self._app.asking.follow(session_id, str(kept.get("run", "")), int(kept.get("cursor", 0)))
        await self._turn(session_id, updater, items, kept, response is not None)

    async def _execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, session_id = context.task_id or "", context.context_id or ""
        if context.message is None or context.message.role != Role.ROLE_USER:
            raise InvalidParamsError(
                message="message.role: must be ROLE_USER (the client speaks as the user)"
            )
        reply = context.get_user_input()
        if not reply.strip():
            raise InvalidParamsError(message="message.parts: no text to act on")
        task = context.current_task
        kept = _kept(task)
        updater = TaskUpdater(event_queue, task_id, session_id)
        question = kept.get("question")
        if task is not None and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED and question:
            try:
                items = await self._app.asking.answer(
                    session_id, Question(**question), reply, str(kept["run"]), int(kept["cursor"])
                )
            except AgentError as exc:  # the session is gone
                await updater.failed(updater.new_agent_message([Part(text=str(exc))]))
                return
        else:
            try:
                await self._app.asking.open_session(session_id)
            except InvalidArgument as exc:
                raise InvalidParamsError(message=str(exc)) from None
            if task is None:
                await event_queue.enqueue_event(new_task_from_user_message(context.message))
            started = await self._app.asking.start(session_id, reply)
            items = started.items
            kept = {"run": started.run_id, "cursor": started.after, "start": started.after}
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, metadata={STATE: {**kept, "question": None}}
        )
        answered = any(a.artifact_id == RESPONSE for a in task.artifacts) if task is not None else False
        await self._turn(session_id, updater, items, kept, answered)

    async def _turn(
        self,
        session_id: str,
        updater: TaskUpdater,
        items: AsyncGenerator[Any, None],
        kept: dict[str, Any],
        answered: bool,
    ) -> None:
        final = ""
        try:
            async with aclosing(items):  # stopping at a question ends the following at once
                async for item in items:
                    if isinstance(item, Question):
                        ask = updater.new_agent_message(
                            [Part(text=item.text)], metadata={"question": item.kind}
                        )
                        question = {"kind": item.kind, "id": item.id, "text": item.text}
                        await updater.update_status(
                            TaskState.TASK_STATE_INPUT_REQUIRED,
                            ask,
                            metadata={STATE: {**kept, "question": question}},
                        )
                        return
                    event, seq = item
                    kept["cursor"] = seq
                    if isinstance(event, TextEvent) and event.text:
                        await updater.add_artifact(
                            [Part(text=event.text)],
                            RESPONSE,
                            RESPONSE,
                            metadata={"seq": seq},
                            append=answered,
                        )
                        answered = True
                    elif isinstance(event, DoneEvent):
                        final = event.generation.message.content
        except Cancelled:
            await updater.cancel()
            return
        except Exception as exc:  # the run failed: the task does, saying why
            text = str(exc) or type(exc).__name__
            await updater.failed(updater.new_agent_message([Part(text=text)]))
            return
        await self._changes(session_id, updater, kept)
        done = updater.new_agent_message([Part(text=final)])
        await updater.update_status(
            TaskState.TASK_STATE_COMPLETED, done, metadata={STATE: {**kept, "question": None}}
        )

    async def _changes(self, session_id: str, updater: TaskUpdater, kept: dict[str, Any]) -> None:
        """The files the run changed, as an artifact: their names and the patch."""
        changes = await self._app.asking.changes(session_id, int(kept.get("start", 0)))
        if changes is None or not changes.files:
            return
        patch = Part(text=changes.patch, media_type="text/x-diff", filename="changes.patch")
        await updater.add_artifact([patch], CHANGES, CHANGES, metadata={"files": changes.files})

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Stop the session's run (it goes on without the task's turn otherwise) and say so."""
        session_id = context.context_id or ""
        await self._app.control.cancel(session_id, None)
        await TaskUpdater(event_queue, context.task_id or "", session_id).cancel()


def _kept(task: Task | None) -> dict[str, Any]:
    if task is None or STATE not in task.metadata:
        return {}
    kept = MessageToDict(task.metadata)[STATE]
    return kept if isinstance(kept, dict) else {}
