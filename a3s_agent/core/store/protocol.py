"""The store interface: durable sessions, their configuration and messages, each session's event
log, the leases that give a running generation one owner, and the channel replicas talk on.

Two implementations: SQLite (`sqlite_store.py`, one process, the embedded default) and PostgreSQL
(`postgres_store.py`, any number of replicas on one database).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...base.errors import FailedPrecondition
from ...base.models import Message, Usage
from .cron import CronStore
from .providers import ProviderTable
from .session import Session

if TYPE_CHECKING:
    from .a2a_tasks import A2aTaskTable
    from .checkpoints import CheckpointTable
    from .memories import MemoryTable


class LeaseLost(FailedPrecondition):
    """A write fenced by a lease token that is no longer the session's: another replica took the run."""


class StaleHeader(Exception):
    """A header write made from a header the store no longer holds: another replica changed the
    session meanwhile (or removed it). Nothing was written."""


@dataclass
class LogEntry:
    """One record of a session's event log: an AgentEvent (kind "event") or a generation chunk
    (kind "chunk"). The store sets `seq` (per session, 1, 2, 3, ... with no gap) and `id` (its
    position in the whole log) when it appends the entry."""

    session_id: str
    kind: str
    body: dict[str, Any]
    timestamp: int  # ms since the epoch
    seq: int = 0
    id: int = 0
    fence: int | None = None
    """The lease token the writer holds for the session's run; an entry whose token is no longer
    the session's is refused (left with seq 0). None: unfenced (events outside a run)."""


@dataclass(frozen=True)
class Lease:
    """The row that makes one replica the owner of a session's running generation."""

    session_id: str
    owner: str  # the replica id
    token: int  # the fencing token: larger than every token handed out before, for any session
    run_id: str
    expires_at: int  # ms since the epoch, by the store's clock
    trace: str = ""
    """The W3C traceparent the run was started in ("" untraced): a replica that takes the run over
    traces its takeover in the same trace."""


EntriesHandler = Callable[[list[LogEntry]], None]
ControlHandler = Callable[[dict[str, Any]], None]


class Store(Protocol):
    backend: str
    durability: str  # how commits are synced once open: "full" survives a power loss, "normal" a crash
    shared: bool
    """Whether other processes (replicas) write to the same store, so that what is cached in
    memory must be checked against it (`session_stamp`)."""
    memories: MemoryTable
    """The memories of sessions and workspaces (core/store/memories.py), in the same database."""
    providers: ProviderTable
    """The provider entries and the default model (providers.py), in the same database."""
    checkpoints: CheckpointTable
    """The records of sessions' checkpoints (checkpoints.py), in the same database."""
    a2a_tasks: A2aTaskTable
    """The A2A face's tasks (a2a_tasks.py), in the same database."""

    @property
    def cron(self) -> CronStore:
        """The scheduled jobs and their history (cron.py), in the same database."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    # --- sessions and messages ---------------------------------------------------------------
    # `log` entries are appended (their seq set) in the same transaction as the change they report.
    # `fence`: the lease token of the writer's run; LeaseLost (nothing written) when it is stale.

    async def create_session(
        self, session: Session, messages: list[Message], log: Sequence[LogEntry] = ()
    ) -> None:
        """Store a new session and its initial messages in one transaction.

        Raises AlreadyExists when the id is taken. The session's log continues the numbering of an
        earlier session of the same id whose entries are still retained."""

    async def list_sessions(self) -> list[Session]:
        """Every session's header (config, state, usage, message count: no messages), oldest first."""

    async def load_session(self, session_id: str) -> Session | None:
        """One session's header as `list_sessions` gives it, or None."""

    async def session_stamp(self, session_id: str) -> int | None:
        """The session's `updated_at` (every write moves it forward), or None when it does not exist."""

    async def update_session(
        self,
        session: Session,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
        since: int | None = None,
    ) -> None:
        """Persist config, state, timestamps and usage of an existing session. With `since`, only if
        the stored header is still the one stamped `since` (its updated_at): StaleHeader otherwise."""

    async def delete_session(self, session_id: str, log: Sequence[LogEntry] = ()) -> bool:
        """Remove a session, its messages and its lease (a run still going is fenced off; its log
        stays until retention removes it); False when it did not exist."""

    async def append_messages(
        self,
        session_id: str,
        messages: list[Message],
        updated_at: int,
        usage: Usage | None = None,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
    ) -> None:
        """Append messages to a session's live history, and set its usage totals when given,
        in one transaction."""

    async def replace_history(
        self,
        session_id: str,
        messages: list[Message],
        updated_at: int,
        log: Sequence[LogEntry] = (),
        fence: int | None = None,
    ) -> None:
        """Archive the live history (kept, no longer loaded) and store `messages` as the new one,
        in one transaction."""

    async def load_messages(self, session_id: str) -> list[Message]:
        """The live (not archived) history of a session, in order."""

    async def load_archived(self, session_id: str) -> list[Message]:
        """The archived messages of a session (taken out by compaction or clearing), in order."""

    async def save_initialization(self, data: dict[str, Any]) -> None:
        """Replace the stored Initialize configuration (JSON-ready, holding no secret), in one
        transaction."""

    async def load_initialization(self) -> dict[str, Any] | None:
        """The stored Initialize configuration, or None when no Initialize was ever stored."""

    # --- A3S harness runs (app/harness.py; `record` is its JSON) -------------------------------

    async def reserve_harness_run(
        self, session_id: str, run_id: str, record: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Store the record of a new run unless one of that id exists in the session: None when
        stored, else the existing record (one transaction: of two at once, one wins)."""

    async def save_harness_run(self, session_id: str, run_id: str, record: dict[str, Any]) -> None:
        """Replace the record of a reserved run."""

    async def load_harness_run(self, session_id: str, run_id: str) -> dict[str, Any] | None:
        """The record of a run, or None."""

    # --- the event log -----------------------------------------------------------------------

    async def append_log(self, entries: Sequence[LogEntry]) -> None:
        """Append entries (of any sessions) in one transaction, setting each one's seq and id;
        an entry whose fence is stale is not written and keeps seq 0."""

    async def read_log(self, session_id: str, after_seq: int, limit: int) -> list[LogEntry]:
        """Up to `limit` entries of a session with seq > after_seq, in seq order."""

    async def read_log_since(self, after_id: int, limit: int) -> list[LogEntry]:
        """Up to `limit` entries of any session with id > after_id, in id order."""

    async def log_bounds(self, session_id: str) -> tuple[int, int]:
        """(the oldest retained seq, the last seq handed out) of a session's log; (0, last) when
        nothing is retained, (0, 0) for a log never written."""

    async def prune_log(self, older_than: int, keep: int) -> int:
        """Remove entries with a timestamp before `older_than` (ms) and all but the newest `keep`
        of each session; how many were removed."""

    # --- leases -----------------------------------------------------------------------------

    async def acquire_lease(
        self, session_id: str, owner: str, run_id: str, ttl_ms: int, trace: str = ""
    ) -> Lease | None:
        """Make `owner` the owner of the session's run with a new token, unless another lease on
        the session has not expired (then None). Taking over an expired lease is the same call.
        `trace` is kept with it (Lease.trace)."""

    async def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease | None:
        """Extend a lease still held; None when it was lost (expired and taken, or released)."""

    async def release_lease(self, lease: Lease, log: Sequence[LogEntry] = ()) -> None:
        """End a lease still held (nothing when it was lost), appending `log` (the run's last
        entries) in the same transaction as append_log would."""

    async def lease_of(self, session_id: str) -> Lease | None:
        """The session's lease row (expired or not), or None."""

    async def expired_leases(self) -> list[Lease]:
        """Leases past their expiry: runs whose owner stopped renewing them."""

    async def expire_leases(self, owner: str | None) -> int:
        """Mark the leases `owner` holds (every lease when None) as expired at once; how many. For
        leases a process that ended left behind (the caller knows it ended): taking them over need
        not wait for their expiry."""

    # --- the channel between replicas --------------------------------------------------------

    async def listen(self, on_entries: EntriesHandler, on_control: ControlHandler) -> None:
        """Call `on_entries` with the log entries other processes append (as they commit) and
        `on_control` with every control message sent (`send_control`), until close."""

    async def send_control(self, message: dict[str, Any]) -> None:
        """Deliver a JSON-ready message to every listener (this process's too)."""
