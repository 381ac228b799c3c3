"""The memories a store keeps (base/memories.py says what a memory is and who sees it), and how a
search ranks them, the same on both stores.

Ranking: score = TEXT_WEIGHT * text + (1 - TEXT_WEIGHT) * (IMPORTANCE_WEIGHT * importance +
(1 - IMPORTANCE_WEIGHT) * recency), where `text` is the full-text rank of the query's words mapped
into [0, 1) (rank / (rank + 1); 0 without a query), and recency = exp(-age in days / DECAY_DAYS),
as A3S's memory relevance (importance 0.7, recency 0.3, 30 days). SQLite ranks text with FTS5's
bm25 (the porter stemmer), PostgreSQL with ts_rank_cd over an English tsvector: the numbers differ,
the order of the terms in the formula does not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...base.errors import ResourceExhausted
from ...base.memories import Memory, MemoryQuery, MemoryScope, MemoryStats, MemoryType
from .protocol import LogEntry

TEXT_WEIGHT = 0.5
IMPORTANCE_WEIGHT = 0.7
DECAY_DAYS = 30.0
DAY_MS = 86_400_000
MAX_QUERY_WORDS = 32
_WORD = re.compile(r"\w+")


STOP_WORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "him",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "just",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "out",
        "she",
        "so",
        "some",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "to",
        "up",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)
"""Words too common to search by (PostgreSQL's English configuration drops its own too)."""


def query_words(text: str) -> list[str]:
    """The words of a search's text (letters, digits, underscores) but STOP_WORDS, the first
    MAX_QUERY_WORDS once each: each is matched as a word of its own, so no text is ever read as
    query syntax. A search whose text has none of them matches nothing."""
    words = (word.lower() for word in _WORD.findall(text))
    return list(dict.fromkeys(word for word in words if word not in STOP_WORDS))[:MAX_QUERY_WORDS]


COLUMNS = (
    "m.id, m.content, m.memory_type, m.importance, m.tags, m.metadata, m.created_at,"
    " m.access_count, m.last_accessed, m.session_id"
)
"""What `memory_from_row` reads, of the table `memories` as `m`."""


def memory_from_row(row: Sequence[Any]) -> Memory:
    """A Memory from the columns COLUMNS names (tags a list, or its JSON on SQLite)."""
    tags = row[4] if isinstance(row[4], list) else json.loads(row[4])
    return Memory(
        id=row[0],
        content=row[1],
        memory_type=MemoryType(row[2]),
        importance=float(row[3]),
        tags=list(tags),
        metadata=json.loads(row[5]),
        created_at=int(row[6]),
        access_count=int(row[7]),
        last_accessed=None if row[8] is None else int(row[8]),
        session_id=row[9],
    )


def common_filters(query: MemoryQuery, mark: Callable[[str], str]) -> tuple[list[str], dict[str, Any]]:
    """The conditions (on `m`) and parameters both stores write alike: recent_only (the session,
    as parameter `session`, stored them), min_importance and since; `mark` writes a parameter."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    if query.recent_only:
        conditions.append(f"(m.short_term_of = {mark('session')} OR m.private_to = {mark('session')})")
    if query.min_importance is not None:
        params["min_importance"] = query.min_importance
        conditions.append(f"m.importance >= {mark('min_importance')}")
    if query.since is not None:
        params["since"] = query.since
        conditions.append(f"m.created_at >= {mark('since')}")
    return conditions, params


def score(query: MemoryQuery, text: str, recency: str) -> str:
    """The expression a search orders by (descending): newest first for `recent_only`, else the
    formula above over the text rank and recency expressions given."""
    if query.recent_only:
        return "m.created_at"
    standing = f"({IMPORTANCE_WEIGHT} * m.importance + {1 - IMPORTANCE_WEIGHT} * {recency})"
    return f"{TEXT_WEIGHT} * {text} + {1 - TEXT_WEIGHT} * {standing}"


@dataclass(frozen=True)
class Bounds:
    """How many memories a store keeps: in a workspace (shared ones), in a session's working
    memory (the least important, then oldest, make room), in its short-term memory (the oldest
    leave it and stay long-term)."""

    per_workspace: int  # Settings.max_memories
    working: int = 10
    short_term: int = 100


def full(scope: MemoryScope, bounds: Bounds) -> ResourceExhausted:
    return ResourceExhausted(
        f"the workspace {scope.workspace} holds its maximum of {bounds.per_workspace} memories;"
        " delete or clear some first"
    )


class MemoryTable(Protocol):
    """Each call is one transaction; `log`: the entries that report the change, in its transaction."""

    async def add(self, scope: MemoryScope, memory: Memory, bounds: Bounds, log: Sequence[LogEntry]) -> None:
        """Keep a new memory (a working one only for the scope's session); ResourceExhausted
        (`full`, nothing written) when the workspace holds `bounds.per_workspace` shared memories."""

    async def get(self, scope: MemoryScope, memory_id: str, now: int) -> Memory | None:
        """A memory the scope sees, counted as accessed at `now` (ms); None when there is none."""

    async def touch(self, ids: Sequence[str], now: int) -> None:
        """Count the memories as accessed at `now` (ms)."""

    async def search(self, scope: MemoryScope, query: MemoryQuery, now: int) -> tuple[list[Memory], int]:
        """The best `query.limit` memories the scope sees, best first, and how many matched."""

    async def delete(self, scope: MemoryScope, memory_id: str) -> bool:
        """Remove a memory the scope sees; False when there is none."""

    async def clear(self, scope: MemoryScope, long_term: bool, short_term: bool, working: bool) -> int:
        """Remove the workspace's shared memories (`long_term`), take the session's out of its
        short-term memory (they stay long-term), remove its working memories; how many memories
        were touched, each once."""

    async def stats(self, scope: MemoryScope) -> MemoryStats:
        """How many memories are long-term (shared), in the session's short-term and working memory."""
