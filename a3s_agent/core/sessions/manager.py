"""Sessions: validated, kept in memory for fast reads, written through to the store."""

from __future__ import annotations

import asyncio
import bisect
import os
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ...base.backoff import Backoff
from ...base.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ...base.models import LLMConfig, Message, SessionConfig, SessionState, Usage
from ...llm.endpoints import credentials_clash
from ...tools.beneath import DIRECTORY_HANDLE, OutsideRoot, locate_beneath
from ..store.events import EventBus, EventType, event_entry
from ..store.protocol import LogEntry, StaleHeader, Store
from ..store.session import ParentLink, Session, SessionSettings

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Histories kept in memory, the most recently used; the others are read from the store when needed.
MAX_CACHED_HISTORIES = 64
HEADER_TRIES = 10  # a header change made again after another replica's (see _change_header)


def check_id(session_id: str) -> None:
    """InvalidArgument unless a session can have `session_id`: ids are checked one way before any
    store sees them, for lookups as for creation (PostgreSQL fails on a NUL in text where SQLite
    finds nothing)."""
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        raise InvalidArgument("session_id must be 1-128 characters of letters, digits, '.', '_', ':' or '-'")


def existing_directory(path: Path | str, field: str) -> Path:
    """`path` resolved, or InvalidArgument when it is no directory or a path the OS refuses
    (NUL bytes, names too long)."""
    shown = str(path)[:300]
    try:
        resolved = Path(path).resolve()
        is_dir = resolved.is_dir()
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{field} {shown!r} is not a usable path: {exc}") from None
    if not is_dir:
        raise InvalidArgument(f"{field} {shown!r} does not exist or is not a directory")
    return resolved


def create_in_root(path: Path, root: Path) -> None:
    """Create the missing directory `path` and its missing parents when it lies in `root`, as A3S
    creates a session's workspace on use (mode 0777 less the umask, as the file tools create
    directories). Anything else is left for existing_directory to refuse: a path out of `root`, by
    `..` or through a symlink, even one swapped in meanwhile (the walk never leaves the root)."""
    try:
        target = path.resolve()
        if target.exists() or not target.is_relative_to(root):
            return
        root_fd = os.open(root, DIRECTORY_HANDLE)
    except (OSError, ValueError):
        return
    try:
        locate_beneath(root_fd, str(root), f"{target.relative_to(root)}/.", create_dirs=True).close()
    except (OSError, OutsideRoot):
        pass
    finally:
        os.close(root_fd)


def inside_root(path: Path, root: Path, field: str) -> Path:
    """`path` (resolved: no `..`, no symlink left) when it lies in `root`, else InvalidArgument."""
    if not path.is_relative_to(root):
        raise InvalidArgument(
            f"{field} {str(path)[:300]!r} is outside the workspace root {str(root)!r}"
            " (the server's --workspace-root)"
        )
    return path


def listing_key(session: Session) -> tuple[int, str]:
    """Where a session sorts in listings: oldest first, then by id."""
    return session.created_at, session.id


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class SessionManager:
    """Owns every session. Session headers (config, state, counts, usage) are loaded at start; a
    history is read from the store when first needed and kept while recently used. Writes go to
    the store first."""

    def __init__(
        self,
        store: Store,
        *,
        default_workspace: Callable[[], Path],
        workspace_root: Path,
        max_sessions: int,
        max_context_tokens: int,
        events: EventBus,
        pin_llm: Callable[[LLMConfig], LLMConfig] = lambda llm: llm,
    ) -> None:
        """`pin_llm` writes into a session's LLM config what its key was given for (the runtime's
        provider entries): applied to every config a session is created or configured with."""
        self._store = store
        self._pin_llm = pin_llm
        self._events = events
        self._default_workspace = default_workspace
        self._workspace_root = workspace_root
        self._max_sessions = max_sessions
        self._max_context_tokens = max_context_tokens
        self._sessions: dict[str, Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # One per session, held by every change of its header (config, settings, state, counts):
        # each change is computed from the header the last one left, never from a copy taken
        # before another change's write (which it would then undo).
        self._header_locks: dict[str, asyncio.Lock] = {}
        # Live histories, loaded on first use and kept in step with every write; least recently
        # used first, at most MAX_CACHED_HISTORIES.
        self._histories: OrderedDict[str, list[Message]] = OrderedDict()

    async def load(self) -> None:
        self._sessions = {s.id: s for s in await self._store.list_sessions()}

    async def refresh(self, session_id: str) -> None:
        """On a store other replicas write too: make the cached session what the store holds (one
        read of its stamp; the header again, and the history when next needed, if it moved).
        InvalidArgument, on every store, for an id no session can have (see `check_id`)."""
        if not session_id:
            return
        check_id(session_id)
        if not self._store.shared:
            return
        stamp = await self._store.session_stamp(session_id)
        cached = self._sessions.get(session_id)
        if cached is not None and stamp == cached.updated_at:
            return
        loaded = None if stamp is None else await self._store.load_session(session_id)
        self._histories.pop(session_id, None)
        if loaded is None:
            self._sessions.pop(session_id, None)
        else:
            self._sessions[session_id] = loaded

    async def refresh_all(self) -> None:
        """On a shared store: every session as the store holds it (for listings)."""
        if self._store.shared:
            loaded = {s.id: s for s in await self._store.list_sessions()}
            for session_id, session in loaded.items():
                cached = self._sessions.get(session_id)
                if cached is None or cached.updated_at != session.updated_at:
                    self._histories.pop(session_id, None)
            self._sessions = loaded

    def __len__(self) -> int:
        return len(self._sessions)

    def workspaces(self) -> list[str]:
        """Every session's workspace (resolved), once each."""
        return list({s.config.workspace: None for s in self._sessions.values()})

    def count(self, state: SessionState) -> int:
        return sum(1 for s in self._sessions.values() if s.state == state)

    def get(self, session_id: str) -> Session:
        if not session_id:
            raise InvalidArgument("session_id is required")
        check_id(session_id)
        try:
            return self._sessions[session_id]
        except KeyError:
            raise NotFound(f"session {session_id!r} not found") from None

    def lineage(self, session: Session) -> list[Session]:
        """The sessions whose subagents `session` descends from, its parent first (those this
        replica knows; a parent destroyed meanwhile ends the line)."""
        line: list[Session] = []
        link = session.parent
        while link is not None and (above := self._sessions.get(link.session_id)) is not None:
            if any(known.id == above.id for known in line):  # (a store edited by hand could loop)
                break
            line.append(above)
            link = above.parent
        return line

    def children(self, session_id: str) -> list[Session]:
        """The subagents' sessions `session_id`'s model started, oldest first."""
        return sorted(
            (
                s
                for s in self._sessions.values()
                if s.parent is not None and s.parent.session_id == session_id
            ),
            key=listing_key,
        )

    def page(self, after: tuple[int, str] | None, size: int) -> tuple[list[Session], bool]:
        """Up to `size` sessions in listing order, those after the listing key `after` (a session
        listed on an earlier page); and whether more follow."""
        ordered = sorted(self._sessions.values(), key=listing_key)
        start = 0 if after is None else bisect.bisect_right(ordered, after, key=listing_key)
        return ordered[start : start + size], len(ordered) > start + size

    @property
    def histories_in_memory(self) -> int:
        """How many sessions' histories are held in memory now."""
        return len(self._histories)

    async def create(
        self,
        session_id: str | None,
        config: SessionConfig,
        initial_context: list[Message],
        settings: SessionSettings | None = None,
        parent: ParentLink | None = None,
    ) -> Session:
        if session_id is None or session_id == "":
            session_id = uuid.uuid4().hex
        check_id(session_id)
        if len(self._sessions) >= self._max_sessions:
            raise ResourceExhausted(
                f"the server holds its maximum of {self._max_sessions} sessions; destroy some first"
            )
        config = self._validated(config, requested_workspace=bool(config.workspace))
        stamp = now_ms()
        session = Session(
            id=session_id,
            config=config,
            state=SessionState.ACTIVE,
            created_at=stamp,
            updated_at=stamp,
            message_count=len(initial_context),
            settings=settings or SessionSettings(),
            parent=parent,
        )
        created = event_entry(EventType.SESSION_CREATED, session_id, f"session {session_id} created")
        await self._events.write(
            session_id, [created], lambda log: self._store.create_session(session, initial_context, log)
        )
        self._sessions[session_id] = session
        self._keep_history(session_id, list(initial_context))
        return session

    async def destroy(self, session_id: str) -> None:
        self.get(session_id)
        destroyed = event_entry(EventType.SESSION_DESTROYED, session_id, f"session {session_id} destroyed")
        await self._events.write(
            session_id, [destroyed], lambda log: self._store.delete_session(session_id, log)
        )
        self._sessions.pop(session_id, None)
        self._locks.pop(session_id, None)
        self._header_locks.pop(session_id, None)
        self._histories.pop(session_id, None)

    async def configure(
        self,
        session_id: str,
        patch: SessionConfig,
        *,
        replace_all: bool = False,
        settings: Callable[[SessionSettings], SessionSettings] | None = None,
    ) -> Session:
        """Merge `patch` into the session's config (empty fields keep their old values), or with
        `replace_all` make it the config (empty fields take their defaults: the only way to turn a
        flag off). `settings`, when given, changes the session's settings in the same write."""
        return await self._change_header(
            session_id, lambda session: self._configured(session, patch, replace_all, settings)
        )

    def _configured(
        self,
        session: Session,
        patch: SessionConfig,
        replace_all: bool,
        settings: Callable[[SessionSettings], SessionSettings] | None,
    ) -> Session:
        old = SessionConfig() if replace_all else session.config
        llm = old.llm
        if patch.llm is not None:
            llm = patch.llm.merged_over(old.llm)
        merged = SessionConfig(
            name=patch.name or old.name,
            workspace=patch.workspace or old.workspace,
            llm=llm,
            system_prompt=patch.system_prompt or old.system_prompt,
            max_context_length=patch.max_context_length or old.max_context_length,
            auto_compact=patch.auto_compact or old.auto_compact,
        )
        validated = self._validated(merged, requested_workspace=bool(patch.workspace))
        return replace(
            session,
            config=validated,
            settings=session.settings if settings is None else settings(session.settings),
            updated_at=self._next_stamp(session),
        )

    async def append_messages(
        self,
        session_id: str,
        messages: list[Message],
        usage: Usage | None = None,
        log: Sequence[LogEntry] = (),
    ) -> Session:
        """Store messages, adding `usage` (a model turn's) to the session's totals, with the log
        entries that report them, in one write."""
        async with self._header(session_id):
            session = self.get(session_id)
            stamp = self._next_stamp(session)
            totals = None if usage is None else session.usage + usage
            fence = self._events.fence_for(session_id)
            await self._events.write(
                session_id,
                log,
                lambda entries: self._store.append_messages(
                    session_id, messages, stamp, totals, entries, fence
                ),
            )
            if session_id in self._histories:
                self._histories[session_id].extend(messages)
            session.message_count += len(messages)
            session.updated_at = stamp
            if totals is not None:
                session.usage = totals
            return session

    async def update_settings(
        self,
        session_id: str,
        change: Callable[[SessionSettings], SessionSettings],
        log: Sequence[LogEntry] = (),
    ) -> Session:
        """Make `change(settings)` the session's settings, with the log entries that report it (one
        store transaction). `change` sees the settings every earlier change left; what it raises
        ends the update with nothing written."""
        return await self._change_header(
            session_id,
            lambda session: replace(
                session, settings=change(session.settings), updated_at=self._next_stamp(session)
            ),
            log,
        )

    async def set_state(self, session_id: str, state: SessionState) -> Session:
        return await self._change_header(
            session_id, lambda session: replace(session, state=state, updated_at=self._next_stamp(session))
        )

    async def _change_header(
        self, session_id: str, build: Callable[[Session], Session], log: Sequence[LogEntry] = ()
    ) -> Session:
        """Store `build(header)` as the session's header, with `log`, under the session's header
        lock. On a shared store it is stored only if the stored header is still the one it was
        built from; when another replica changed the session meanwhile, it is built again from
        theirs (so neither change undoes the other), at most HEADER_TRIES times, after a random
        pause that grows with each try: without it, a replica with a queue of changes to the
        session kept winning against one that must read the header back first."""
        backoff = Backoff(0.005, 0.2, jitter=1.0)  # replicas changing one session at once take turns
        async with self._header(session_id):
            for _ in range(HEADER_TRIES):
                session = self.get(session_id)
                updated = build(session)
                try:
                    await self._update(updated, log, since=session.updated_at if self._store.shared else None)
                except StaleHeader:
                    await asyncio.sleep(backoff.next_s())
                    await self.refresh(session_id)
                    continue
                self._sessions[session_id] = updated
                return updated
        raise Unavailable(
            f"session {session_id!r} changed on other replicas {HEADER_TRIES} times while this change"
            " was being made; try again"
        )

    def _header(self, session_id: str) -> asyncio.Lock:
        """The lock of the session's header changes (NotFound for an unknown session)."""
        self.get(session_id)
        return self._header_locks.setdefault(session_id, asyncio.Lock())

    async def _update(self, updated: Session, log: Sequence[LogEntry], since: int | None) -> None:
        """Store a session's new header, with the session's queued events and `log`, in one
        transaction (see Store.update_session for `since`)."""
        fence = self._events.fence_for(updated.id)
        await self._events.write(
            updated.id, log, lambda entries: self._store.update_session(updated, entries, fence, since)
        )

    def generation_lock(self, session_id: str) -> asyncio.Lock:
        """Held while a generation runs, so two never interleave one session's history."""
        self.get(session_id)
        return self._locks.setdefault(session_id, asyncio.Lock())

    async def history(self, session_id: str) -> list[Message]:
        """The live history (a copy: callers may keep it while the session moves on)."""
        self.get(session_id)
        while session_id not in self._histories:
            loaded = await self._store.load_messages(session_id)
            # A write that landed while loading would be missing from `loaded`: load again.
            if len(loaded) == self.get(session_id).message_count and session_id not in self._histories:
                self._keep_history(session_id, loaded)
        self._histories.move_to_end(session_id)
        return list(self._histories[session_id])

    def _keep_history(self, session_id: str, messages: list[Message]) -> None:
        """Hold `messages` as the session's live history, dropping the least recently used beyond
        the bound (they are read from the store again when needed)."""
        self._histories[session_id] = messages
        self._histories.move_to_end(session_id)
        while len(self._histories) > MAX_CACHED_HISTORIES:
            self._histories.popitem(last=False)

    async def archived(self, session_id: str) -> list[Message]:
        """The messages compaction and ClearContext took out of the live history, oldest first."""
        self.get(session_id)
        return await self._store.load_archived(session_id)

    async def replace_history(
        self, session_id: str, messages: list[Message], log: Sequence[LogEntry] = ()
    ) -> Session:
        """Archive the live history and make `messages` the new one (compaction, clearing), with
        the log entries that report it, in one write."""
        async with self._header(session_id):
            session = self.get(session_id)
            stamp = self._next_stamp(session)
            fence = self._events.fence_for(session_id)
            await self._events.write(
                session_id,
                log,
                lambda entries: self._store.replace_history(session_id, messages, stamp, entries, fence),
            )
            self._keep_history(session_id, list(messages))
            session.message_count = len(messages)
            session.updated_at = stamp
            return session

    @staticmethod
    def _next_stamp(session: Session) -> int:
        """Now, but always later than the session's last update."""
        return max(now_ms(), session.updated_at + 1)

    def _validated(self, config: SessionConfig, *, requested_workspace: bool) -> SessionConfig:
        """The config with its workspace resolved and checked; InvalidArgument names the bad field.
        A workspace the request names must lie in the workspace root; a missing one there is created."""
        if config.max_context_length > self._max_context_tokens:  # first: a refusal creates nothing
            raise InvalidArgument(
                f"config.max_context_length {config.max_context_length} exceeds the server limit"
                f" of {self._max_context_tokens} tokens"
            )
        clash = credentials_clash(config.llm) if config.llm is not None else None
        if clash is not None:
            raise InvalidArgument(f"config.llm: {clash}")
        base = self._default_workspace()
        workspace = base
        if config.workspace:
            create_in_root(base / config.workspace, self._workspace_root)
            workspace = existing_directory(base / config.workspace, "config.workspace")
        if requested_workspace:
            inside_root(workspace, self._workspace_root, "config.workspace")
        llm = self._pin_llm(config.llm) if config.llm is not None else None
        return replace(config, workspace=str(workspace), llm=llm)
