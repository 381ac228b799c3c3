"""Memories: what a session (or its model) keeps for later, as A3S's memory group has them, and the
one check of a memory wherever it comes from (StoreMemory, the `remember` tool, a summary).

A memory is shared by every session of its workspace (long-term), except a working memory, which
only the session that stored it sees. Its session's short-term memory is the memories it stored
itself and has not cleared from it (they stay long-term). core/store/memories.py keeps them.
"""

from __future__ import annotations

import enum
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .errors import InvalidArgument
from .secret_text import secret_kind

MAX_CONTENT_CHARS = 8_000
MAX_TAGS = 20
MAX_TAG_CHARS = 64
MAX_METADATA = 20
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 1_000
MAX_ID_CHARS = 100
DEFAULT_LIMIT = 10
MAX_LIMIT = 100
"""The most memories one search answers with (`total_count` says how many matched)."""
MAX_PROMPT_MEMORIES = 10
"""The most memories a system prompt is offered (MemorySettings.prompt)."""


class MemoryType(enum.IntEnum):
    """Numbers match the wire enum MemoryType (0, unknown, is taken for episodic)."""

    EPISODIC = 1
    SEMANTIC = 2
    PROCEDURAL = 3
    WORKING = 4

    @classmethod
    def named(cls, name: str, where: str) -> MemoryType:
        """`episodic`, `EPISODIC` or `MEMORY_TYPE_EPISODIC`; InvalidArgument naming `where` otherwise."""
        key = name.strip().upper().removeprefix("MEMORY_TYPE_")
        if key not in cls.__members__:
            raise InvalidArgument(
                f"{where} must be one of {', '.join(t.name.lower() for t in cls)}, not {name[:40]!r}"
            )
        return cls[key]


@dataclass
class Memory:
    id: str
    content: str
    memory_type: MemoryType = MemoryType.EPISODIC
    importance: float = 0.5
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: int = 0  # ms since the epoch
    access_count: int = 0
    last_accessed: int | None = None  # ms since the epoch
    session_id: str = ""  # the session that stored it


@dataclass(frozen=True)
class MemoryScope:
    """What a session sees: the shared memories of its workspace and its own working memories."""

    workspace: str
    session_id: str


@dataclass(frozen=True)
class MemoryQuery:
    """A search: memories matching any word of `text` (all when empty), carrying any of `tags`, of
    one of `types`, at least `min_importance`, stored at or after `since` (ms); `recent_only`
    keeps the session's own short-term and working memories, newest first."""

    text: str = ""
    tags: tuple[str, ...] = ()
    types: tuple[MemoryType, ...] = ()
    min_importance: float | None = None
    since: int | None = None
    recent_only: bool = False
    limit: int = DEFAULT_LIMIT


@dataclass(frozen=True)
class MemoryStats:
    long_term: int
    short_term: int
    working: int


@dataclass(frozen=True)
class MemorySettings:
    """What a session's model gets of memories: the `remember` and `recall` tools (`tools`), and
    the `prompt` memories most relevant to each request in its system prompt (0: none). Off unless
    the operator (--memory) or the session (`a3s-memory`) turns them on."""

    tools: bool = False
    prompt: int = 0

    @classmethod
    def parse(cls, text: str, where: str) -> MemorySettings:
        """`off`, `tools`, `prompt=N` (N up to MAX_PROMPT_MEMORIES), or both comma-separated
        (`tools,prompt=5`); InvalidArgument naming `where` otherwise."""
        tools, prompt = False, 0
        for part in (p.strip().lower() for p in text.split(",")):
            name, _, value = part.partition("=")
            if part == "tools":
                tools = True
            elif name == "prompt" and value.isdigit() and int(value) <= MAX_PROMPT_MEMORIES:
                prompt = int(value)
            elif part != "off" or "," in text:
                raise InvalidArgument(
                    f"{where} must be off, tools, prompt=N (N up to {MAX_PROMPT_MEMORIES}) or"
                    f" tools,prompt=N; not {text[:50]!r}"
                )
        return cls(tools, prompt)

    def __str__(self) -> str:
        parts = [*(["tools"] if self.tools else []), *([f"prompt={self.prompt}"] if self.prompt else [])]
        return ",".join(parts) or "off"


def checked_memory(
    content: str,
    importance: float,
    tags: Sequence[str],
    metadata: Mapping[str, str],
    where: str = "memory",
) -> tuple[str, list[str], dict[str, str]]:
    """The content, tags and metadata as kept (stripped, tags once each), or InvalidArgument naming
    the field at fault: a secret (a key, a token, a password) is refused, never kept."""
    content = content.strip()
    if not content:
        raise InvalidArgument(f"{where}.content is empty")
    if len(content) > MAX_CONTENT_CHARS:
        raise InvalidArgument(f"{where}.content has {len(content)} characters; at most {MAX_CONTENT_CHARS}")
    _check_text(content, f"{where}.content")
    if not math.isfinite(importance) or not 0.0 <= importance <= 1.0:
        raise InvalidArgument(f"{where}.importance must be between 0 and 1, not {importance}")
    if len(tags) > MAX_TAGS:
        raise InvalidArgument(f"{where}.tags has {len(tags)} tags; at most {MAX_TAGS}")
    kept_tags = list(dict.fromkeys(checked_tag(tag, f"{where}.tags[{i}]") for i, tag in enumerate(tags)))
    if len(metadata) > MAX_METADATA:
        raise InvalidArgument(f"{where}.metadata has {len(metadata)} entries; at most {MAX_METADATA}")
    for key, value in metadata.items():
        if not key.strip() or len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidArgument(f"{where}.metadata keys must have 1 to {MAX_METADATA_KEY_CHARS} characters")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise InvalidArgument(
                f"{where}.metadata[{key[:40]!r}] has {len(value)} characters; at most {MAX_METADATA_VALUE_CHARS}"
            )
        _check_text(key, f"{where}.metadata key {key[:40]!r}")
        _check_text(f"{key}={value}", f"{where}.metadata[{key[:40]!r}]")
    return content, kept_tags, dict(metadata)


def checked_tag(tag: str, where: str) -> str:
    tag = tag.strip()
    if not tag or len(tag) > MAX_TAG_CHARS:
        raise InvalidArgument(f"{where} must have 1 to {MAX_TAG_CHARS} characters")
    _check_text(tag, where)
    return tag


def checked_limit(limit: int, where: str) -> int:
    """`limit` (0: the default) or InvalidArgument when it is over MAX_LIMIT."""
    if limit > MAX_LIMIT:
        raise InvalidArgument(f"{where} is {limit}; at most {MAX_LIMIT} memories are answered at once")
    return limit or DEFAULT_LIMIT


def checked_id(memory_id: str, where: str = "memory_id") -> str:
    if not memory_id:
        raise InvalidArgument(f"{where} is required")
    if len(memory_id) > MAX_ID_CHARS or not memory_id.isprintable():
        raise InvalidArgument(f"{where} is not a memory id (at most {MAX_ID_CHARS} printable characters)")
    return memory_id


def _check_text(text: str, where: str) -> None:
    """No NUL nor other control characters but newlines and tabs (a store's text cannot hold NUL),
    and nothing that looks like a secret."""
    if any(unicodedata.category(c) == "Cc" and c not in "\n\t\r" for c in text):
        raise InvalidArgument(f"{where} holds a control character")
    kind = secret_kind(text)
    if kind is not None:
        raise InvalidArgument(
            f"{where} looks like it holds a secret ({kind}): memories never keep keys, tokens or passwords"
        )
