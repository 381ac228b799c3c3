"""A3S's server-side agentic loop and delegation (the later dialect's AgenticGenerate and Delegate):
a generation in a session, with a plan made first and a check of its outcome after it when asked,
and a named agent run on a task as a child of a session. Both are the runs the rest of the server
makes (app/generation.py's, app/subagents.py's), told as steps: one per model turn, with its text,
tool calls, results and usage.

What the faces get is a stream of `Item`s: the run's own events as they happen (`Progress`), a
`StepFinished` after each model turn, `PlanMade` and `Reflected` when asked for, the session's
confirmations answered and external tasks (`Told`, from its log), `Failed` when the run broke
after it started, and `Finished` last, with the whole outcome."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..base.errors import AgentError, Cancelled, FailedPrecondition, InvalidArgument, Unavailable
from ..base.models import Message, ToolCall, Usage
from ..base.planning import Goal, Plan
from ..core.agents.definition import MAX_STEPS
from ..core.loop.agent import (
    DEFAULT_MAX_TOOL_CALLS,
    NO_LLM_MESSAGE,
    AgentEvent,
    DoneEvent,
    GenerateOptions,
    NoticeEvent,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from ..core.store.events import EVENT, Event, EventType, Filter, entry_event
from ..runtime import Runtime
from ..runtime.subagents import SUBAGENT_END
from ..tools.registry import ToolOutput
from .generation import Generation
from .planning import MAX_GOAL_CHARS, Planning
from .subagents import Subagents

FINISH_REASONS = {"stop": "stop", "tool_calls": "max_steps"}
"""The loop's finish reasons as A3S names them (`length` and `content_filter` are kept)."""


@dataclass
class Step:
    """One model turn: its text, the calls it made and their results, its usage."""

    index: int
    text: str = ""
    calls: list[tuple[ToolCall, ToolOutput | None]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = ""


@dataclass(frozen=True)
class Progress:
    """An event of the run (of the child's, for a delegation)."""

    event: AgentEvent


@dataclass(frozen=True)
class StepFinished:
    step: Step


@dataclass(frozen=True)
class PlanMade:
    plan: Plan


@dataclass(frozen=True)
class Reflected:
    """The check of the outcome against the prompt: `confidence` that it is reached (0 to 1)."""

    confidence: float
    should_retry: bool
    insight: str


@dataclass(frozen=True)
class Failed:
    """The run broke after it started (what broke it: `error`); `recoverable`: the run went on."""

    error: AgentError
    recoverable: bool = False


@dataclass(frozen=True)
class Finished:
    """The outcome: finish_reason `stop`, `max_steps`, `length`, `cancelled` or `error`."""

    finish_reason: str
    text: str
    steps: list[Step]
    usage: Usage
    plan: Plan | None = None
    agent_session_id: str = ""

    @property
    def tool_calls(self) -> list[tuple[ToolCall, ToolOutput | None]]:
        return [call for step in self.steps for call in step.calls]


@dataclass(frozen=True)
class Told:
    """An event of the session's log that the run's own stream does not carry: a confirmation's
    answer, an external task handed to the host or completed (a subagent's too, naming it)."""

    event: Event


Item = Progress | StepFinished | PlanMade | Reflected | Told | Failed | Finished

TOLD = frozenset(
    {EventType.CONFIRMATION_RECEIVED, EventType.EXTERNAL_TASK_PENDING, EventType.EXTERNAL_TASK_COMPLETED}
)
ENDING_S = 10.0
"""How long a stream that ends waits for its run's task to stop (its tools killed)."""


@dataclass(frozen=True)
class _End:
    error: Exception | None = None


class Agentic:
    def __init__(
        self, runtime: Runtime, generation: Generation, planning: Planning, subagents: Subagents
    ) -> None:
        self._rt = runtime
        self._generation = generation
        self._planning = planning
        self._subagents = subagents

    def generate(
        self,
        session_id: str,
        prompt: str,
        *,
        max_steps: int = 0,
        planning: bool = False,
        reflection: bool = False,
    ) -> AsyncIterator[Item]:
        """A generation of `prompt` in the session, at most `max_steps` tool calls (0: 50), that
        runs on if the caller goes away (Cancel stops it: `cancelled`). With `planning`, the
        session's model makes a plan first (CreatePlan's: it becomes the session's plan and todo
        list) and the prompt carries it; with `reflection`, the model checks the outcome against
        the prompt after the run (CheckGoalAchievement's judgement). What fails before the run
        starts raises: NotFound, InvalidArgument, FailedPrecondition (no model)."""
        run = self._generate(session_id, prompt, max_steps, planning, reflection)
        return self._with_told(session_id, run)

    def delegate(
        self,
        session_id: str,
        agent: str,
        task: str,
        *,
        max_steps: int = 0,
        allowed_tools: tuple[str, ...] = (),
    ) -> AsyncIterator[Item]:
        """`agent` run on `task` as a child of the session (app/subagents.py `delegate`, whose
        errors it raises): the child's events, and its outcome last, whose `agent_session_id` is
        the child's session. It stops when the caller does (and with Cancel)."""
        return self._with_told(session_id, self._delegate(session_id, agent, task, max_steps, allowed_tools))

    async def _with_told(self, session_id: str, items: AsyncIterator[Item]) -> AsyncIterator[Item]:
        """`items`, run in a task of their own, and the `Told` events of the session (and its
        subagents) while they come; what `items` raise is raised, and when the caller stops, so
        do they."""
        subscription = await self._rt.events.subscribe(Filter(None, EVENT, TOLD))
        queue: asyncio.Queue[Item | _End] = asyncio.Queue()

        async def run() -> None:
            try:
                async for item in items:
                    queue.put_nowait(item)
            except Exception as exc:
                queue.put_nowait(_End(exc))
            except BaseException:  # stopped from outside (the server stops, its lease was lost)
                queue.put_nowait(
                    _End(Unavailable("the run was stopped: the server stops or lost the session"))
                )
                raise
            else:
                queue.put_nowait(_End())

        async def watch() -> None:
            async for entry in subscription:
                event = entry_event(entry)
                if event.session_id == session_id:  # a subagent's notices are in its parents' logs too
                    queue.put_nowait(Told(event))

        tasks = [asyncio.create_task(run()), asyncio.create_task(watch())]
        try:
            while not isinstance(item := await queue.get(), _End):
                yield item
            if item.error is not None:
                raise item.error
        finally:
            subscription.close()
            for task in tasks:
                task.cancel()
            ended, _ = await asyncio.wait(tasks, timeout=ENDING_S)
            for task in ended:
                task.cancelled() or task.exception()  # retrieved: nobody wants it now

    async def _generate(
        self, session_id: str, prompt: str, max_steps: int, planning: bool, reflection: bool
    ) -> AsyncIterator[Item]:
        if not prompt.strip():
            raise InvalidArgument("prompt is required: what the agent is to do")
        limit = _checked_steps(max_steps) or DEFAULT_MAX_TOOL_CALLS
        plan = await self._planning.create_plan(session_id, prompt, "") if planning else None
        if plan is not None:
            yield PlanMade(plan)
        message = Message(role="user", content=_with_plan(prompt, plan))
        options = GenerateOptions(max_tool_calls=limit)
        steps = _Steps()
        chunks = None
        try:
            chunks = await self._generation.follow(session_id, [message], options)  # it has started
            async for event, _ in chunks:
                for item in steps.take(event):
                    yield item
        except Cancelled:  # (before its first event too)
            yield steps.finish("cancelled", plan=plan)
            return
        except AgentError as exc:
            if chunks is None:  # it did not start: the request was refused
                raise
            yield Failed(exc)
            yield steps.finish("error", plan=plan)
            return
        done = steps.finish(plan=plan)
        if reflection:
            yield await self._reflect(session_id, prompt, done.text)
        yield done

    async def _delegate(
        self, session_id: str, agent: str, task: str, max_steps: int, allowed_tools: tuple[str, ...]
    ) -> AsyncIterator[Item]:
        await self._rt.sessions.refresh(session_id)
        if not self._rt.llm_for(self._rt.sessions.get(session_id)).model:
            raise FailedPrecondition(NO_LLM_MESSAGE)
        steps = _Steps()
        child, ending = "", None
        try:
            events = self._subagents.delegate(
                session_id, agent, task, max_steps=_checked_steps(max_steps), allowed_tools=allowed_tools
            )
            async for item in events:
                child = item.session_id
                if isinstance(item.event, NoticeEvent) and item.event.data.get("type") == SUBAGENT_END:
                    ending = item.event  # told with the answer, once it is known
                    continue
                if isinstance(item.event, DoneEvent) and ending is not None:
                    answer = item.event.generation.message.content
                    yield Progress(NoticeEvent({**ending.data, "result": answer}))
                for taken in steps.take(item.event):
                    yield taken
        except Cancelled:
            yield steps.finish("cancelled", agent_session_id=child)
            return
        except AgentError as exc:
            if not child:  # nothing started: the request was refused
                raise
            yield Failed(exc)
            yield steps.finish("error", agent_session_id=child)
            return
        yield steps.finish(agent_session_id=child)

    async def _reflect(self, session_id: str, prompt: str, outcome: str) -> Reflected | Failed:
        """The model's check of the session's work against the prompt; a check that fails is
        told (recoverable: the run's outcome stands)."""
        goal = Goal(description=prompt.strip()[:MAX_GOAL_CHARS], success_criteria=())
        try:
            check = await self._planning.check_goal(session_id, goal, outcome)
        except AgentError as exc:
            return Failed(exc, recoverable=True)
        if check.achieved:
            insight = "the outcome meets the request"
        else:
            insight = "not met yet: " + ("; ".join(check.remaining_criteria) or "the request is not done")
        return Reflected(check.progress, not check.achieved, insight)


class _Steps:
    """The run's steps as its events come: a step per model turn, its calls' results added as
    they come after it."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._current = Step(1)
        self._text = ""
        self._reason = ""
        self._usage = Usage()

    def take(self, event: AgentEvent) -> list[Item]:
        if isinstance(event, TextEvent):
            self._current.text += event.text
        elif isinstance(event, ToolCallEvent):
            self._current.calls.append((event.call, None))
        elif isinstance(event, ToolResultEvent):
            self._answer(event)
        elif isinstance(event, TurnEvent):
            step = self._current
            step.usage, step.finish_reason = event.usage, event.finish_reason
            self.steps.append(step)
            self._current = Step(step.index + 1)
            return [StepFinished(step)]
        elif isinstance(event, DoneEvent):
            generation = event.generation
            self._text, self._usage = generation.message.content, generation.usage
            self._reason = FINISH_REASONS.get(generation.finish_reason, generation.finish_reason)
            return []
        return [Progress(event)]

    def _answer(self, event: ToolResultEvent) -> None:
        for step in reversed(self.steps):
            for index, (call, _) in enumerate(step.calls):
                if call.id == event.call.id:
                    step.calls[index] = (call, event.result)
                    return

    def finish(self, reason: str = "", plan: Plan | None = None, agent_session_id: str = "") -> Finished:
        """The outcome: the run's own finish reason, or `reason` when it did not end by itself."""
        usage = self._usage if self._reason else sum((s.usage for s in self.steps), Usage())
        text = self._text or (self.steps[-1].text if self.steps else "")
        return Finished(reason or self._reason or "stop", text, self.steps, usage, plan, agent_session_id)


def _checked_steps(max_steps: int) -> int:
    if not 0 <= max_steps <= MAX_STEPS:
        raise InvalidArgument(f"max_steps must be from 0 (the default) to {MAX_STEPS}, not {max_steps}")
    return max_steps


def _with_plan(prompt: str, plan: Plan | None) -> str:
    """The prompt, and the plan made for it (the session's todo list) for the model to follow."""
    if plan is None:
        return prompt
    steps = "\n".join(f"{n}. [{step.id}] {step.description}" for n, step in enumerate(plan.steps, 1))
    return f"{prompt}\n\nThe plan for this (the todo list holds its steps):\n{steps}"
