"""A generation followed together with the questions it waits on, for faces whose client answers a
tool confirmation or an `ask_user` question with its next message (A2A's input-required), and the
files a run changed (from the session's checkpoints).

The run outlives its follower (runtime/runs.py): a follower that stops at a question leaves the
run waiting (for as long as the session's confirmation or external-task timeout allows), and the
next one answers it and follows on from the seq where the first stopped, so nothing of the run is
missed or seen twice. A follower that was lost (its server stopped, its client went away) is
replaced the same way, on any replica, by the run's id and the last seq it had. The questions are
read from the session's log from that same seq, and one no longer waiting (answered meanwhile,
timed out) is skipped."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Literal

from ..base.errors import InvalidArgument, NotFound
from ..base.models import Message, SessionConfig
from ..core.loop.agent import DoneEvent, GenerateOptions
from ..core.sessions.manager import SESSION_ID_PATTERN
from ..core.store.events import EVENT, EventType, Filter, entry_event
from ..runtime import Runtime
from ..runtime.runs import Chunk
from ..tools.shadow_repo import ShadowUnavailable
from .control import Control
from .generation import Generation

ASKED = frozenset({EventType.CONFIRMATION_REQUIRED, EventType.EXTERNAL_TASK_PENDING})
ASK_USER = "ask_user"
YES = frozenset({"y", "yes", "ok", "allow", "approve", "approved"})
"""A reply that approves a confirmation (any other rejects it, the reply as the reason)."""


@dataclass(frozen=True)
class Question:
    """What the run waits on: a tool call to confirm (`id` the call's) or an `ask_user` question
    (`id` the external task's)."""

    kind: Literal["confirmation", "ask_user"]
    id: str
    text: str


@dataclass(frozen=True)
class Changes:
    files: list[str]
    patch: str


@dataclass(frozen=True)
class Started:
    after: int
    """The session's last seq before the run: where following it begins, and `changes`' base."""
    run_id: str
    items: AsyncGenerator[Chunk | Question, None]


class Asking:
    def __init__(self, runtime: Runtime, generation: Generation, control: Control) -> None:
        self._rt = runtime
        self._generation = generation
        self._control = control

    async def open_session(self, session_id: str) -> None:
        """The session `session_id`, created (with the server's defaults) when it does not exist."""
        if not SESSION_ID_PATTERN.fullmatch(session_id):
            raise InvalidArgument(
                f"context id: {session_id[:80]!r} is not a session id ([A-Za-z0-9._:-]{{1,128}})"
            )
        await self._rt.sessions.refresh(session_id)
        try:
            self._rt.sessions.get(session_id)
        except NotFound:
            await self._rt.sessions.create(session_id, SessionConfig(), [])

    async def start(self, session_id: str, prompt: str) -> Started:
        """A new generation of `prompt`: its chunks and the questions it asks, until it ends (with a
        DoneEvent, or what the run raised) or the caller stops at a question."""
        _, after = await self._rt.store.log_bounds(session_id)
        run_id = f"run_{uuid.uuid4().hex}"
        prompt_message = Message(role="user", content=prompt)
        return Started(after, run_id, self._follow(session_id, run_id, after, [prompt_message]))

    def follow(self, session_id: str, run_id: str, after_seq: int) -> AsyncGenerator[Chunk | Question, None]:
        """The run `run_id` followed on from `after_seq` (the last seq the caller had), as `start`'s."""
        return self._follow(session_id, run_id, after_seq, None)

    async def answer(
        self, session_id: str, question: Question, reply: str, run_id: str, after_seq: int
    ) -> AsyncGenerator[Chunk | Question, None]:
        """Answer `question` with `reply` and follow the run on from `after_seq` (the last seq the
        caller had). A question no longer waiting (its timeout's action was taken, or the run was
        stopped) takes no answer: the run is followed on as it went."""
        try:
            if question.kind == "confirmation":
                approved = reply.strip().lower().rstrip(".!") in YES
                await self._control.confirm(session_id, question.id, approved, "" if approved else reply)
            else:
                await self._control.complete_external(session_id, question.id, True, reply, "")
        except NotFound:
            await self._rt.sessions.refresh(session_id)
            self._rt.sessions.get(session_id)  # NotFound still: the session is gone
        return self.follow(session_id, run_id, after_seq)

    async def _follow(
        self, session_id: str, run_id: str, after: int, messages: list[Message] | None
    ) -> AsyncGenerator[Chunk | Question, None]:
        subscription = await self._rt.events.subscribe(Filter(session_id, EVENT, ASKED), after_seq=after)
        queue: asyncio.Queue[Chunk | Question | BaseException | None] = asyncio.Queue()

        async def run() -> None:
            try:
                if messages is None:
                    chunks = await self._generation.follow_run(session_id, run_id, after)
                else:
                    chunks = await self._generation.follow(
                        session_id, messages, GenerateOptions(run_id=run_id)
                    )
                async for chunk in chunks:
                    queue.put_nowait(chunk)
            except Exception as exc:
                queue.put_nowait(exc)
            queue.put_nowait(None)

        async def watch() -> None:
            async for entry in subscription:
                question = self._question(session_id, entry_event(entry).data)
                if question is not None:
                    queue.put_nowait(question)

        tasks = [asyncio.create_task(run()), asyncio.create_task(watch())]
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
                if not isinstance(item, Question) and isinstance(item[0], DoneEvent):
                    return
        finally:
            subscription.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _question(self, session_id: str, data: dict[str, str]) -> Question | None:
        """The question an event asks, if it still waits here (answered or timed out: None)."""
        try:
            waiting = self._rt.control.of(session_id)
        except NotFound:
            return None
        if "tool_id" in data:
            confirmation = waiting.confirmations.get(data["tool_id"])
            if confirmation is None or confirmation.done():
                return None
            text = f"May I run {data.get('tool_name', 'a tool')} with {data.get('arguments', '{}')}? (yes/no)"
            return Question("confirmation", data["tool_id"], text)
        external = waiting.external.get(data.get("task_id", ""))
        if data.get("command_type") != ASK_USER or external is None or external.future.done():
            return None
        try:
            asked = json.loads(data.get("payload", "{}"))
        except json.JSONDecodeError:
            asked = {}
        text = str(asked.get("question", "")) if isinstance(asked, dict) else ""
        options = asked.get("options") if isinstance(asked, dict) else None
        if isinstance(options, list) and options:
            text += " (" + " / ".join(str(o) for o in options) + ")"
        return Question("ask_user", data["task_id"], text)

    # --- the files a run changed ---------------------------------------------------------------

    async def changes(self, session_id: str, after_seq: int) -> Changes | None:
        """What the session's last generation changed: the files and the patch from the first
        checkpoint of a generation taken after `after_seq` (the one before the run started) to the
        tree the run left; None without one (checkpoints are off, or the workspace could not be
        read)."""
        checkpoints = self._rt.checkpoints
        first = next(
            (c for c in await checkpoints.of_session(session_id) if c.seq > after_seq and c.kind == "turn"),
            None,
        )
        if first is None:
            return None
        try:
            diff = await checkpoints.run_changes(session_id, first.seq)
        except ShadowUnavailable:
            return None
        if diff is None:
            return None
        return Changes([change.path for change in diff.changes], diff.patch)
