"""Observability: tool metrics and cost summaries from the event log, queue statistics from the
lanes (the later dialect's GetToolMetrics, GetCostSummary, GetQueueStats; fields as its messages).

Tool calls and model use are read from the log (core/loop/accounting.py), so every replica answers
alike and the numbers survive a restart, as far back as the log's retention keeps entries. A
query over the whole server reads the log a page at a time. Queue statistics are live counts:
the replica running the session's generation answers (else this one), since it started."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from ..base.errors import InvalidArgument
from ..core.loop.accounting import Spending, ToolUse, spending_of, tool_use_of
from ..core.store.events import PAGE
from ..core.store.protocol import LogEntry
from ..runtime import Runtime
from .control import Control

_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


@dataclass
class ToolStats:
    tool_name: str
    total_calls: int = 0
    success_count: int = 0
    failure_count: int = 0
    total_duration_ms: int = 0
    min_duration_ms: int = 0
    max_duration_ms: int = 0
    avg_duration_ms: int = 0
    last_called_at: str = ""  # ISO 8601, UTC


@dataclass
class ToolMetrics:
    tools: list[ToolStats]
    total_calls: int
    total_duration_ms: int


@dataclass
class ModelCost:
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    call_count: int = 0


@dataclass
class DayCost:
    date: str  # YYYY-MM-DD, UTC
    cost_usd: float = 0.0
    call_count: int = 0
    total_tokens: int = 0


@dataclass
class CostSummary:
    total_cost_usd: float = 0.0
    total_prompt_tokens: int = 0
    total_completion_tokens: int = 0
    total_tokens: int = 0
    call_count: int = 0  # model calls
    by_model: list[ModelCost] = field(default_factory=list)
    by_day: list[DayCost] = field(default_factory=list)


@dataclass
class LaneStats:
    pending: int = 0
    active: int = 0
    external: int = 0  # tasks waiting for the host (CompleteExternalTask)
    completed: int = 0
    failed: int = 0


@dataclass
class QueueStats:
    control: LaneStats
    query: LaneStats
    execute: LaneStats
    generate: LaneStats
    dead_letters: int = 0  # nothing is dead-lettered here: a failed operation fails its call


class Observability:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def tool_metrics(self, session_id: str | None, tool_name: str | None) -> ToolMetrics:
        """Per tool (by the name the model called it), the calls the model made in the session and
        its subagents (None: in every session), or of `tool_name` only. NotFound for an unknown
        session."""
        tallies: dict[str, _Tally] = {}
        async for entry in self._entries(session_id):
            use = tool_use_of(entry)
            if use is not None and (not tool_name or use.name == tool_name):
                tallies.setdefault(use.name, _Tally()).add(use)
        tools = [tally.stats(name) for name, tally in sorted(tallies.items())]
        return ToolMetrics(tools, sum(t.total_calls for t in tools), sum(t.total_duration_ms for t in tools))

    async def cost_summary(
        self, session_id: str | None, model: str | None, start_date: str | None, end_date: str | None
    ) -> CostSummary:
        """Tokens and their cost (at the operator's prices) of the model calls of generations in
        the session and its subagents (None: in every session), of `model` only, on the days from `start_date` to
        `end_date` (YYYY-MM-DD, UTC, both included; None: unbounded)."""
        first, last = _day(start_date, "start_date"), _day(end_date, "end_date")
        summary = CostSummary()
        by_model: dict[str, ModelCost] = {}
        by_day: dict[str, DayCost] = {}
        async for entry in self._entries(session_id):
            spent = spending_of(entry)
            if spent is None or (model and spent.model != model):
                continue
            day = datetime.fromtimestamp(spent.timestamp / 1000, UTC).date()
            if (first and day < first) or (last and day > last):
                continue
            cost = self._cost(spent)
            tokens = spent.prompt_tokens + spent.completion_tokens
            summary.total_cost_usd += cost
            summary.total_prompt_tokens += spent.prompt_tokens
            summary.total_completion_tokens += spent.completion_tokens
            summary.total_tokens += tokens
            summary.call_count += spent.calls
            per_model = by_model.setdefault(spent.model, ModelCost(spent.model))
            per_model.prompt_tokens += spent.prompt_tokens
            per_model.completion_tokens += spent.completion_tokens
            per_model.total_tokens += tokens
            per_model.cost_usd += cost
            per_model.call_count += spent.calls
            per_day = by_day.setdefault(day.isoformat(), DayCost(day.isoformat()))
            per_day.cost_usd += cost
            per_day.call_count += spent.calls
            per_day.total_tokens += tokens
        summary.by_model = sorted(by_model.values(), key=lambda m: m.model)
        summary.by_day = sorted(by_day.values(), key=lambda d: d.date)
        return summary

    async def queue_stats(self, session_id: str) -> QueueStats:
        """Each lane of the session: NotFound for an unknown session."""
        lanes = {
            lane: LaneStats(**counts)
            for lane, counts in (await Control(self._rt).lane_stats(session_id)).items()
        }
        return QueueStats(lanes["control"], lanes["query"], lanes["execute"], lanes["generate"])

    def _cost(self, spent: Spending) -> float:
        price = self._rt.settings.model_prices.get(spent.model)
        return 0.0 if price is None else price.cost(spent.prompt_tokens, spent.completion_tokens)

    async def _entries(self, session_id: str | None) -> AsyncIterator[LogEntry]:
        """The retained log of the session and of its subagents' sessions, at any depth (None: of
        every session), a page at a time."""
        store = self._rt.store
        if session_id:
            await self._rt.sessions.refresh(session_id)
            self._rt.sessions.get(session_id)  # NotFound
            await self._rt.sessions.refresh_all()  # (on a shared store: children other replicas made)
            line = [session_id]
            while line:
                session_id = line.pop(0)
                line += [child.id for child in self._rt.sessions.children(session_id)]
                after = 0
                while page := await store.read_log(session_id, after, PAGE):
                    for entry in page:
                        yield entry
                    after = page[-1].seq
        else:
            after = 0
            while page := await store.read_log_since(after, PAGE):
                for entry in page:
                    yield entry
                after = page[-1].id


@dataclass
class _Tally:
    """One tool's calls so far (running sums: a whole-server query keeps no list of calls)."""

    calls: int = 0
    succeeded: int = 0
    total_ms: float = 0.0
    min_ms: float = math.inf
    max_ms: float = 0.0
    last_started: int = 0

    def add(self, use: ToolUse) -> None:
        self.calls += 1
        self.succeeded += use.success
        self.total_ms += use.duration_ms
        self.min_ms, self.max_ms = min(self.min_ms, use.duration_ms), max(self.max_ms, use.duration_ms)
        self.last_started = max(self.last_started, use.started)

    def stats(self, name: str) -> ToolStats:
        return ToolStats(
            tool_name=name,
            total_calls=self.calls,
            success_count=self.succeeded,
            failure_count=self.calls - self.succeeded,
            total_duration_ms=round(self.total_ms),
            min_duration_ms=round(self.min_ms),
            max_duration_ms=round(self.max_ms),
            avg_duration_ms=round(self.total_ms / self.calls),
            last_called_at=datetime.fromtimestamp(self.last_started / 1000, UTC).isoformat(
                timespec="milliseconds"
            ),
        )


def _day(value: str | None, name: str) -> date | None:
    if not value:
        return None
    try:
        if not _DATE.fullmatch(value):
            raise ValueError
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(f"{name} must be a date as YYYY-MM-DD, not {value[:40]!r}") from None
