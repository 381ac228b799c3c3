"""ACP v2 (schema 2.0.0-alpha.5), for a client that asks for protocol 2 or later at `initialize`
(v2_wire.py is its connection). What differs from v1 (agent.py): `session/prompt` answers at once
with the inserted message's id, and the session's foreground work is reported by `state_update`
(`running`, `requires_action` while a permission waits, `idle` with the stop reason); a prompt sent
while a generation of the session runs (this connection's turn, or one another face or replica
started) steers it (app/control.py `steer`: taken in at its next safe point), or, when it is
already giving its last answer, runs next. `session/cancel` stops the turn and
drops what was queued; the `idle` update confirms it. A turn's run is logged as every face's
runs are, its updates carrying their seq; `session/resume` replays the history with
`replayFrom: {"type": "start"}`, or the log from a seq on with ours (REPLAY_SEQ), and always ends
with the current state.

Messages are checked by our own pydantic models of the few requests served (the Python SDK has
none for v2); prompt content blocks are v1's, unchanged in v2."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ... import NAME, __version__
from ...app import Application
from ...app.events import MAX_PAGE
from ...app.types import (
    STEER_APPLIED,
    DoneEvent,
    GenerateOptions,
    LogEntry,
    NoticeEvent,
    TextEvent,
    ThinkingEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
    entry_chunk,
)
from ...base.errors import AgentError, Cancelled, FailedPrecondition, NotFound
from ...base.models import Message, SessionConfig
from ..agent_service import check_message_size
from .agent import same_directory, session_page
from .content import PromptBlock, user_message
from .permissions import ALLOW_ONCE, CONFIRMATION_TIMEOUT_MS, REJECT, editor_confirmation, editor_policy
from .turn import STOP_REASONS
from .v2_wire import INVALID_PARAMS, Connection, RpcError, domain_error

log = logging.getLogger(__name__)

PROTOCOL_V2 = 2
SEQ_META = "a3s/seq"
"""Where an update of a run carries the seq of the log entry it shows."""
REPLAY_SEQ = "_a3s_seq"
"""Our replay cursor: `{"type": "_a3s_seq", "seq": N}`, from the log entry N on (inclusive)."""


class _Params(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class InitializeParams(_Params):
    protocol_version: int = Field(alias="protocolVersion", ge=0, le=65535)


class NewSessionParams(_Params):
    cwd: str


class SessionParams(_Params):
    session_id: str = Field(alias="sessionId", min_length=1)


class PromptParams(SessionParams):
    prompt: list[PromptBlock] = Field(min_length=1)


class ListParams(_Params):
    cwd: str | None = None
    cursor: str | None = None


class ResumeParams(SessionParams):
    cwd: str
    replay_from: dict[str, Any] | None = Field(default=None, alias="replayFrom")


def wants_v2(message: dict[str, Any]) -> bool:
    """Whether the client's first message is an `initialize` asking for protocol 2 or later."""
    params = message.get("params")
    version = params.get("protocolVersion") if isinstance(params, dict) else None
    return message.get("method") == "initialize" and isinstance(version, int) and version >= PROTOCOL_V2


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


class Foreground:
    """One session's foreground work: the turn running, and the prompts queued behind it."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.queued: deque[tuple[str, Message]] = deque()
        self.stop_reason = ""

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


class V2Agent:
    def __init__(self, app: Application) -> None:
        self._app = app
        self._foreground: dict[str, Foreground] = {}
        self._asking: set[asyncio.Task[None]] = set()  # permission requests waiting for the client
        self.connection: Connection | None = None

    def handlers(self) -> dict[str, Any]:
        return {
            "initialize": self.initialize,
            "session/new": self.new_session,
            "session/prompt": self.prompt,
            "session/cancel": self.cancel,
            "session/resume": self.resume,
            "session/close": self.close_session,
            "session/list": self.list_sessions,
        }

    async def close(self) -> None:
        for foreground in self._foreground.values():
            foreground.queued.clear()
            if foreground.task is not None:
                foreground.task.cancel()

    async def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        InitializeParams.model_validate(params)
        prompt: dict[str, dict[str, Any]] = {"image": {}, "embeddedContext": {}}
        return {
            "protocolVersion": PROTOCOL_V2,
            "info": {"name": NAME, "title": NAME, "version": __version__},
            "capabilities": {"session": {"prompt": prompt}},
            "authMethods": [],
        }

    async def new_session(self, params: dict[str, Any]) -> dict[str, Any]:
        given = NewSessionParams.model_validate(params)
        view = await self._app.sessions.create(None, SessionConfig(workspace=given.cwd), [], {})
        session_id = view.session.id
        await self._app.permissions.set(session_id, editor_policy(self._app.tools.available(session_id)))
        await self._app.control.set_confirmation_policy(session_id, editor_confirmation())
        return {"sessionId": session_id}

    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        given = PromptParams.model_validate(params)
        session_id = given.session_id
        message = user_message(given.prompt)
        check_message_size([message], "prompt")
        await self._app.sessions.get(session_id)  # NotFound for another connection's made-up id
        foreground = self._foreground.setdefault(session_id, Foreground())
        if not message.attachments and not foreground.queued:
            # Steers the session's running generation, this connection's turn or one another face or
            # replica started; none, or one giving its last answer: the prompt is a turn of its own.
            with contextlib.suppress(FailedPrecondition):
                return {"messageId": await self._app.control.steer(session_id, message.content)}
        message_id = f"msg_{uuid.uuid4().hex[:20]}"
        foreground.queued.append((message_id, message))
        if not foreground.running:
            foreground.task = asyncio.create_task(self._work(session_id, foreground))
        return {"messageId": message_id}

    async def cancel(self, params: dict[str, Any]) -> None:
        session_id = SessionParams.model_validate(params).session_id
        foreground = self._foreground.get(session_id)
        if foreground is None or not foreground.running:
            return
        foreground.queued.clear()
        assert foreground.task is not None
        if not await self._app.control.cancel(session_id, None):  # not started yet
            foreground.task.cancel()

    async def resume(self, params: dict[str, Any]) -> dict[str, Any]:
        given = ResumeParams.model_validate(params)
        session = (await self._app.sessions.get(given.session_id)).session
        if not same_directory(given.cwd, Path(session.config.workspace)):
            raise RpcError(
                INVALID_PARAMS, f"cwd: session {given.session_id!r} works in {session.config.workspace}"
            )
        cursor = given.replay_from
        if cursor is not None and cursor.get("type") == "start":
            for update in _replayed(await self._app.sessions.history(given.session_id)):
                await self._update(given.session_id, update)
        elif cursor is not None and cursor.get("type") == REPLAY_SEQ:
            await self._replay_log(given.session_id, _seq_cursor(cursor))
        elif cursor is not None:
            raise RpcError(
                INVALID_PARAMS, f'replayFrom: {{"type": "start"}} or {{"type": "{REPLAY_SEQ}", "seq": N}}'
            )
        foreground = self._foreground.setdefault(given.session_id, Foreground())
        state: dict[str, Any] = {"sessionUpdate": "state_update", "state": "idle"}
        if foreground.running:
            state["state"] = "running"
        elif foreground.stop_reason:
            state["stopReason"] = foreground.stop_reason
        await self._update(given.session_id, state)
        return {}

    async def list_sessions(self, params: dict[str, Any]) -> dict[str, Any]:
        """v1's listing: its SessionInfo and cursor are the same in v2."""
        given = ListParams.model_validate(params)
        listed = await session_page(self._app, given.cwd, given.cursor)
        return listed.model_dump(by_alias=True, exclude_none=True)

    async def _replay_log(self, session_id: str, first: int) -> None:
        """The runs' updates the session's log holds from seq `first` on, each with its seq."""
        after, turn = first - 1, _TurnIds()
        while True:
            entries, last = await self._app.events.page(session_id, after, MAX_PAGE)
            for entry in entries:
                if isinstance(entry, LogEntry):
                    with contextlib.suppress(AgentError):  # the entry that ended a run that failed
                        await self._on(session_id, entry_chunk(entry), turn, entry.seq, live=False)
            if not entries or entries[-1].seq >= last:
                return
            after = entries[-1].seq

    async def close_session(self, params: dict[str, Any]) -> dict[str, Any]:
        session_id = SessionParams.model_validate(params).session_id
        foreground = self._foreground.pop(session_id, None)
        if foreground is not None and foreground.task is not None:
            foreground.queued.clear()
            foreground.task.cancel()
        with contextlib.suppress(NotFound):
            await self._app.control.cancel(session_id, None)
            await self._app.sessions.release(session_id)
        return {}

    # --- the foreground work ----------------------------------------------------------------

    async def _work(self, session_id: str, foreground: Foreground) -> None:
        """Run the queued prompts one turn after another, `running` to `idle`."""
        await self._update(session_id, {"sessionUpdate": "state_update", "state": "running"})
        stop = "end_turn"
        idle: dict[str, Any] = {"sessionUpdate": "state_update", "state": "idle"}
        try:
            while foreground.queued and stop != "cancelled":
                message_id, message = foreground.queued.popleft()
                await self._update(session_id, _user_message(message_id, message.content))
                stop = await self._turn(session_id, message)
        except AgentError as exc:  # the run failed (the model's provider, a limit): idle, saying why
            log.warning("ACP v2 turn of %s failed: %s", session_id, exc)
            stop, idle["error"] = "error", domain_error(exc)
        finally:
            foreground.queued.clear()
            foreground.stop_reason = stop
            await asyncio.shield(self._update(session_id, {**idle, "stopReason": stop}))

    async def _turn(self, session_id: str, message: Message) -> str:
        """One prompt's run, as every face's runs: logged chunk by chunk with its seq (each update
        carries it in `_meta`, the position `replayFrom` takes)."""
        turn = _TurnIds()
        try:
            async for event, seq in self._app.generation.chunks(session_id, [message], GenerateOptions()):
                if isinstance(event, DoneEvent):
                    return STOP_REASONS.get(event.generation.finish_reason, "end_turn")
                await self._on(session_id, event, turn, seq)
        except (Cancelled, asyncio.CancelledError):
            return "cancelled"
        return "end_turn"

    async def _on(self, session_id: str, event: object, turn: _TurnIds, seq: int, live: bool = True) -> None:
        """The update that shows `event` (logged at `seq`); `live`: of the turn going on (not a
        replay), whose permission requests are asked."""
        if isinstance(event, TextEvent):
            update = {
                "sessionUpdate": "agent_message_chunk",
                "messageId": turn.agent,
                "content": _text(event.text),
            }
        elif isinstance(event, ThinkingEvent):
            update = {
                "sessionUpdate": "agent_thought_chunk",
                "messageId": turn.thought,
                "content": _text(event.text),
            }
        elif isinstance(event, ToolCallEvent):
            call = event.call
            update = _tool_update(call.id, name=call.name, title=call.name, status="pending")
        elif isinstance(event, ToolResultEvent):
            update = _tool_update(event.call.id, status="completed" if event.result.success else "failed")
        elif isinstance(event, TurnEvent):
            turn.next()
            return
        elif isinstance(event, NoticeEvent) and event.data.get("type") == STEER_APPLIED:
            update = _user_message(event.data["steer_id"], event.data.get("content", ""))
        elif isinstance(event, NoticeEvent) and event.data.get("type") == "confirmation_required" and live:
            asking = asyncio.create_task(self._ask(session_id, event.data))
            self._asking.add(asking)
            asking.add_done_callback(self._asking.discard)
            return
        else:
            return
        await self._update(session_id, {**update, "_meta": {SEQ_META: seq}})

    async def _ask(self, session_id: str, data: dict[str, str]) -> None:
        """A call waits for confirmation: ask the client (`requires_action` meanwhile), bounded."""
        assert self.connection is not None
        tool_id, tool_name = data.get("tool_id", ""), data.get("tool_name", "")
        waiting = data.get("child_session_id") or session_id
        options = [
            {"optionId": ALLOW_ONCE, "name": "Allow once", "kind": "allow_once"},
            {"optionId": REJECT, "name": "Reject", "kind": "reject_once"},
        ]
        request = {
            "sessionId": session_id,
            "title": f"Run {tool_name}?",
            "subject": {
                "type": "tool_call",
                "toolCall": _tool_update(tool_id, name=tool_name, title=tool_name),
            },
            "options": options,
        }
        await self._update(session_id, {"sessionUpdate": "state_update", "state": "requires_action"})
        chosen = ""
        try:
            answer = await self.connection.request(
                "session/request_permission", request, CONFIRMATION_TIMEOUT_MS / 1000
            )
            outcome = answer.get("outcome")
            if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
                chosen = str(outcome.get("optionId", ""))
        except (RpcError, TimeoutError, asyncio.CancelledError) as exc:
            log.info("no permission for %s in %s: %s", tool_name, session_id, exc)
        foreground = self._foreground.get(session_id)
        if foreground is not None and foreground.running:
            await self._update(session_id, {"sessionUpdate": "state_update", "state": "running"})
        with contextlib.suppress(NotFound):
            self._app.control.confirm_own(
                waiting, tool_id, chosen == ALLOW_ONCE, f"{chosen or 'no answer'} in the client"
            )

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        assert self.connection is not None
        await self.connection.notify("session/update", {"sessionId": session_id, "update": update})


class _TurnIds:
    """The ids of the agent message and thought of the model turn going on."""

    def __init__(self) -> None:
        self.next()

    def next(self) -> None:
        self.agent = f"agent_{uuid.uuid4().hex[:20]}"
        self.thought = f"thought_{uuid.uuid4().hex[:20]}"


def _seq_cursor(cursor: dict[str, Any]) -> int:
    seq = cursor.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq < 2**63:
        raise RpcError(
            INVALID_PARAMS, "replayFrom.seq must be a seq of the session's log (a whole number from 1)"
        )
    return seq


def _user_message(message_id: str, text: str) -> dict[str, Any]:
    return {
        "sessionUpdate": "user_message",
        "messageId": message_id,
        "content": [_text(text)] if text else [],
    }


def _tool_update(tool_call_id: str, **fields: str) -> dict[str, Any]:
    return {"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id, **fields}


def _replayed(history: Sequence[Message]) -> list[dict[str, Any]]:
    """The stored conversation as v2 updates: whole user and agent messages, tool calls with their end."""
    updates: list[dict[str, Any]] = []
    for index, message in enumerate(history):
        if message.role == "user":
            updates.append(_user_message(f"history_{index}", message.content))
        elif message.role == "assistant":
            if message.content:
                content = [_text(message.content)]
                updates.append(
                    {"sessionUpdate": "agent_message", "messageId": f"history_{index}", "content": content}
                )
            updates.extend(_tool_update(c.id, name=c.name, title=c.name) for c in message.tool_calls)
        elif message.role == "tool" and message.tool_call_id:
            failed = message.metadata.get("success") == "false"
            updates.append(_tool_update(message.tool_call_id, status="failed" if failed else "completed"))
    return updates
