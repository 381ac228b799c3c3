"""Context accounting and compaction.

Usage is counted offline with tiktoken over the conversation as it will next be sent (system
prompt, live history, tool schemas). Compaction keeps the system prompt, the first user task and
the most recent messages (never separating an assistant's tool calls from their results) and
replaces the middle with a summary written by the LLM; when the LLM cannot, a deterministic
fallback still shrinks the context (old tool outputs first, then the oldest turns).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..llm.messages import to_openai
from ..llm.provider import CompletionRequest, Provider, TextDelta
from ..llm.tokens import TokenCounter
from .errors import AgentError
from .events import EventBus, EventType
from .models import LLMConfig, Message, Session
from .sessions import SessionManager

DEFAULT_WINDOW = 128_000
DEFAULT_THRESHOLD = 0.8
DEFAULT_KEEP_RECENT = 20
# Windows of well-known model families, by name prefix; anything else gets DEFAULT_WINDOW.
KNOWN_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude", 200_000),
    ("gemini", 1_000_000),
    ("deepseek", 128_000),
    ("kimi", 128_000),
    ("moonshot", 128_000),
    ("llama", 128_000),
    ("qwen", 32_768),
)
SUMMARY_PROMPT = (
    "Summarise the conversation below for the agent that will continue it; it will not see these "
    "messages again. Write short sections: Goal, Decisions made, Files touched (paths and what "
    "changed), Open questions, Next step. Keep exact names, paths, commands and error messages."
)
_STUB = "[tool output removed to save context]"


def model_window(model: str) -> int:
    name = model.lower().rsplit("/", 1)[-1]
    return next((size for prefix, size in KNOWN_WINDOWS if name.startswith(prefix)), DEFAULT_WINDOW)


@dataclass
class ContextUsage:
    """Tokens of the conversation as it will next be sent: prompt = system, user and tool messages
    and tool schemas; completion = what the model wrote (assistant messages)."""

    prompt_tokens: int
    completion_tokens: int
    message_count: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Compaction:
    before: ContextUsage
    after: ContextUsage
    summarized_by: str  # "llm", "fallback" or "" when there was nothing to compact


class ContextManager:
    def __init__(
        self,
        sessions: SessionManager,
        events: EventBus,
        *,
        llm_for: Callable[[Session], LLMConfig],
        provider_for: Callable[[LLMConfig], Provider],
        tool_schemas_for: Callable[[Session], list[dict[str, Any]]],
        prompt_for: Callable[[Session], str],
        threshold: float = DEFAULT_THRESHOLD,
        keep_recent: int = DEFAULT_KEEP_RECENT,
    ) -> None:
        self._sessions = sessions
        self._events = events
        self._llm_for = llm_for
        self._provider_for = provider_for
        self._tool_schemas_for = tool_schemas_for
        self._prompt_for = prompt_for
        self.threshold = threshold
        self.keep_recent = keep_recent

    def window(self, session: Session) -> int:
        return session.config.max_context_length or model_window(self._llm_for(session).model)

    def counter(self, session: Session) -> TokenCounter:
        return TokenCounter(self._llm_for(session).model)

    async def usage(self, session_id: str) -> ContextUsage:
        session = self._sessions.get(session_id)
        return await self.measure(session, await self._sessions.history(session_id))

    def _meter(self, session: Session) -> Callable[[list[Message]], ContextUsage]:
        """What measures a history of `session`, safe to call off the event loop (the system
        prompt and tool schemas are taken now, on it)."""
        return partial(
            _count, self.counter(session), self._prompt_for(session), self._tool_schemas_for(session)
        )

    async def measure(self, session: Session, history: list[Message]) -> ContextUsage:
        """The usage of `history`, counted on a worker thread: counting megabytes takes seconds,
        which the event loop (every other caller) must not wait for."""
        return await asyncio.to_thread(self._meter(session), history)

    async def over_threshold(self, session: Session, history: list[Message]) -> bool:
        return (await self.measure(session, history)).total_tokens > self.threshold * self.window(session)

    async def compact(self, session_id: str) -> Compaction:
        """Compact now (CompactContext, or automatically before a model call)."""
        session = self._sessions.get(session_id)
        history = await self._sessions.history(session_id)
        meter = self._meter(session)
        before = await asyncio.to_thread(meter, history)
        plan = _plan(history, self.keep_recent)
        if plan is None:
            return Compaction(before, before, "")
        head, middle, tail = plan
        try:
            summary = await self._summarize(session, middle)
            kept, how = [*head, _summary_message(summary, len(middle)), *tail], "llm"
        except AgentError as exc:
            self._events.publish(
                EventType.WARNING, session_id, f"summary failed, compacting without it: {exc}"
            )
            target = int(self.threshold * self.window(session) * 0.5)
            kept, how = await asyncio.to_thread(_fallback, meter, head, middle, tail, target), "fallback"
        await self._sessions.replace_history(session_id, kept)
        after = await asyncio.to_thread(meter, kept)
        self._events.publish(
            EventType.INFO, session_id, "context_compacted",
            {"before_tokens": before.total_tokens, "after_tokens": after.total_tokens,
             "before_messages": before.message_count, "after_messages": after.message_count, "by": how},
        )  # fmt: skip
        return Compaction(before, after, how)

    async def _summarize(self, session: Session, middle: list[Message]) -> str:
        llm = self._llm_for(session)
        if not llm.model:
            raise AgentError("no LLM is configured")
        transcript = "\n\n".join(_transcript_line(m) for m in middle)
        request = CompletionRequest(
            model=llm.model,
            messages=[{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": transcript}],
        )
        parts = [e.text async for e in self._provider_for(llm).stream(request) if isinstance(e, TextDelta)]
        summary = "".join(parts).strip()
        if not summary:
            raise AgentError("the LLM returned an empty summary")
        return summary


def _count(
    counter: TokenCounter, prompt: str, tools: list[dict[str, Any]], history: list[Message]
) -> ContextUsage:
    """The usage of a conversation of `prompt`, `history` and `tools` (a pure function: runs on
    worker threads)."""
    written = [to_openai(m) for m in history if m.role == "assistant"]
    read = [{"role": "system", "content": prompt}, *(to_openai(m) for m in history if m.role != "assistant")]
    completion = counter.count_messages(written) if written else 0
    return ContextUsage(counter.count_messages(read) + counter.count_tools(tools), completion, len(history))


def _fallback(
    meter: Callable[[list[Message]], ContextUsage],
    head: list[Message],
    middle: list[Message],
    tail: list[Message],
    target: int,
) -> list[Message]:
    """No LLM: stub the old tool outputs, then drop the oldest turns (into the recent ones if
    need be, keeping the last) until the target is met."""
    groups = _turn_groups([_without_output(m) for m in middle]) + _turn_groups(tail)
    dropped = 0
    while len(groups) > 1 and meter([*head, *_flat(groups)]).total_tokens > target:
        dropped += len(groups.pop(0))
    note = [
        Message(role="user", content=f"[{dropped} earlier messages were removed to fit the context window]")
    ]
    return [*head, *(note if dropped else []), *_flat(groups)]


def _plan(
    history: list[Message], keep_recent: int
) -> tuple[list[Message], list[Message], list[Message]] | None:
    """(head, middle, tail): head ends with the first user message; tail starts at a turn boundary."""
    first_user = next((i for i, m in enumerate(history) if m.role == "user"), None)
    if first_user is None:
        return None
    start = max(len(history) - keep_recent, first_user + 1)
    while start < len(history) and history[start].role == "tool":
        start -= 1  # keep an assistant's tool calls together with their results
    if start <= first_user + 1:
        return None
    return history[: first_user + 1], history[first_user + 1 : start], history[start:]


def _summary_message(summary: str, count: int) -> Message:
    return Message(
        role="user",
        content=f"[Summary of {count} earlier messages, compacted to save context]\n{summary}",
        metadata={"compacted": "true"},
    )


def _transcript_line(message: Message) -> str:
    calls = "".join(f"\n  -> {c.name}({c.arguments})" for c in message.tool_calls)
    return f"{message.role}: {message.content}{calls}"


def _without_output(message: Message) -> Message:
    if message.role != "tool" or len(message.content) <= len(_STUB):
        return message
    return Message(
        role="tool",
        content=_STUB,
        tool_call_id=message.tool_call_id,
        name=message.name,
        metadata=message.metadata,
    )


def _turn_groups(messages: list[Message]) -> list[list[Message]]:
    """Messages grouped so an assistant's tool calls stay with their results."""
    groups: list[list[Message]] = []
    for message in messages:
        if message.role == "tool" and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def _flat(groups: list[list[Message]]) -> list[Message]:
    return [m for group in groups for m in group]
