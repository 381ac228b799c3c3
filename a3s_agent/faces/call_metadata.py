"""The `a3s-*` call metadata, for what the A3S messages have no field for: gRPC request and
trailing metadata, HTTP request and response headers of the same names (both faces use this).

CreateSession and ConfigureSession read `a3s-config-mode` (`merge`, the default, or `replace`:
the request's config replaces the session's, so false and empty values count), the compaction
shares `a3s-compact-threshold` and `a3s-compact-target`, `a3s-token-budget` (the session's
cap on its total tokens, 0: none), `a3s-mcp-servers` (its own MCP servers: JSON of the
mcpServers shape; `{}` drops them) and `a3s-memory` (what its model gets of memories: off,
tools, prompt=N or tools,prompt=N; base/memories.py MemorySettings). Their replies and
GetSession's carry the session's effective compaction shares, token budget and memory settings
and its usage so far (`session_metadata`), a subagent's session its parent link
(`a3s-parent-session-id`, `a3s-parent-tool-call-id`, `a3s-agent`), and, while the
server's tokenizer is still loading (right after start), `a3s-usage-estimated: true`: the session's
context_usage was then counted as characters / 4 (GetContextUsage always waits for the exact count).

ListSessions pages by `a3s-page-size` (1..MAX_PAGE_SIZE, default MAX_PAGE_SIZE) and
`a3s-page-token` (from a previous reply); when more sessions follow, the reply carries
`a3s-next-page-token`. Sessions come oldest first, so a page token stays valid while sessions
are created and destroyed.

ClearContext with `a3s-rewind-to: <checkpoint>` rewinds the session to before that checkpoint
instead of clearing it (app/checkpoints.py): the conversation, and the files unless
`a3s-rewind-files: keep`; `a3s-force: true` overwrites files someone else changed. Its reply
carries `a3s-undo-checkpoint` (the checkpoint of the state before: rewinding to it undoes this)
and `a3s-files-restored`. CreateSession with `a3s-fork-from: <session id>:<checkpoint>` forks
that session at that checkpoint instead of making an empty one: the fork takes the session's
config (the request's `config` is not read, but for `workspace` with `a3s-fork-copy: true`: where
the copy of the files goes), and `initial_context` must be empty.

Generate with `a3s-steer: true` starts nothing: its one user message steers the session's running
generation (app/control.py `steer`: taken in at the run's next safe point, answered before the
run ends). It answers at once, the steer's id in the reply's `metadata["steer_id"]` and the
trailing `a3s-steer-id`; FAILED_PRECONDITION when no generation runs in the session.

StreamGenerate and SubscribeEvents resume from a cursor, `a3s-after-seq`: the seq of the last
chunk or event received (every chunk's `metadata["seq"]`, every event's `data["seq"]`). A
StreamGenerate with it starts nothing: it follows the run that wrote that chunk from the next one
(its messages are not read). SubscribeEvents with it needs a session_id and first replays the
session's events after the cursor. A cursor older than the retained log fails with
FAILED_PRECONDITION ("resync ..."), the oldest retained seq in the message and in the trailing
`a3s-oldest-seq` (HTTP: the error's details, `oldest_seq`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..app.checkpoints import Rewound
from ..app.sessions import PageKey, ServersGiven, SessionView
from ..app.subagents import ParentLink
from ..app.types import Resync, parse_budget
from ..base.errors import InvalidArgument
from ..base.memories import MemorySettings
from .agent_service import MAX_PAGE_SIZE, usage_metadata

CONFIG_MODE_KEY = "a3s-config-mode"
COMPACT_THRESHOLD_KEY = "a3s-compact-threshold"
COMPACT_TARGET_KEY = "a3s-compact-target"
TOKEN_BUDGET_KEY = "a3s-token-budget"
MCP_SERVERS_KEY = "a3s-mcp-servers"
MEMORY_KEY = "a3s-memory"
PAGE_SIZE_KEY = "a3s-page-size"
PAGE_TOKEN_KEY = "a3s-page-token"
NEXT_PAGE_TOKEN_KEY = "a3s-next-page-token"
AFTER_SEQ_KEY = "a3s-after-seq"
OLDEST_SEQ_KEY = "a3s-oldest-seq"
USAGE_ESTIMATED_KEY = "a3s-usage-estimated"
PARENT_SESSION_KEY = "a3s-parent-session-id"
PARENT_TOOL_CALL_KEY = "a3s-parent-tool-call-id"
AGENT_KEY = "a3s-agent"
REWIND_TO_KEY = "a3s-rewind-to"
REWIND_FILES_KEY = "a3s-rewind-files"
FORCE_KEY = "a3s-force"
FORK_FROM_KEY = "a3s-fork-from"
FORK_COPY_KEY = "a3s-fork-copy"
UNDO_CHECKPOINT_KEY = "a3s-undo-checkpoint"
FILES_RESTORED_KEY = "a3s-files-restored"
STEER_KEY = "a3s-steer"
STEER_ID_KEY = "a3s-steer-id"
SEQ = "seq"
"""Where a chunk (its `metadata`) and an event (its `data`) carry their seq."""
_MAX_SEQ = 2**63 - 1  # what the stores' integers hold
REQUEST_KEYS = (
    CONFIG_MODE_KEY,
    COMPACT_THRESHOLD_KEY,
    COMPACT_TARGET_KEY,
    TOKEN_BUDGET_KEY,
    MCP_SERVERS_KEY,
    MEMORY_KEY,
    PAGE_SIZE_KEY,
    PAGE_TOKEN_KEY,
    AFTER_SEQ_KEY,
    REWIND_TO_KEY,
    REWIND_FILES_KEY,
    FORCE_KEY,
    FORK_FROM_KEY,
    FORK_COPY_KEY,
    STEER_KEY,
)
"""Every name a caller may send (as gRPC metadata or HTTP request headers)."""
_SHARE_KEYS = {COMPACT_THRESHOLD_KEY: "threshold", COMPACT_TARGET_KEY: "target"}

Metadata = Mapping[str, str]
"""A call's metadata by (lower-case) name."""
Pairs = list[tuple[str, str]]
"""What a reply carries, in order."""


@dataclass
class ConfigMetadata:
    """What CreateSession and ConfigureSession read from the call's metadata."""

    replace_all: bool
    compaction: dict[str, float]
    token_budget: int | None
    """None: not given."""
    mcp_servers: ServersGiven | None = None
    """The session's own MCP servers (`a3s-mcp-servers`, JSON of the mcpServers shape); None: not given."""
    memory: MemorySettings | None = None
    """What the session's model gets of memories (`a3s-memory`: off, tools, prompt=N or
    tools,prompt=N); None: not given."""


def config_metadata(metadata: Metadata) -> ConfigMetadata:
    mode = metadata.get(CONFIG_MODE_KEY, "merge").strip().lower()
    if mode not in ("merge", "replace"):
        raise InvalidArgument(f"{CONFIG_MODE_KEY} must be merge or replace, not {mode[:50]!r}")
    shares = {name: _share(metadata[key], key) for key, name in _SHARE_KEYS.items() if key in metadata}
    budget = metadata.get(TOKEN_BUDGET_KEY)
    servers = metadata.get(MCP_SERVERS_KEY)
    memory = metadata.get(MEMORY_KEY)
    return ConfigMetadata(
        mode == "replace",
        shares,
        None if budget is None else parse_budget(budget, TOKEN_BUDGET_KEY),
        None if servers is None else ServersGiven.from_text(servers, MCP_SERVERS_KEY),
        None if memory is None else MemorySettings.parse(memory, MEMORY_KEY),
    )


def _share(text: str, key: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not 0 < share < 1:
        raise InvalidArgument(
            f"{key} must be a share of the context window above 0 and below 1, not {text[:50]!r}"
        )
    return share


def session_metadata(view: SessionView) -> Pairs:
    """The session's compaction shares, token budget and usage, for the replies of CreateSession,
    ConfigureSession and GetSession: `a3s-prompt-tokens`, `a3s-cache-read-tokens` and so on, one
    per key of the Generate metadata's usage; `a3s-usage-estimated: true` when the context usage
    is an estimate; a subagent's session's link to its parent (`parent_link`)."""
    threshold, target = view.compaction
    usage = usage_metadata(view.session.usage)
    return [
        *parent_link(view.session.parent),
        (COMPACT_THRESHOLD_KEY, f"{threshold:g}"),
        (COMPACT_TARGET_KEY, f"{target:g}"),
        (TOKEN_BUDGET_KEY, str(view.token_budget)),
        (MEMORY_KEY, str(view.memory)),
        *(("a3s-" + name.replace("_", "-"), value) for name, value in usage.items()),
        *([(USAGE_ESTIMATED_KEY, "true")] if view.usage.estimated else []),
    ]


def parent_link(link: ParentLink | None) -> Pairs:
    """`a3s-parent-session-id`, `a3s-parent-tool-call-id` and `a3s-agent` of a subagent's session:
    the session whose `task` call (or Delegate) started it, that call, and the agent it runs."""
    if link is None:
        return []
    return [
        (PARENT_SESSION_KEY, link.session_id),
        (PARENT_TOOL_CALL_KEY, link.tool_call_id),
        (AGENT_KEY, link.agent),
    ]


def requested_page(metadata: Metadata) -> tuple[int, PageKey | None]:
    """(page size, key of the last session already listed)."""
    size_text = metadata.get(PAGE_SIZE_KEY)
    size = MAX_PAGE_SIZE
    if size_text is not None:
        if not (_is_number(size_text) and 1 <= int(size_text) <= MAX_PAGE_SIZE):
            raise InvalidArgument(
                f"{PAGE_SIZE_KEY} must be a whole number from 1 to {MAX_PAGE_SIZE}, not {size_text[:50]!r}"
            )
        size = int(size_text)
    token = metadata.get(PAGE_TOKEN_KEY)
    return size, _parse_token(token) if token else None


def next_page(after: PageKey | None) -> Pairs:
    """The reply's `a3s-next-page-token` when more sessions follow the session keyed `after`."""
    if after is None:
        return []
    created_at, session_id = after
    return [(NEXT_PAGE_TOKEN_KEY, f"{created_at}:{session_id}")]


def _parse_token(text: str) -> PageKey:
    created_at, _, session_id = text.partition(":")
    if not (_is_number(created_at) and session_id):
        raise InvalidArgument(f"{PAGE_TOKEN_KEY} {text[:100]!r} is not a page token this server handed out")
    return int(created_at), session_id


def after_seq(metadata: Metadata) -> int | None:
    """StreamGenerate's cursor (`a3s-after-seq`); None: not given."""
    text = metadata.get(AFTER_SEQ_KEY)
    return None if text is None else seq_number(text, AFTER_SEQ_KEY)


def events_after(metadata: Metadata, session_id: str | None) -> int | None:
    """SubscribeEvents' cursor (`a3s-after-seq`), which names a seq of one session's events."""
    after = after_seq(metadata)
    if after is not None and session_id is None:
        raise InvalidArgument(
            f"{AFTER_SEQ_KEY} needs a session_id: each session's events are numbered on their own"
        )
    return after


def seq_number(text: str, name: str) -> int:
    """A seq given as text (`name` says where, for the error): a whole number, 0 or more."""
    text = text.strip()
    if not (_is_number(text) and int(text) <= _MAX_SEQ):
        raise InvalidArgument(
            f"{name} must be a whole number, 0 or more (the seq of the last chunk or event received),"
            f" not {text[:50]!r}"
        )
    return int(text)


@dataclass(frozen=True)
class RewindRequest:
    checkpoint: int
    conversation_only: bool
    force: bool


def rewind_request(metadata: Metadata) -> RewindRequest | None:
    """What ClearContext's `a3s-rewind-to` (with `a3s-rewind-files`, `a3s-force`) asks; None: a
    plain clear."""
    text = metadata.get(REWIND_TO_KEY)
    if text is None:
        for key in (REWIND_FILES_KEY, FORCE_KEY):
            if key in metadata:
                raise InvalidArgument(f"{key} goes with {REWIND_TO_KEY}, the checkpoint to rewind to")
        return None
    files = metadata.get(REWIND_FILES_KEY, "restore").strip().lower()
    if files not in ("restore", "keep"):
        raise InvalidArgument(f"{REWIND_FILES_KEY} must be restore or keep, not {files[:50]!r}")
    return RewindRequest(seq_number(text, REWIND_TO_KEY), files == "keep", _switch(metadata, FORCE_KEY))


def rewound_metadata(done: Rewound) -> Pairs:
    before = done.restored.before
    return [
        *([(UNDO_CHECKPOINT_KEY, str(before.seq))] if before is not None else []),
        (FILES_RESTORED_KEY, str(len(done.restored.changes))),
    ]


@dataclass(frozen=True)
class ForkRequest:
    session_id: str
    checkpoint: int
    copy_workspace: bool


def fork_request(metadata: Metadata) -> ForkRequest | None:
    """What CreateSession's `a3s-fork-from: <session id>:<checkpoint>` (with `a3s-fork-copy`)
    asks; None: a new session."""
    text = metadata.get(FORK_FROM_KEY)
    if text is None:
        if FORK_COPY_KEY in metadata:
            raise InvalidArgument(f"{FORK_COPY_KEY} goes with {FORK_FROM_KEY}, the session and checkpoint")
        return None
    session_id, _, seq = text.strip().rpartition(":")
    if not session_id:
        raise InvalidArgument(f"{FORK_FROM_KEY} must be <session id>:<checkpoint>, not {text[:100]!r}")
    return ForkRequest(session_id, seq_number(seq, FORK_FROM_KEY), _switch(metadata, FORK_COPY_KEY))


def steer_requested(metadata: Metadata) -> bool:
    """Whether Generate's `a3s-steer` asks it to steer the running generation."""
    return _switch(metadata, STEER_KEY)


def _switch(metadata: Metadata, key: str) -> bool:
    value = metadata.get(key, "false").strip().lower()
    if value not in ("true", "false"):
        raise InvalidArgument(f"{key} must be true or false, not {value[:50]!r}")
    return value == "true"


def error_metadata(exc: BaseException) -> Pairs:
    """What a failed call's trailing metadata carries: the oldest retained seq for a resync."""
    return [(OLDEST_SEQ_KEY, str(exc.oldest))] if isinstance(exc, Resync) else []


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20
