"""The agent loop: call the model with the session's history and tools, run the calls it makes,
feed the results back, and repeat until it answers. Everything is stored as it happens."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...base import telemetry
from ...base.errors import Cancelled, ContextOverflow, FailedPrecondition, InvalidArgument, ResourceExhausted
from ...base.models import LLMConfig, Message, ProviderState, SessionState, ToolCall, Usage
from ...llm.messages import to_openai, tool_schema
from ...llm.provider import (
    CompletionRequest,
    Provider,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallReady,
    TurnEnd,
)
from ...tools.aliases import find_tool, our_tool_name
from ...tools.registry import Caller, Tool, ToolOutput
from ..sessions.control import ControlPlane, Lane
from ..sessions.manager import SessionManager
from ..store.events import EventBus, EventType, event_entry
from ..store.protocol import LogEntry
from ..store.session import Session
from . import meters, span_content, spans
from .accounting import spending_data
from .budget import BudgetSpent, budget_spent
from .context import Compaction, ContextManager
from .host import AgentHost
from .repair import answer_interrupted_calls
from .steering import steer_applied, steer_notice
from .tool_gate import ToolGate, called
from .tool_runner import new_call_id, tool_message

if TYPE_CHECKING:
    from opentelemetry.trace import Span

DEFAULT_MAX_TOOL_CALLS = 50
CALLS_END_S = 10.0
"""How long a stopped run waits for its cancelled tool calls to end (a subagent's to store its end)."""

NO_LLM_MESSAGE = (
    "no LLM is configured: set A3S_LLM_MODEL (with A3S_LLM_BASE_URL and A3S_LLM_API_KEY, or OPENAI_API_KEY),"
    " or send config.llm {model, base_url, api_key} in Initialize, or set config.llm on the session"
)


@dataclass
class GenerateOptions:
    """The request's options. Tools are on unless the request turned them off."""

    enable_tools: bool = True
    allowed_tools: list[str] = field(default_factory=list)
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    temperature: float | None = None
    max_tokens: int | None = None
    stop_sequences: list[str] = field(default_factory=list)
    return_intermediate_steps: bool = False
    response_format: dict[str, Any] | None = None
    run_id: str = ""  # names the run in its lease and its log entries (runtime/runs.py); "" a new one


@dataclass
class TextEvent:
    text: str


@dataclass
class ThinkingEvent:
    """A piece of the model's reasoning as it streams: shown, never stored nor part of the answer."""

    text: str


@dataclass
class ToolCallEvent:
    call: ToolCall


@dataclass
class ToolResultEvent:
    call: ToolCall
    result: ToolOutput


@dataclass
class TurnEvent:
    """One model turn finished, with its usage."""

    turn: int
    usage: Usage
    finish_reason: str


@dataclass
class Generation:
    """The outcome of a run. finish_reason: stop | length | tool_calls | content_filter."""

    message: Message
    tool_calls: list[tuple[ToolCall, ToolOutput]]
    usage: Usage
    finish_reason: str
    turns: int
    model: str
    duration_ms: float
    intermediate: list[Message]
    budget_spent: BudgetSpent | None = None
    """Set when the run stopped (finish_reason length) because the session's token budget is spent."""


@dataclass
class NoticeEvent:
    """Something the caller should know while the run waits (e.g. a confirmation request)."""

    data: dict[str, str]


@dataclass
class DoneEvent:
    generation: Generation


AgentEvent = TextEvent | ThinkingEvent | ToolCallEvent | ToolResultEvent | TurnEvent | NoticeEvent | DoneEvent

ChunkLog = Callable[[AgentEvent], LogEntry]
"""How a caller that logs a run's events (runtime/runs.py) has the event that reports a write
logged in that write's transaction: the event's log entry, which the caller then does not queue."""


class Agent:
    def __init__(
        self,
        sessions: SessionManager,
        *,
        host: AgentHost,
        control: ControlPlane,
        events: EventBus,
        max_generations: int,
        context: ContextManager | None = None,
    ) -> None:
        self._sessions = sessions
        self._host = host
        self._control = control
        self._events = events
        self._gate = ToolGate(control, events)
        self._context = context
        self._max_generations = max_generations
        self._active = 0  # generations running or waiting for their session

    @property
    def active(self) -> int:
        """Generations running or waiting for their session here."""
        return self._active

    async def run(
        self,
        session_id: str,
        messages: list[Message],
        options: GenerateOptions,
        log_chunk: ChunkLog | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """Run one generation; yields events as they happen and a DoneEvent last."""
        session = self._sessions.get(session_id)
        if not messages:
            raise InvalidArgument("messages must hold at least one message")
        llm = self._host.llm_for(session)
        if not llm.model:
            raise FailedPrecondition(NO_LLM_MESSAGE)
        await self._host.prepare_tools(session)
        run = _Run(self, session, llm, self._host.provider_for(llm), options, log_chunk)
        if session.state == SessionState.PAUSED:  # fail now rather than after waiting for the lock
            raise FailedPrecondition(f"session {session_id!r} is paused; Resume it first")
        if self._active >= self._max_generations:
            raise ResourceExhausted(
                f"{self._active} generations are running, the server's limit; try again when one ends"
            )
        self._active += 1
        run.span = spans.agent_span(session, llm)
        ended: dict[str, str | int | list[str]] = {}
        error: str | None = None
        started, finish_reason = time.perf_counter(), ""
        try:
            async for event in self._run_locked(session_id, llm, run, messages):
                if isinstance(event, DoneEvent):
                    finish_reason = event.generation.finish_reason
                    if run.span is not None:
                        ended = spans.outcome(finish_reason, event.generation.usage)
                yield event
        except BaseException as exc:
            error = type(exc).__qualname__
            raise
        finally:
            self._active -= 1
            telemetry.end(run.span, ended, error)
            meters.generation_ended(llm, time.perf_counter() - started, finish_reason, error or "")

    async def _run_locked(
        self, session_id: str, llm: LLMConfig, run: _Run, messages: list[Message]
    ) -> AsyncIterator[AgentEvent]:
        lanes = self._control.of(session_id).counts
        generating = lanes.holding(Lane.GENERATE, self._sessions.generation_lock(session_id))
        async with generating, self._host.own_run(session_id, run.run_id) as closing:
            control = self._control.start_run(session_id)
            self._events.publish(
                EventType.GENERATION_STARTED, session_id, "generation started", {"model": llm.model}
            )
            try:
                async for event in run.execute(messages):
                    if isinstance(event, DoneEvent):
                        generation = event.generation
                        if generation.budget_spent is not None:
                            spent = generation.budget_spent
                            self._events.publish(
                                EventType.WARNING, session_id, spent.message, spent.metadata()
                            )
                        self._events.publish(
                            EventType.GENERATION_COMPLETED, session_id, "generation completed",
                            {"finish_reason": generation.finish_reason, "turns": generation.turns,
                             **generation.usage.counts(), "duration_ms": generation.duration_ms,
                             **run.spending()},
                        )  # fmt: skip
                        if run.log_chunk is not None:
                            # Logged when the lease is released; followers are handed it from that
                            # write and run only once this task has let go of the session's lock and
                            # the generation slot (nothing in between awaits): a caller told of the
                            # end may start the next generation at once.
                            closing.append(run.log_chunk(event))
                    yield event
            except asyncio.CancelledError:
                await self._answer_open_calls(session_id, "cancelled: the run was stopped")
                if not control.cancel_requested:
                    raise  # the caller went away: nothing more to tell anyone
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                note = "generation cancelled by the client"
                await self._sessions.append_messages(
                    session_id,
                    [Message(role="assistant", content="[the run was cancelled by the client]")],
                    log=[event_entry(EventType.WARNING, session_id, note, run.spending())],
                )
                if self._sessions.get(session_id).state == SessionState.PAUSED:  # the pause held this run
                    await self._sessions.set_state(session_id, SessionState.ACTIVE)
                raise Cancelled("the generation was cancelled") from None
            except Exception as exc:
                await self._answer_open_calls(session_id, f"not run: the generation failed ({exc})")
                self._events.publish(EventType.ERROR, session_id, f"generation failed: {exc}", run.spending())
                raise
            finally:
                # Came after the last model call (a steer only when the run failed or was stopped).
                steers = self._control.take_steers(session_id)
                leftover = [*self._control.take_injected(session_id), *(s.message for s in steers)]
                self._control.end_run(session_id)
                if leftover:
                    await self._sessions.append_messages(session_id, leftover)

    async def _answer_open_calls(self, session_id: str, reason: str) -> None:
        """A run stopped between a model's tool calls and their results would leave a history every
        strict provider refuses: give each unanswered call of the last turn an error result."""
        history = await self._sessions.history(session_id)
        last = next((i for i in range(len(history) - 1, -1, -1) if history[i].role == "assistant"), None)
        if last is None or not history[last].tool_calls:
            return
        answered = {m.tool_call_id for m in history[last + 1 :] if m.role == "tool"}
        missing = [c for c in history[last].tool_calls if c.id not in answered]
        if missing:
            failed = ToolOutput(success=False, error=reason)
            await self._sessions.append_messages(session_id, [tool_message(call, failed) for call in missing])

    def offered_tools(self, session: Session, options: GenerateOptions) -> list[Tool]:
        if not options.enable_tools:
            return []
        tools = self._host.tools_for(session)
        if options.allowed_tools:
            names = {t.name for t in tools}
            allowed = {name if name in names else our_tool_name(name) for name in options.allowed_tools}
            unknown = sorted(allowed - {t.name for t in tools})
            if unknown:
                raise InvalidArgument(
                    f"options.allowed_tools names unknown or disabled tools: {', '.join(unknown)}"
                )
            tools = [t for t in tools if t.name in allowed]
        return tools


class _Run:
    """The state of one generation."""

    def __init__(
        self,
        agent: Agent,
        session: Session,
        llm: LLMConfig,
        provider: Provider,
        options: GenerateOptions,
        log_chunk: ChunkLog | None,
    ) -> None:
        self.agent = agent
        self.log_chunk = log_chunk
        self.session = session
        self.llm = llm
        self.provider = provider
        self.options = options
        self.run_id = options.run_id or f"run_{uuid.uuid4().hex}"
        self.tools = {t.name: t for t in agent.offered_tools(session, options)}
        self.notices: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.context = agent._host.tool_context(session)
        self.usage = Usage()
        self.model_calls = 0
        self.calls: list[tuple[ToolCall, ToolOutput]] = []
        self.intermediate: list[Message] = []
        self.started = time.perf_counter()
        self.span: Span | None = None  # the generation's invoke_agent span (spans.py), when tracing

    def spending(self) -> dict[str, object]:
        """What the run has spent on the model so far, for the event that ends it."""
        return spending_data(self.llm.model, self.model_calls, self.usage)

    async def _store(self, *messages: Message) -> None:
        await self.agent._sessions.append_messages(self.session.id, list(messages))

    def _carried(self, events: list[AgentEvent]) -> list[LogEntry]:
        """The log entries of events that report the write about to be made, for its transaction."""
        return [self.log_chunk(event) for event in events] if self.log_chunk is not None else []

    async def execute(self, new_messages: list[Message]) -> AsyncIterator[AgentEvent]:
        spent = self._budget_spent()
        if spent is not None:  # nothing of this request is stored: the model would never see it
            for ending in self._stopped(spent, 0):
                yield ending
            return
        await answer_interrupted_calls(self.agent._sessions, self.session.id)  # a crash left calls open
        history = await self.agent._sessions.history(self.session.id)
        await self.agent._host.turn_starting(
            self.session, new_messages, len(history), list(self.tools.values())
        )
        await self._store(*new_messages)
        recalled = await self.agent._host.recalled_memories(self.session, new_messages)
        prompt = self.agent._host.prompt_for(self.session)
        conversation = [
            {
                "role": "system",
                "content": f"{prompt}\n\n{recalled}" if recalled else prompt,
            },
            *(to_openai(m) for m in history),
            *(to_openai(m) for m in new_messages),
        ]
        tool_schemas = [tool_schema(t) for t in self.tools.values()]
        limit = self.options.max_tool_calls or DEFAULT_MAX_TOOL_CALLS
        turn = 0
        while True:
            turn += 1
            await self.agent._control.checkpoint(self.session.id)
            spent = self._budget_spent() if turn > 1 else None
            if spent is not None:
                for ending in self._stopped(spent, turn - 1):
                    yield ending
                return
            injected = self.agent._control.take_injected(self.session.id)
            if injected:
                await self._store(*injected)
                conversation.extend(to_openai(m) for m in injected)
            async for applied in self._take_steers(conversation):
                yield applied
            compacted = await self._compact_if_needed()
            if compacted is not None:
                conversation = await self._rebuilt(conversation[0])
                yield NoticeEvent(compacted)
            text: list[str] = []
            requested: list[ToolCall] = []
            finish_reason = "stop"
            turn_usage = Usage()
            provider_state: ProviderState = {}  # what the provider wants back with this message
            overflowed = False
            while True:  # once more after the provider refused the prompt as too long and it was compacted
                chat = spans.chat_span(self.span, self.session, self.llm)
                request = CompletionRequest(
                    model=self.llm.model,
                    messages=conversation,
                    tools=tool_schemas,
                    temperature=self.options.temperature or self.llm.temperature or None,
                    max_tokens=self.options.max_tokens or self.llm.max_tokens or None,
                    stop=self.options.stop_sequences,
                    response_format=self.options.response_format,
                    session_id=self.session.id,
                    workspace=str(self.context.workspace),
                    trace_headers=telemetry.headers(chat),
                )
                span_content.note_request(chat, conversation)
                events = meters.of(self.provider.stream(request), self.llm)
                try:
                    async for event in events if chat is None else self._traced(chat, events):
                        if isinstance(event, TextDelta):
                            text.append(event.text)
                            yield TextEvent(event.text)
                        elif isinstance(event, ReasoningDelta):
                            yield ThinkingEvent(event.text)
                        elif isinstance(event, ToolCallReady):
                            call = ToolCall(
                                id=event.id or new_call_id(),
                                name=event.name,
                                arguments=event.arguments,
                                provider_state=event.provider_state,
                            )
                            requested.append(call)
                            yield ToolCallEvent(call)
                        elif isinstance(event, TurnEnd):
                            finish_reason = event.finish_reason
                            turn_usage = event.usage or Usage()
                            provider_state = event.provider_state
                            if chat is not None:
                                chat.set_attributes(spans.outcome(finish_reason, turn_usage, event.model))
                                span_content.note_reply(chat, "".join(text), requested, finish_reason)
                    break
                except ContextOverflow as exc:
                    if text or requested:  # part of the reply is out: a retry would repeat it
                        raise
                    notice = await self._compact_after_overflow(exc, overflowed)
                    overflowed = True
                    conversation = await self._rebuilt(conversation[0])
                    yield NoticeEvent(notice)
            self.usage += turn_usage
            self.model_calls += 1
            assistant = Message(
                role="assistant", content="".join(text), tool_calls=requested, provider_state=provider_state
            )
            ended = TurnEvent(turn, turn_usage, finish_reason)
            budget = max(limit - len(self.calls), 0)
            groups, beyond = _groups(requested[:budget], self.tools), requested[budget:]
            # The first group's calls run right after this write: their TOOL_CALLED entries go with
            # it, unless the gate may deny or hold them (its decision is then logged with them).
            ahead = groups and self.agent._gate.holds_nothing(self.agent._sessions.get(self.session.id))
            announced = [called(self.session.id, call) for call in groups[0]] if ahead else []
            await self.agent._sessions.append_messages(
                self.session.id, [assistant], usage=turn_usage, log=[*self._carried([ended]), *announced]
            )
            for above in self.agent._sessions.lineage(self.session):  # a subagent's: see _budget_spent
                await self.agent._sessions.append_messages(above.id, [], usage=turn_usage)
            yield ended
            conversation.append(to_openai(assistant))
            if not requested and self.agent._control.may_end(self.session.id):
                yield DoneEvent(self._generation(assistant, _final_reason(finish_reason), turn))
                return
            self.intermediate.append(assistant)
            async for step in self._run_calls(groups, beyond, conversation, first_announced=bool(announced)):
                yield step
            if len(self.calls) >= limit:
                note = f"Stopped after {len(self.calls)} tool calls: the max_tool_calls limit ({limit}) was reached."
                final = Message(role="assistant", content=(assistant.content + "\n\n" + note).strip())
                yield DoneEvent(self._generation(final, "tool_calls", turn))
                return

    async def _take_steers(self, conversation: list[dict[str, Any]]) -> AsyncIterator[AgentEvent]:
        """Take in the messages that steer the run (core/loop/steering.py), each with its event."""
        steers = self.agent._control.take_steers(self.session.id)
        if not steers:
            return
        messages = [steer.message for steer in steers]
        log = [steer_applied(self.session.id, steer) for steer in steers]
        await self.agent._sessions.append_messages(self.session.id, messages, log=log)
        conversation.extend(to_openai(m) for m in messages)
        for steer in steers:
            yield NoticeEvent(steer_notice(steer))

    @staticmethod
    async def _traced(chat: Span, events: AsyncIterator[ProviderEvent]) -> AsyncIterator[ProviderEvent]:
        """A model request's events; its `chat` span ends with it (failed if it did)."""
        error: str | None = None
        try:
            async for event in events:
                yield event
        except BaseException as exc:
            error = type(exc).__qualname__
            raise
        finally:
            telemetry.end(chat, error=error)

    def _budget_spent(self) -> BudgetSpent | None:
        """Whether the session's token budget forbids the next model call (read now: a
        ConfigureSession may have changed it while the run went on). A subagent's is the budget
        of the session at the top of its line, whose usage holds every subagent's below it."""
        sessions = self.agent._sessions
        session = sessions.get(self.session.id)
        owner = (sessions.lineage(session) or [session])[-1]
        return budget_spent(owner, self.agent._host.token_budget_for(owner))

    def _stopped(self, spent: BudgetSpent, turns: int) -> list[AgentEvent]:
        """The end of a run the budget stopped before its next model call: a METADATA notice,
        then the result, finish_reason length, its message saying so (after the text of the
        last turn, when there was one)."""
        before = self.intermediate[-1].content if self.intermediate else ""
        final = Message(role="assistant", content=(before + "\n\n" + spent.message).strip())
        generation = self._generation(final, "length", turns)
        generation.budget_spent = spent
        return [NoticeEvent({"type": "token_budget_spent", **spent.metadata()}), DoneEvent(generation)]

    async def _compact_if_needed(self) -> dict[str, str] | None:
        """Auto-compaction before a model call that would push the context past the threshold."""
        session = self.agent._sessions.get(self.session.id)
        context = self.agent._context
        if not session.config.auto_compact or context is None:
            return None
        if not await context.over_threshold(session, await self.agent._sessions.history(session.id)):
            return None
        result = await spans.compacted(self.span, session, "threshold", context.compact(session.id))
        return _compaction_notice(result) if result.summarized_by else None

    async def _compact_after_overflow(self, exc: ContextOverflow, again: bool) -> dict[str, str]:
        """The provider refused the prompt as too long: compact once (auto_compact) for one retry."""
        session = self.agent._sessions.get(self.session.id)
        context = self.agent._context
        if again:
            raise ContextOverflow(f"{exc}; refused again after compacting the context") from exc
        if not session.config.auto_compact or context is None:
            raise ContextOverflow(
                f"{exc}; auto_compact is off for this session: call CompactContext (or turn auto_compact"
                " on) and try again"
            ) from exc
        return _compaction_notice(
            await spans.compacted(
                self.span, session, "overflow", context.compact(session.id, overflowed=True)
            )
        )

    async def _rebuilt(self, system: dict[str, Any]) -> list[dict[str, Any]]:
        """The conversation from the stored history (after compaction changed it)."""
        return [system, *(to_openai(m) for m in await self.agent._sessions.history(self.session.id))]

    async def _run_calls(
        self,
        groups: list[list[ToolCall]],
        beyond: list[ToolCall],
        conversation: list[dict[str, Any]],
        first_announced: bool,
    ) -> AsyncIterator[AgentEvent]:
        """Run the turn's calls in order, group by group (`_groups`: consecutive read-only calls
        run concurrently; the first group's TOOL_CALLED entries are logged already when
        `first_announced`), each group's results stored together as soon as it is done; then
        answer the calls `beyond` the limit."""
        for index, group in enumerate(groups):
            await self.agent._control.checkpoint(self.session.id)
            results: list[ToolOutput] = []
            # A lone call's TOOL_COMPLETED is logged with its result (one transaction less); a
            # group's are logged as each call ends, not held until the slowest one is done.
            completed: list[LogEntry] = []
            try:
                async for event in self._run_group(
                    group,
                    results,
                    completed.append if len(group) == 1 else None,
                    announced=first_announced and index == 0,
                ):
                    yield event
                self.calls.extend(zip(group, results, strict=True))
                async for event in self._finish(
                    list(zip(group, results, strict=True)), conversation, completed
                ):
                    yield event
            except BaseException:
                for entry in completed:  # not written with the results: logged on their own
                    self.agent._events.submit(entry)
                raise
        skipped = ToolOutput(success=False, error="not run: the max_tool_calls limit was reached")
        async for event in self._finish([(call, skipped) for call in beyond], conversation):
            yield event

    async def _finish(
        self,
        done: list[tuple[ToolCall, ToolOutput]],
        conversation: list[dict[str, Any]],
        completed: list[LogEntry] | None = None,
    ) -> AsyncIterator[AgentEvent]:
        """Store the results with their events (`completed`: TOOL_COMPLETED entries, emptied
        once written), then pass them on."""
        if not done:
            return
        messages = [tool_message(call, result) for call, result in done]
        results: list[AgentEvent] = [ToolResultEvent(call, result) for call, result in done]
        log = [*(completed or ()), *self._carried(results)]
        await self.agent._sessions.append_messages(self.session.id, messages, log=log)
        if completed:
            completed.clear()
        conversation.extend(to_openai(m) for m in messages)
        for event in results:
            yield event

    async def _run_group(
        self,
        group: list[ToolCall],
        results: list[ToolOutput],
        completed: Callable[[LogEntry], None] | None,
        announced: bool,
    ) -> AsyncIterator[AgentEvent]:
        """Run a group of calls, passing on notices (such as confirmation requests) while they run."""
        offered = frozenset(self.tools)
        tasks = [
            asyncio.create_task(
                self.agent._gate.run(
                    self.session,
                    call,
                    find_tool(self.tools, call.name),
                    replace(self.context, caller=Caller(call.id, offered, self.notices.put_nowait)),
                    self.notices.put_nowait,
                    completed,
                    announced,
                ),
                context=telemetry.context_of(self.span),  # the calls' spans are the generation's
            )
            for call in group
        ]
        notice: asyncio.Future[dict[str, str]] | None = None
        try:
            pending: set[asyncio.Future[Any]] = set(tasks)
            while pending:
                notice = asyncio.ensure_future(self.notices.get())
                done, _ = await asyncio.wait({*pending, notice}, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
                if notice in done:
                    yield NoticeEvent(notice.result())
                else:
                    notice.cancel()
            while not self.notices.empty():
                yield NoticeEvent(self.notices.get_nowait())
            results.extend(task.result() for task in tasks)
        finally:
            started: list[asyncio.Future[Any]] = [*tasks, *([notice] if notice is not None else [])]
            for task in started:
                if not (isinstance(task, asyncio.Task) and task.cancelling()):  # (a subagent's Cancel)
                    task.cancel()
            # The run ends once its calls have: a subagent's last words in this session's log are
            # written under this run's lease, and its processes are gone before Cancel's answer.
            ending = [task for task in tasks if not task.done()]
            if ending:
                done, _ = await asyncio.wait(ending, timeout=CALLS_END_S)
                for task in done:
                    task.cancelled() or task.exception()  # retrieved: nobody wants it now

    def _generation(self, message: Message, finish_reason: str, turns: int) -> Generation:
        return Generation(
            message=message,
            tool_calls=self.calls,
            usage=self.usage,
            finish_reason=finish_reason,
            turns=turns,
            model=self.llm.model,
            duration_ms=round((time.perf_counter() - self.started) * 1000, 3),
            intermediate=self.intermediate,
        )


def _compaction_notice(result: Compaction) -> dict[str, str]:
    """The METADATA chunk a stream gets when its session was compacted."""
    return {
        "type": "context_compacted",
        "before_tokens": str(result.before.total_tokens),
        "after_tokens": str(result.after.total_tokens),
        "before_messages": str(result.before.message_count),
        "after_messages": str(result.after.message_count),
        "summarized_by": result.summarized_by,
        "summary": result.summary,
    }


def _final_reason(provider_reason: str) -> str:
    return provider_reason if provider_reason in {"stop", "length", "content_filter"} else "stop"


def _groups(calls: list[ToolCall], tools: dict[str, Tool]) -> list[list[ToolCall]]:
    """Split calls into runs: consecutive read-only (query lane) calls share a group."""
    groups: list[list[ToolCall]] = []
    for call in calls:
        if _is_query(call, tools) and groups and _is_query(groups[-1][0], tools):
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups


def _is_query(call: ToolCall, tools: dict[str, Tool]) -> bool:
    tool = find_tool(tools, call.name)
    return tool is not None and tool.lane == "query"
