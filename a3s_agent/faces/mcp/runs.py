"""agent_task runs that outlive the request that started them (MCP 2026-07-28): a run that stopped
to ask a question (`input_required`, answered by the client's retry of the call) and a run that is
an MCP Task (polled with tasks/get, answered with tasks/update, cancelled with tasks/cancel).

A run goes on in a task of its own; requests attach to it to follow its progress and wait for its
next question or its end. Questions are the confirmations its tool calls wait for. A run nobody
asks about for KEEP_S is cancelled and forgotten (its confirmations have their own timeout, so an
unanswered question ends as the session's confirmation policy says); at most MAX_RUNS are kept."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal

from mcp import types

from ...app import Application
from ...app.types import AgentEvent, NoticeEvent, ToolResultEvent
from ...base.errors import NotFound, ResourceExhausted
from .agent_task import CANCEL_WAIT_S, Report, run_agent_task

KEEP_S = 600.0
"""How long a run is kept after the last request about it (and how long a requestState is good)."""
MAX_RUNS = 64
REASON_CHARS = 1000
"""The longest reason of an answer passed on to the model."""

Status = Literal["working", "input_required", "completed", "failed", "cancelled"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Question:
    """A tool call waiting for confirmation: of `session_id` (a subagent's: its child session)."""

    session_id: str
    tool_id: str
    tool_name: str
    arguments: str

    def input_request(self) -> types.ElicitRequest:
        message = f"The agent wants to run {self.tool_name} with {self.arguments[:2000]}. Allow it?"
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {
                "approved": {"type": "boolean", "title": "Allow this call"},
                "reason": {"type": "string", "title": "Why (told to the agent)"},
            },
            "required": ["approved"],
        }
        return types.ElicitRequest(
            params=types.ElicitRequestFormParams(message=message, requested_schema=schema)
        )


def verdict(response: types.InputResponse) -> tuple[bool, str]:
    """Whether an answer approves the call, and the reason the model reads."""
    if not isinstance(response, types.ElicitResult):
        return False, "the MCP client's answer was not an answer to the question"
    content = response.content or {}
    reason = content.get("reason")
    said = (
        reason[:REASON_CHARS]
        if isinstance(reason, str) and reason
        else f"{response.action} by the MCP client"
    )
    return response.action == "accept" and content.get("approved") is True, said


class AgentRun:
    """One agent_task run going on in a task of its own."""

    def __init__(self, run_id: str, app: Application, arguments: dict[str, Any]) -> None:
        self.id = run_id
        self.created_at = self.updated_at = time.time()
        self.questions: dict[str, Question] = {}
        """Keyed by the input request's key: ours, unique in the run (tool ids may repeat)."""
        self._asked = 0
        self.note = "started"
        self._app = app
        self._reporters: list[Report] = []
        self._changed = asyncio.Event()
        self.task = asyncio.create_task(run_agent_task(app, arguments, self._report, self._watch))
        self.task.add_done_callback(self._ended)

    @property
    def status(self) -> Status:
        if not self.task.done():
            return "input_required" if self.questions else "working"
        if self.task.cancelled():
            return "cancelled"
        return "failed" if self.task.exception() is not None else "completed"

    def _ended(self, task: asyncio.Task[types.CallToolResult]) -> None:
        if not task.cancelled():
            task.exception()  # read: a failure is the task's status, not an unretrieved error
        self._change()

    def _change(self) -> None:
        self.updated_at = time.time()
        self._changed.set()

    async def _report(self, step: float, note: str) -> None:
        self.note = note
        self.updated_at = time.time()
        for report in list(self._reporters):
            with suppress(Exception):  # that request's client went away: the run goes on
                await report(step, note)

    def _watch(self, session_id: str, event: AgentEvent) -> None:
        if isinstance(event, NoticeEvent) and event.data.get("type") == "confirmation_required":
            data = event.data
            self._asked += 1
            self.questions[f"confirm-{self._asked}"] = Question(
                session_id,
                str(data.get("tool_id", "")),
                str(data.get("tool_name", "")),
                str(data.get("arguments", "")),
            )
            self._change()
        elif isinstance(event, ToolResultEvent):
            answered = [
                k
                for k, q in self.questions.items()
                if (q.session_id, q.tool_id) == (session_id, event.call.id)
            ]
            for key in answered:  # by this client, another face or the timeout
                del self.questions[key]
            if answered:
                self._change()

    async def settle(self, report: Report | None) -> None:
        """Wait, following its progress with `report`, until the run asks a question or ends."""
        if report is not None:
            self._reporters.append(report)
        try:
            while not self.task.done() and not self.questions:
                self._changed.clear()
                await self._changed.wait()
        finally:
            if report is not None:
                self._reporters.remove(report)

    def answer(self, responses: Mapping[str, types.InputResponse]) -> None:
        """Give the answers to the calls they are about; others (unknown keys, calls answered
        already) are ignored, as MCP asks."""
        for key, response in responses.items():
            question = self.questions.pop(key, None)
            if question is None:
                continue
            approved, reason = verdict(response)
            try:
                self._app.control.confirm_own(question.session_id, question.tool_id, approved, reason)
            except NotFound:
                log.info("tool call %s no longer waits for confirmation", question.tool_id)
        self._change()

    def input_requests(self) -> dict[str, types.InputRequest]:
        return {key: question.input_request() for key, question in self.questions.items()}

    def result(self) -> types.CallToolResult:
        """The run's result, once it ended (not cancelled)."""
        return self.task.result()

    def cancel(self) -> None:
        self.task.cancel()


class AgentRuns:
    """The runs one MCP server keeps."""

    def __init__(self, app: Application) -> None:
        self._app = app
        self._runs: dict[str, AgentRun] = {}
        self._expiries: dict[str, asyncio.TimerHandle] = {}

    def start(self, arguments: dict[str, Any]) -> AgentRun:
        if len(self._runs) >= MAX_RUNS:
            raise ResourceExhausted(f"{MAX_RUNS} agent_task runs are going on or kept: wait for one to end")
        run = AgentRun(secrets.token_urlsafe(18), self._app, arguments)
        self._runs[run.id] = run
        self.touch(run)
        return run

    def get(self, run_id: str) -> AgentRun | None:
        run = self._runs.get(run_id)
        if run is not None:
            self.touch(run)
        return run

    def touch(self, run: AgentRun) -> None:
        """Keep the run KEEP_S more."""
        if (expiry := self._expiries.pop(run.id, None)) is not None:
            expiry.cancel()
        self._expiries[run.id] = asyncio.get_running_loop().call_later(KEEP_S, self.drop, run.id)

    def drop(self, run_id: str) -> None:
        """Forget the run; cancel it if it still goes on."""
        run = self._runs.pop(run_id, None)
        if (expiry := self._expiries.pop(run_id, None)) is not None:
            expiry.cancel()
        if run is not None and not run.task.done():
            run.cancel()

    async def close(self) -> None:
        """Cancel every run and wait for them to stop (their tools killed, their ends written)."""
        tasks = [run.task for run in self._runs.values()]
        for run_id in list(self._runs):
            self.drop(run_id)
        if tasks:
            await asyncio.wait(tasks, timeout=2 * CANCEL_WAIT_S)
