"""Context accounting and compaction.

Usage is counted offline with tiktoken over the conversation as it will next be sent (system
prompt, live history, tool schemas). Compaction works to a token budget: afterwards the whole
prompt (system prompt with loaded skills' instructions, tool schemas, pinned messages, summary and
recent messages) is at most the session's target share of the window. Pinned are the messages up to
the first user task and any message with metadata `pinned: "true"`; the most recent turns are kept
while they fit (an assistant's tool calls stay with their results; a turn too large to keep whole is
cut with a marker) and the older ones are replaced by a summary the LLM writes. The summary is
produced first and the new history replaces the old in one store transaction; when the LLM cannot
summarise, a deterministic fallback (old tool outputs stubbed, oldest turns dropped) takes its place.
Automatic compaction runs past the threshold only; one a client asks for also summarises a session
within the budget, all but its newest turns (RECENT_ON_REQUEST).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ...base.errors import AgentError, FailedPrecondition, InvalidArgument
from ...base.models import Message
from ...llm.json_body import JSONText, fixed_json
from ...llm.messages import to_openai, tool_schema
from ...llm.provider import CompletionRequest, TextDelta, TurnEnd
from ...llm.tokens import MESSAGE_OVERHEAD, REPLY_PRIMING, TokenCounter
from ..sessions.manager import SessionManager
from ..store.events import EventBus, EventType, event_entry
from ..store.session import Session
from . import meters
from .budget import budget_spent
from .host import AgentHost

DEFAULT_WINDOW = 128_000
DEFAULT_THRESHOLD = 0.8
DEFAULT_TARGET = 0.5
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
MAX_SUMMARY_TOKENS = 4_000  # the most a summary may take of the budget
TRANSCRIPT_MESSAGE_CHARS = 4_000  # each message as the summariser reads it, cut beyond
SUMMARY_WINDOW_SHARE = 0.6  # of the window, what one summary request (transcript part) may fill
RECENT_ON_REQUEST = 4
"""A compaction a client asks for (CompactContext) keeps at most this many newest turns (the last
two exchanges of a chat, the last four steps of a tool loop) and summarises the rest."""
PINNED = "pinned"  # message metadata `pinned: "true"` keeps a message through every compaction
COMPACTION = "compaction"  # message metadata naming what compaction wrote: "summary" or "note"
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
    estimated: bool = False
    """Counted chars/4 while the tokenizer was being loaded (`ContextManager.shown_usage`)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Compaction:
    before: ContextUsage
    after: ContextUsage
    summarized_by: str  # "llm", "fallback", "cut" (nothing to summarise, a turn cut) or "" (nothing done)
    summary: str = ""  # the text of the summary (or fallback note) now in the history


@dataclass
class _Plan:
    """Which groups of the history stay and where the summary goes."""

    head: list[Message]  # up to the first user task: pinned
    groups: list[list[Message]]  # the rest, an assistant's tool calls grouped with their results
    pinned: set[int]  # indices of groups kept whatever happens
    start: int  # groups from here on (not pinned) are the recent part; before it, summarised
    cut: dict[int, list[Message]]  # recent groups too large to keep whole, cut to fit

    def middle(self) -> list[Message]:
        return [m for i, g in enumerate(self.groups[: self.start]) if i not in self.pinned for m in g]

    def kept(self, summary: list[Message]) -> list[Message]:
        older = [m for i in sorted(self.pinned) if i < self.start for m in self.groups[i]]
        recent = [m for i in range(self.start, len(self.groups)) for m in self.cut.get(i, self.groups[i])]
        return [*self.head, *older, *summary, *recent]


class ContextManager:
    def __init__(
        self,
        sessions: SessionManager,
        events: EventBus,
        *,
        host: AgentHost,
        threshold: float = DEFAULT_THRESHOLD,
        target: float = DEFAULT_TARGET,
    ) -> None:
        self._sessions = sessions
        self._events = events
        self._host = host
        self.threshold = threshold
        self.target = target

    def window(self, session: Session) -> int:
        return session.config.max_context_length or model_window(self._host.llm_for(session).model)

    def shares(self, session: Session) -> tuple[float, float]:
        """(threshold, target) of `session`: its own settings, else the server's."""
        own = session.settings.compaction
        return float(own.get("threshold", self.threshold)), float(own.get("target", self.target))

    def checked_settings(self, current: Mapping[str, float], given: Mapping[str, float]) -> dict[str, float]:
        """A session's compaction settings after `given` (from a request) changes `current`;
        InvalidArgument when the target would not lie below the threshold."""
        merged = {**current, **given}
        threshold, target = merged.get("threshold", self.threshold), merged.get("target", self.target)
        if target >= threshold:
            raise InvalidArgument(
                f"the compaction target ({target:g}) must be below the compaction threshold ({threshold:g})"
            )
        return merged

    def counter(self, session: Session) -> TokenCounter:
        return TokenCounter(self._host.llm_for(session).model)

    async def usage(self, session_id: str) -> ContextUsage:
        session = self._sessions.get(session_id)
        return await self.measure(session, await self._sessions.history(session_id))

    async def shown_usage(self, session_id: str) -> ContextUsage:
        """The usage a session reply shows (CreateSession, GetSession, ConfigureSession): exact,
        except while the session's tokenizer is being loaded (by the warm-up right after ready, or
        another call): then counted chars/4 and marked `estimated`, so the reply does not wait for
        that load. What decides (GetContextUsage, compaction, token budgets, generation) counts
        exactly or by a bound that settles it (`over_threshold`)."""
        session = self._sessions.get(session_id)
        history = await self._sessions.history(session_id)
        counter = self.counter(session)
        if not counter.loading:
            return await self.measure(session, history)
        rough = TokenCounter(counter.model, approximate=True)
        return replace(await asyncio.to_thread(self._meter(session, rough), history), estimated=True)

    def _meter(
        self, session: Session, counter: TokenCounter | None = None
    ) -> Callable[[list[Message]], ContextUsage]:
        """What measures a history of `session` (with `counter`, else the session's own), safe to
        call off the event loop (the system prompt and tool schemas are taken now, on it)."""
        schemas = [tool_schema(t) for t in self._host.tools_for(session)]
        return partial(
            _count,
            counter or self.counter(session),
            self._host.prompt_for(session),
            schemas,
            fixed_json(schemas),
        )

    async def measure(self, session: Session, history: list[Message]) -> ContextUsage:
        """The usage of `history`, counted on a worker thread: counting megabytes takes seconds,
        which the event loop (every other caller) must not wait for. An empty history (a new
        session's) is counted here once the tokenizer is loaded: only the system prompt and the
        tool schemas are left to count, and their counts are kept from the first time."""
        counter = self.counter(session)
        meter = self._meter(session, counter)
        if not history and counter.loaded:
            return meter(history)
        return await asyncio.to_thread(meter, history)

    async def over_threshold(self, session: Session, history: list[Message]) -> bool:
        """Whether `history` is past the session's compaction threshold. A bound by UTF-8 bytes
        (`byte_bound`) settles it at once for a conversation far from the threshold: no tokenizer,
        no worker thread, nothing to wait for while the tokenizer loads. The exact count decides
        the rest."""
        threshold, _ = self.shares(session)
        limit = threshold * self.window(session)
        tools = fixed_json([tool_schema(t) for t in self._host.tools_for(session)]).text
        if byte_bound(self._host.prompt_for(session), tools, history, limit) is not None:
            return False
        return (await self.measure(session, history)).total_tokens > limit

    async def compact(
        self, session_id: str, *, requested: bool = False, overflowed: bool = False
    ) -> Compaction:
        """Compact now: before a model call past the threshold, with `overflowed` after the provider
        refused a prompt our count thought fitted (then to the target share of what was refused,
        too), or `requested` by a client (CompactContext): then also a session within the target,
        all but its RECENT_ON_REQUEST newest turns summarised; nothing is done when nothing older
        is left but an earlier summary. FailedPrecondition when the pinned content alone is over
        the budget."""
        session = self._sessions.get(session_id)
        history = await self._sessions.history(session_id)
        meter = self._meter(session)
        counter = self.counter(session)
        before = await asyncio.to_thread(meter, history)
        window = self.window(session)
        _, share = self.shares(session)
        budget = int(share * window)
        if overflowed:
            budget = min(budget, int(share * before.total_tokens))
        within = before.total_tokens <= budget
        if within and not requested:
            return Compaction(before, before, "")
        room = budget - (await asyncio.to_thread(meter, [])).total_tokens - REPLY_PRIMING
        cost = partial(_cost, counter)
        reserve = min(MAX_SUMMARY_TOKENS, max(room // 4, 0))
        plan = await asyncio.to_thread(_plan, history, cost, room, reserve, budget)
        if requested:
            plan.start = max(plan.start, len(plan.groups) - RECENT_ON_REQUEST)
        middle = plan.middle()
        if within and all(COMPACTION in m.metadata for m in middle):  # nothing new to summarise
            return Compaction(before, before, "")
        if not middle:
            kept, how, summary = plan.kept([]), "cut", ""
        else:
            try:
                summary = await self._summarize(session, counter, middle, window, reserve)
                note = _summary_message(summary, len(middle))
                kept, how = plan.kept([note]), "llm"
            except AgentError as exc:
                self._events.publish(
                    EventType.WARNING, session_id, f"summary failed, compacting without it: {exc}"
                )
                kept, how = await asyncio.to_thread(_fallback, plan, cost, room, budget), "fallback"
                summary = next((m.content for m in kept if m.metadata.get(COMPACTION) == "note"), "")
        kept = await asyncio.to_thread(_trimmed, kept, meter, budget)
        after = await asyncio.to_thread(meter, kept)
        compacted = event_entry(
            EventType.INFO, session_id, "context_compacted",
            {"before_tokens": before.total_tokens, "after_tokens": after.total_tokens,
             "before_messages": before.message_count, "after_messages": after.message_count,
             "by": how, "summary": summary},
        )  # fmt: skip
        await self._sessions.replace_history(session_id, kept, [compacted])
        meters.compaction(requested, overflowed, how)
        return Compaction(before, after, how, summary)

    async def _summarize(
        self, session: Session, counter: TokenCounter, middle: list[Message], window: int, reserve: int
    ) -> str:
        """The LLM's summary of `middle`, read in parts that each fit the window (each part's
        summary carries the one before)."""
        llm = self._host.llm_for(session)
        if not llm.model:
            raise AgentError("no LLM is configured")
        if reserve <= 0:
            raise AgentError("no room is left for a summary")
        part_tokens = max(int(SUMMARY_WINDOW_SHARE * window) - 2 * reserve, 1_000)
        parts = await asyncio.to_thread(_transcript_parts, counter, middle, part_tokens)
        summary = ""
        for part in parts:
            current = self._sessions.get(session.id)
            spent = budget_spent(current, self._host.token_budget_for(current))
            if spent is not None:  # a summary is a model call as any other
                raise AgentError(spent.message)
            earlier = f"Summary of the conversation so far:\n{summary}\n\nIt went on:\n\n" if summary else ""
            request = CompletionRequest(
                model=llm.model,
                messages=[
                    {"role": "system", "content": SUMMARY_PROMPT},
                    {"role": "user", "content": earlier + part},
                ],
                max_tokens=reserve,
            )
            pieces: list[str] = []
            async for event in self._host.provider_for(llm).stream(request):
                if isinstance(event, TextDelta):
                    pieces.append(event.text)
                elif isinstance(event, TurnEnd) and event.usage is not None:  # billed as any model turn
                    await self._sessions.append_messages(session.id, [], usage=event.usage)
            summary = "".join(pieces).strip()
            if not summary:
                raise AgentError("the LLM returned an empty summary")
        return await asyncio.to_thread(_cut_text, counter, summary, reserve)


def _count(
    counter: TokenCounter,
    prompt: str,
    tools: list[dict[str, Any]],
    tools_json: JSONText,
    history: list[Message],
) -> ContextUsage:
    """The usage of a conversation of `prompt`, `history` and `tools` (`tools_json`: their JSON,
    kept) (a pure function: runs on worker threads)."""
    written = [to_openai(m) for m in history if m.role == "assistant"]
    read = [{"role": "system", "content": prompt}, *(to_openai(m) for m in history if m.role != "assistant")]
    completion = counter.count_messages(written) if written else 0
    tools_count = counter.count_tools(tools, tools_json.text)
    return ContextUsage(counter.count_messages(read) + tools_count, completion, len(history))


_BOUND_MESSAGES = 2_000
"""The most messages `byte_bound` looks at (about a millisecond of the event loop's time)."""
_ROLE_AND_PREFIX = len("assistant") + len("[tool output]\n")
"""The longest role a message is counted with, and the prefix of a tool result sent without its
call's id (llm/messages.py `to_openai`)."""


def _utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def byte_bound(prompt: str, tools_json: str, history: list[Message], limit: float) -> int | None:
    """An upper bound of `_count(...).total_tokens` for `prompt`, the tool schemas as JSON text and
    `history` when it is at most `limit`, else None (also for a history with attachments, whose
    images are counted by their size, or longer than _BOUND_MESSAGES). Every text counted is
    bounded by its UTF-8 bytes (a byte-level BPE token stands for at least one byte; the
    ASCII-escaped JSON of the schemas is no shorter than the text counted); each message adds its
    overhead and the longest role and prefix it could be counted with."""
    if len(history) > _BOUND_MESSAGES:
        return None
    total = 2 * REPLY_PRIMING + MESSAGE_OVERHEAD + len("system") + _utf8_bytes(prompt) + len(tools_json)
    for message in history:
        if message.attachments or total > limit:
            return None
        total += MESSAGE_OVERHEAD + _ROLE_AND_PREFIX + _utf8_bytes(message.content)
        total += _utf8_bytes(message.tool_call_id or message.metadata.get("tool_call_id", ""))
        for call in message.tool_calls:
            total += _utf8_bytes(call.name) + _utf8_bytes(call.arguments)
    return total if total <= limit else None


def _cost(counter: TokenCounter, messages: list[Message]) -> int:
    """Tokens `messages` add to a conversation (counts per message add up)."""
    return sum(counter.count_message(to_openai(m)) for m in messages)


def _plan(
    history: list[Message], cost: Callable[[list[Message]], int], room: int, reserve: int, budget: int
) -> _Plan:
    """What stays: the pinned content, then the newest turns within `room` less the summary's
    `reserve` (the newest turn always, cut if need be)."""
    first_user = next((i for i, m in enumerate(history) if m.role == "user"), -1)
    head = history[: first_user + 1]
    groups = _turn_groups(history[first_user + 1 :])
    pinned = {i for i, g in enumerate(groups) if any(m.metadata.get(PINNED) == "true" for m in g)}
    pinned_tokens = cost(head) + sum(cost(groups[i]) for i in pinned)
    if pinned_tokens > room:
        raise FailedPrecondition(
            f"the pinned content does not fit: the system prompt, tool schemas, first task and pinned"
            f" messages take {budget - room + pinned_tokens} tokens, more than the compaction target of"
            f" {budget} tokens; unpin messages, unload skills, or raise max_context_length or the target"
        )
    plan = _Plan(head, groups, pinned, len(groups), {})
    left = room - pinned_tokens - reserve
    for index in range(len(groups) - 1, -1, -1):
        if index in pinned:
            plan.start = index
            continue
        size = cost(groups[index])
        if size > left:
            if index == len(groups) - 1:  # the newest turn stays, cut to what is left
                plan.cut[index] = _cut_group(groups[index], cost, max(left, 0))
                plan.start = index
            break
        left -= size
        plan.start = index
    return plan


def _fallback(plan: _Plan, cost: Callable[[list[Message]], int], room: int, budget: int) -> list[Message]:
    """No summary: the turns the summary would have covered lose their tool outputs and, oldest
    first, as many as do not fit; a note says how many messages went."""
    older = [g if i in plan.pinned else [_without_output(m) for m in g] for i, g in enumerate(plan.groups)]
    recent = [plan.cut.get(i, g) for i, g in enumerate(plan.groups)]
    groups = older[: plan.start] + recent[plan.start :]
    note = _note(len(plan.middle()))
    rest = _plan([*plan.head, *(m for g in groups for m in g)], cost, room, cost([note]), budget)
    dropped = len(rest.middle())
    return rest.kept([_note(dropped)] if dropped else [])


def _note(dropped: int) -> Message:
    text = f"[{dropped} earlier messages were removed to fit the context window; no summary could be made]"
    return Message(role="user", content=text, metadata={COMPACTION: "note"})


def _trimmed(
    kept: list[Message], meter: Callable[[list[Message]], ContextUsage], budget: int
) -> list[Message]:
    """`kept` is planned with per-message counts; should the whole count still exceed the budget,
    drop the oldest unpinned messages after the head (never the newest turn) until it fits."""
    while meter(kept).total_tokens > budget:
        first_user = next((i for i, m in enumerate(kept) if m.role == "user"), -1)
        groups = _turn_groups(kept[first_user + 1 :])
        droppable = next(
            (i for i, g in enumerate(groups[:-1]) if not any(_kept_always(m) for m in g)),
            None,
        )
        if droppable is None:
            break
        del groups[droppable]
        kept = [*kept[: first_user + 1], *(m for g in groups for m in g)]
    return kept


def _kept_always(message: Message) -> bool:
    return message.metadata.get(PINNED) == "true" or COMPACTION in message.metadata


def _cut_group(group: list[Message], cost: Callable[[list[Message]], int], room: int) -> list[Message]:
    """`group` with its largest contents cut (marked) until it fits `room` tokens, as near as can be."""
    group = list(group)
    originals = [m.content for m in group]
    keeps = [len(text) for text in originals]
    for _ in range(8):
        over = cost(group) - room
        index = max(range(len(group)), key=keeps.__getitem__)
        if over <= 0 or keeps[index] == 0:
            break
        tokens = max(cost([group[index]]), 1)
        keep = max(int(keeps[index] * (tokens - over) / tokens * 0.9) - 40, 0)
        keeps[index] = keep if keep < keeps[index] else keeps[index] // 2
        text = originals[index]
        marker = f"\n[… cut: {len(text) - keeps[index]} of {len(text)} characters removed to fit the context window]"
        group[index] = replace(group[index], content=text[: keeps[index]] + marker)
    return group


def _cut_text(counter: TokenCounter, text: str, tokens: int) -> str:
    """`text` within `tokens` (a summary longer than asked for), cut with a marker."""
    if counter.count_text(text) <= tokens:
        return text
    keep = len(text) * tokens // max(counter.count_text(text), 1) * 9 // 10
    return text[:keep] + "\n[… summary cut to fit the context window]"


def _transcript_parts(counter: TokenCounter, middle: list[Message], tokens: int) -> list[str]:
    """The transcript of `middle` in parts of at most about `tokens` tokens."""
    parts: list[list[str]] = [[]]
    size = 0
    for message in middle:
        line = _transcript_line(message)
        line_tokens = counter.count_text(line)
        if parts[-1] and size + line_tokens > tokens:
            parts.append([])
            size = 0
        parts[-1].append(line)
        size += line_tokens
    return ["\n\n".join(lines) for lines in parts]


def _summary_message(summary: str, count: int) -> Message:
    return Message(
        role="user",
        content=f"[Summary of {count} earlier messages, compacted to save context]\n{summary}",
        metadata={COMPACTION: "summary"},
    )


def _transcript_line(message: Message) -> str:
    content = message.content
    if len(content) > TRANSCRIPT_MESSAGE_CHARS:
        cut = len(content) - TRANSCRIPT_MESSAGE_CHARS
        content = f"{content[:TRANSCRIPT_MESSAGE_CHARS]} [… {cut} characters not shown]"
    calls = "".join(f"\n  -> {c.name}({c.arguments[:TRANSCRIPT_MESSAGE_CHARS]})" for c in message.tool_calls)
    return f"{message.role}: {content}{calls}"


def _without_output(message: Message) -> Message:
    if message.role != "tool" or len(message.content) <= len(_STUB):
        return message
    return replace(message, content=_STUB)


def _turn_groups(messages: list[Message]) -> list[list[Message]]:
    """Messages grouped so an assistant's tool calls stay with their results."""
    groups: list[list[Message]] = []
    for message in messages:
        if message.role == "tool" and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups
