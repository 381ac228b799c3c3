"""Checkpoints of a session's workspace, and going back to them: rewind, restore, diff, fork.

A checkpoint is the workspace's files as a tree of the workspace's shadow repository
(tools/shadow_repo.py), taken before each generation that may change files, before each direct
tool call that may and each Agent Spaces run in the workspace, and before a rewind or restore (so
that each is undone by another). Its record
(core/store/checkpoints.py) names it by the seq of its `checkpoint_created` log entry and holds
where the session's conversation was then, so any replica lists it, diffs it and goes back to it.

"Someone else" is whatever changed files while none of this session's tool calls ran: the tree
the session's last run (or tool call, or restore) left is kept beside the shadow repository, and
each checkpoint records what differs from it (`outside`). A restore that would overwrite such a
file stops and names it, unless forced.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...base.errors import AgentError, FailedPrecondition, InvalidArgument, NotFound
from ...base.models import Message
from ...tools.atomic import replace_file
from ...tools.registry import Tool, ToolContext, ToolFunction, ToolOutput
from ...tools.restore_journal import Plan, RestoreFailed, replay, restore, workspace_lock
from ...tools.shadow_repo import FileChange, ShadowRepo, ShadowUnavailable, key_of
from ..store.checkpoints import CheckpointRecord
from ..store.events import EventBus, EventType, event_entry
from ..store.protocol import LogEntry, Store
from ..store.session import Session
from .manager import SessionManager, create_in_root, inside_root

log = logging.getLogger(__name__)

CHECKPOINT_CREATED = "checkpoint_created"
SESSION_REWOUND = "session_rewound"
SESSION_FORKED = "session_forked"
_USER_MESSAGE_CHARS = 500
_HOUR_MS = 3_600_000
REVIEW_FILES = 50  # a run's changed files an editor is shown, at most
REVIEW_FILE_BYTES = 1 << 20  # bigger files are more than an editor's review shows anyway

OwnRun = Callable[[str, str], AbstractAsyncContextManager[list[LogEntry]]]
FORKS = "forks"
"""Where a fork's copy goes by default, under the workspace root."""


@dataclass(frozen=True)
class Diff:
    changes: list[FileChange]
    patch: str


@dataclass(frozen=True)
class Restored:
    """What a restore did: the files it changed, those changed by someone else it overwrote
    (forced), and the checkpoint of the state before it (which undoes it)."""

    changes: list[FileChange]
    overwritten: list[str]
    before: CheckpointRecord | None


@dataclass(frozen=True)
class FileTexts:
    path: str
    old: str | None
    new: str | None


@dataclass(frozen=True)
class CheckpointOptions:
    directory: Path
    keep: int
    max_age_hours: float
    max_file_bytes: int
    enabled: bool = True


class Checkpoints:
    def __init__(
        self,
        sessions: SessionManager,
        store: Store,
        events: EventBus,
        options: CheckpointOptions,
        *,
        own_run: OwnRun,
        workspace_root: Path,
    ) -> None:
        self._sessions = sessions
        self._store = store
        self._events = events
        self._options = options
        self._own_run = own_run
        self._root = workspace_root
        self._repos: dict[str, ShadowRepo] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._open: set[str] = set()  # sessions whose generation took a checkpoint and goes on
        self._taking: dict[str, asyncio.Task[CheckpointRecord | None]] = {}  # a generation's, being taken
        self._wrote: set[str] = set()  # sessions whose generation called a tool that may change files

    @property
    def enabled(self) -> bool:
        return self._options.enabled

    @property
    def max_file_bytes(self) -> int:
        return self._options.max_file_bytes

    def _repo(self, session: Session) -> ShadowRepo:
        return self.shadow(Path(session.config.workspace))

    def shadow(self, workspace: Path) -> ShadowRepo:
        """The shadow repository of `workspace` (whether or not checkpoints are taken)."""
        key = str(workspace.resolve())
        repo = self._repos.get(key)
        if repo is None:
            repo = ShadowRepo(self._options.directory / key_of(key), Path(key))
            self._repos[key] = repo
        return repo

    def _lock(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    async def replay_all(self) -> None:
        """Finish the restores a crash interrupted (at start)."""
        directory = self._options.directory
        if not directory.is_dir():
            return
        for root in sorted(directory.iterdir()):
            try:
                workspace = Path((root / "workspace").read_text().strip())
            except OSError:
                continue
            repo = ShadowRepo(root, workspace)
            try:
                async with workspace_lock(repo):
                    if await replay(repo):
                        log.warning("finished the restore of %s that a crash interrupted", workspace)
            except (ShadowUnavailable, RestoreFailed, OSError) as exc:
                log.error("could not finish the interrupted restore of %s: %s", workspace, exc)

    # --- taking checkpoints ------------------------------------------------------------------

    async def turn_starting(self, session: Session, messages: list[Message], message_count: int) -> None:
        """Before a generation whose tools may change files: a checkpoint named by the turn, taken
        while the model is called (`guarded` tools wait for it). A failure is logged and reported
        as a warning; the generation goes on."""
        if not self.enabled:
            return
        user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        # Where the conversation is, read now: the run may compact it while the checkpoint is taken.
        where = (message_count, await self._store.checkpoints.archived_count(session.id))
        self._taking[session.id] = asyncio.create_task(self._quietly(session.id, "turn", user, where))
        self._open.add(session.id)
        self._wrote.discard(session.id)

    def guarded(self, session_id: str, tools: list[Tool]) -> list[Tool]:
        """`tools`, those that may change files first waiting for the checkpoint of their turn."""
        if not self.enabled:
            return tools
        return [
            tool if tool.lane == "query" else replace(tool, run=self._after(session_id, tool.run))
            for tool in tools
        ]

    def _after(self, session_id: str, run: ToolFunction) -> ToolFunction:
        async def after_the_checkpoint(args: Any, context: ToolContext) -> ToolOutput | str:
            taking = self._taking.get(session_id)
            if taking is not None:
                await asyncio.shield(taking)  # a call cancelled meanwhile leaves the checkpoint be
            self._wrote.add(session_id)
            return await run(args, context)

        return after_the_checkpoint

    async def turn_ended(self, session_id: str) -> None:
        """After that generation, before its end is told: note the tree its tools left (a file
        changed after that is someone else's doing)."""
        taking = self._taking.pop(session_id, None)
        started = await taking if taking is not None else None
        if session_id not in self._open:
            return
        self._open.discard(session_id)
        if session_id in self._wrote or started is None:
            self._wrote.discard(session_id)
            await self._left_quietly(session_id)
        else:  # none of its tools could change a file: they left what they found
            with contextlib.suppress(OSError, NotFound):
                _note_left(self._repo(self._sessions.get(session_id)), session_id, started.tree)

    async def before_tool(self, session_id: str, kind: str = "tool") -> None:
        """Before a client's direct call of a tool that may change files (kind `tool`), or an Agent
        Spaces run in the session's workspace (`space`)."""
        if self.enabled:
            await self._quietly(session_id, kind, "", await self._conversation(session_id))

    async def after_tool(self, session_id: str) -> None:
        if self.enabled:
            await self._left_quietly(session_id)

    async def _conversation(self, session_id: str) -> tuple[int, int]:
        """Where the session's conversation is: (live messages, archived messages)."""
        live = len(await self._sessions.history(session_id))
        return live, await self._store.checkpoints.archived_count(session_id)

    async def _quietly(
        self, session_id: str, kind: str, user: str, where: tuple[int, int]
    ) -> CheckpointRecord | None:
        try:
            return await self.take(session_id, kind, user, where)
        except (ShadowUnavailable, RestoreFailed, OSError, AgentError) as exc:  # never the run's failure
            log.warning("no checkpoint of session %s: %s", session_id, exc)
            self._events.publish(EventType.WARNING, session_id, f"no checkpoint was taken: {exc}")
            return None

    async def _left_quietly(self, session_id: str) -> None:
        try:
            session = self._sessions.get(session_id)
            repo = self._repo(session)
            async with self._lock(session_id):
                snapshot = await repo.snapshot(session_id, self._options.max_file_bytes)
            _note_left(repo, session_id, snapshot.tree)
        except (ShadowUnavailable, OSError, AgentError) as exc:
            log.warning("could not record what session %s's tools left: %s", session_id, exc)

    async def take(
        self, session_id: str, kind: str, user_message: str, where: tuple[int, int]
    ) -> CheckpointRecord:
        """A checkpoint of the session's workspace now, recorded and logged with where the
        conversation is (`where`: how many messages are live and how many archived)."""
        session = self._sessions.get(session_id)
        repo = self._repo(session)
        async with self._lock(session_id):
            snapshot = await repo.snapshot(session_id, self._options.max_file_bytes)
            records = await self._store.checkpoints.of_session(session_id)
            previous = records[-1].tree if records else ""
            if snapshot.tree != previous:
                repo.keep(snapshot.tree)
            changed = await repo.changes(previous, snapshot.tree) if previous else []
            left = _left_tree(repo, session_id)
            outside = [c.path for c in await repo.changes(left, snapshot.tree)] if left else []
            record = CheckpointRecord(
                session_id=session_id,
                workspace=str(repo.workspace),
                tree=snapshot.tree,
                kind=kind,
                message_count=where[0],
                archived_count=where[1],
                user_message=user_message[:_USER_MESSAGE_CHARS],
                changed=[c.as_json() for c in changed],
                skipped=[{"path": s.path, "size": s.size} for s in snapshot.skipped],
                outside=outside,
                created_at=int(time.time() * 1000),
            )
            data = {
                "kind": kind,
                "tree": snapshot.tree,
                "files_changed": len(changed),
                "files_skipped": len(snapshot.skipped),
            }
            entry = event_entry(EventType.INFO, session_id, CHECKPOINT_CREATED, data)
            stored = await self._events.write(
                session_id, [entry], lambda log: self._store.checkpoints.add(record, log)
            )
            if stored is None:
                raise FailedPrecondition(f"session {session_id!r}'s run moved to another replica")
            cutoff = stored.created_at - int(self._options.max_age_hours * _HOUR_MS)
            keep = self._options.keep
            if len(records) >= keep + keep // 10 or (records and records[0].created_at < cutoff):
                unused = await self._store.checkpoints.prune(session_id, self._options.keep, cutoff)
                await repo.drop(unused)
            return stored

    async def forget(self, session_id: str) -> None:
        """A session that goes: its checkpoints, its index and the trees no other checkpoint names."""
        session = self._sessions.get(session_id)
        repo = self._repo(session)
        unused = await self._store.checkpoints.forget(session_id)
        try:
            await repo.drop(unused)
            repo.forget_index(session_id)
            _left_file(repo, session_id).unlink(missing_ok=True)
        except (ShadowUnavailable, OSError) as exc:
            log.warning("could not remove session %s's checkpoints from %s: %s", session_id, repo.root, exc)
        self._locks.pop(session_id, None)

    # --- reading -----------------------------------------------------------------------------

    async def of_session(self, session_id: str) -> list[CheckpointRecord]:
        self._sessions.get(session_id)
        return await self._store.checkpoints.of_session(session_id)

    async def _record(self, session_id: str, seq: int) -> CheckpointRecord:
        record = await self._store.checkpoints.get(session_id, seq)
        if record is None:
            raise NotFound(f"session {session_id!r} has no checkpoint {seq} (ListCheckpoints names them)")
        return record

    async def diff(self, session_id: str, from_seq: int, to_seq: int | None, paths: list[str]) -> Diff:
        """From checkpoint `from_seq` to checkpoint `to_seq` (None: the workspace now)."""
        session = self._sessions.get(session_id)
        repo = self._repo(session)
        old = (await self._record(session_id, from_seq)).tree
        if to_seq is None:
            async with self._lock(session_id):
                new = (await repo.snapshot(session_id, self._options.max_file_bytes)).tree
        else:
            new = (await self._record(session_id, to_seq)).tree
        changes = await repo.changes(old, new)
        if paths:
            wanted = set(paths)
            changes = [c for c in changes if c.path in wanted]
        return Diff(changes, await repo.unified_diff(old, new, paths))

    async def run_changes(self, session_id: str, from_seq: int) -> Diff | None:
        """From checkpoint `from_seq` to the tree the session's last generation left (noted at
        its end, so the workspace is not read again): what that run changed. None when no tree
        is noted."""
        repo = self._repo(self._sessions.get(session_id))
        left = _left_tree(repo, session_id)
        if not left:
            return None
        old = (await self._record(session_id, from_seq)).tree
        changes = await repo.changes(old, left)
        return Diff(changes, await repo.unified_diff(old, left, []) if changes else "")

    async def run_texts(self, session_id: str, from_seq: int) -> list[FileTexts]:
        """The text files the session's last generation changed since checkpoint `from_seq`, each
        with its text before and after (None: it did not exist; binary files, files that are not
        UTF-8 and those over REVIEW_FILE_BYTES are left out; at most REVIEW_FILES), for an editor's
        review of the run's changes. Read from the shadow repository, never the workspace."""
        repo = self._repo(self._sessions.get(session_id))
        left = _left_tree(repo, session_id)
        if not left:
            return []
        old = (await self._record(session_id, from_seq)).tree
        changed = [c for c in await repo.changes(old, left) if not c.binary][:REVIEW_FILES]
        if not changed:
            return []
        place = repo.root / f"review-{uuid.uuid4().hex}"
        try:
            for tree, side in ((old, "old"), (left, "new")):
                present = [c.path for c in changed if c.status != ("added" if side == "old" else "deleted")]
                await repo.materialize(tree, present, place / side)
            texts = [
                FileTexts(c.path, _text_of(place / "old" / c.path), _text_of(place / "new" / c.path))
                for c in changed
            ]
            return [t for t in texts if t.old is not None or t.new is not None]  # e.g. symlinks: left out
        finally:
            await asyncio.to_thread(shutil.rmtree, place, True)

    # --- going back --------------------------------------------------------------------------

    async def _refuse_running(self, session_id: str) -> None:
        if self._sessions.generation_lock(session_id).locked():
            raise FailedPrecondition(f"session {session_id!r} has a run going: cancel it first")
        lease = await self._store.lease_of(session_id)
        if lease is not None and lease.expires_at >= int(time.time() * 1000):
            raise FailedPrecondition(
                f"session {session_id!r} has a run going (on replica {lease.owner}): cancel it first"
            )

    async def rewind(
        self, session_id: str, seq: int, *, conversation_only: bool, force: bool
    ) -> tuple[Restored, int]:
        """Cut the conversation back to before checkpoint `seq` (what came after is archived) and,
        unless `conversation_only`, put the files back as they were then; the restore and how many
        messages the history holds now."""
        session = self._sessions.get(session_id)
        target = await self._record(session_id, seq)
        await self._refuse_running(session_id)
        async with self._sessions.generation_lock(session_id), self._own_run(session_id, "rewind"):
            history = await self._history_at(session_id, target)
            where = await self._conversation(session_id)
            if conversation_only:
                done = Restored([], [], await self.take(session_id, "rewind", "", where))
            else:
                done = await self._restore(session, target, force, "rewind", where)
            data = {
                "checkpoint": target.seq,
                "files_restored": len(done.changes),
                "conversation_only": conversation_only,
                "undo_checkpoint": done.before.seq if done.before else 0,
                "messages": len(history),
            }
            rewound = event_entry(EventType.INFO, session_id, SESSION_REWOUND, data)
            await self._sessions.replace_history(session_id, history, log=[rewound])
        return done, len(history)

    async def restore_files(self, session_id: str, seq: int, *, force: bool) -> Restored:
        """Put the files back as they were at checkpoint `seq`; the conversation stays."""
        session = self._sessions.get(session_id)
        target = await self._record(session_id, seq)
        await self._refuse_running(session_id)
        async with self._sessions.generation_lock(session_id), self._own_run(session_id, "restore"):
            return await self._restore(
                session, target, force, "restore", await self._conversation(session_id)
            )

    async def _restore(
        self, session: Session, target: CheckpointRecord, force: bool, kind: str, where: tuple[int, int]
    ) -> Restored:
        repo = self._repo(session)
        if str(repo.workspace) != target.workspace:
            raise FailedPrecondition(
                f"checkpoint {target.seq} is of the workspace {target.workspace}; the session works in"
                f" {repo.workspace} now"
            )
        if not await repo.has(target.tree):
            raise FailedPrecondition(
                f"checkpoint {target.seq}'s files are not in {repo.root} on this replica: replicas must"
                " share the checkpoint directory (A3S_CHECKPOINT_DIR) on the workspaces' volume"
            )
        async with workspace_lock(repo):
            await replay(repo)  # one a crash interrupted: finished before anything is compared
            before = await self.take(session.id, kind, "", where)
            changes = await repo.changes(before.tree, target.tree)
            foreign = await self._changed_by_others(session.id, target.seq)
            conflicts = sorted(foreign & {c.path for c in changes})
            if conflicts and not force:
                raise FailedPrecondition(
                    f"{len(conflicts)} file(s) were changed by someone else since checkpoint {target.seq}"
                    f" and would be overwritten: {', '.join(conflicts[:20])}; nothing was restored (force"
                    " to overwrite them)"
                )
            plan = Plan(
                target.tree,
                writes=[c.path for c in changes if c.status != "deleted"],
                deletes=[c.path for c in changes if c.status in ("deleted", "type_changed")],
            )
            await restore(repo, plan)
            _note_left(repo, session.id, target.tree)
        return Restored(changes, conflicts, before)

    async def _changed_by_others(self, session_id: str, since: int) -> set[str]:
        later = [r for r in await self._store.checkpoints.of_session(session_id) if r.seq > since]
        return {path for record in later for path in record.outside}

    async def _history_at(self, session_id: str, record: CheckpointRecord) -> list[Message]:
        """The live history as it was when `record` was taken (found among the archived messages
        when compaction or a rewind has archived it since)."""
        archived = await self._sessions.archived(session_id)
        if len(archived) == record.archived_count:
            return (await self._sessions.history(session_id))[: record.message_count]
        return archived[record.archived_count : record.archived_count + record.message_count]

    # --- fork --------------------------------------------------------------------------------

    async def fork(
        self, session_id: str, seq: int | None, *, copy_workspace: bool, workspace: str
    ) -> Session:
        """A new session with the history up to before checkpoint `seq` (None: a checkpoint of kind
        `fork` taken now, so the whole history) and the session's config and settings; with
        `copy_workspace`, working in a copy of the files of that checkpoint (at `workspace` under
        the workspace root, or under its `forks/`)."""
        source = self._sessions.get(session_id)
        if seq is None:
            await self._refuse_running(session_id)  # its history is not whole while a run goes on
            target = await self.take(session_id, "fork", "", await self._conversation(session_id))
        else:
            target = await self._record(session_id, seq)
        history = await self._history_at(session_id, target)
        new_id = uuid.uuid4().hex
        config = source.config
        if copy_workspace:
            copied = await self._copy(source, target, workspace, new_id)
            config = replace(config, workspace=str(copied))
        elif workspace:
            raise InvalidArgument("workspace is for a fork with copy_workspace; without it the fork shares")
        settings = copy.deepcopy(source.settings)  # its own: neither's changes reach the other
        forked = await self._sessions.create(new_id, config, history, settings=settings)
        data = {
            "checkpoint": target.seq,
            "session": source.id,
            "fork": forked.id,
            "workspace": config.workspace,
        }
        self._events.publish(EventType.INFO, source.id, SESSION_FORKED, data)
        self._events.publish(EventType.INFO, forked.id, SESSION_FORKED, data)
        return forked

    async def _copy(self, source: Session, target: CheckpointRecord, workspace: str, new_id: str) -> Path:
        repo = self._repo(source)
        if not await repo.has(target.tree):
            raise FailedPrecondition(
                f"checkpoint {target.seq}'s files are not in {repo.root} on this replica"
            )
        if workspace:
            given = Path(workspace) if Path(workspace).is_absolute() else self._root / workspace
        else:
            given = self._root / FORKS / f"{repo.workspace.name}-{new_id[:8]}"
        destination = inside_root(given.resolve(), self._root, "workspace")
        if destination.exists():
            raise InvalidArgument(
                f"workspace {destination} exists already: a fork's copy goes to a new directory"
            )
        if not workspace and destination.is_relative_to(repo.workspace):
            _ignored_by_the_source(self._root / FORKS, self._root)
        create_in_root(destination, self._root)
        await repo.materialize(target.tree, None, destination)
        return destination


def _ignored_by_the_source(forks: Path, root: Path) -> None:
    """The forks' directory inside the forked session's workspace holds a `.gitignore` of `*`, so
    that its checkpoints leave the copies out (a copy's own checkpoints never read it: it lies
    outside the copy)."""
    create_in_root(forks, root)
    ignore = forks / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")


def _left_file(repo: ShadowRepo, session_id: str) -> Path:
    return repo.root / "index" / f"{key_of(session_id)}.left"


def _note_left(repo: ShadowRepo, session_id: str, tree: str) -> None:
    """Note `tree` as what the session's tools left (written only when it is news)."""
    if _left_tree(repo, session_id) != tree:
        replace_file(_left_file(repo, session_id), tree.encode())


def _left_tree(repo: ShadowRepo, session_id: str) -> str:
    try:
        return _left_file(repo, session_id).read_text().strip()
    except FileNotFoundError:
        return ""


def _text_of(path: Path) -> str | None:
    """A file's text, if it is a regular UTF-8 file of at most REVIEW_FILE_BYTES."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > REVIEW_FILE_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
