"""The relay provider: an LLM by copy-paste, through outbox and inbox files.

Each model turn becomes an outbox file, `<relay_dir>/outbox/{handle}_seq{NNNN}.txt`: the
CodingAgent protocol's HEADER, PROTOCOL, CONTEXT and PROMPT sections, complete in itself.
A person pastes it into any chat LLM and saves the answer as a `.txt` file in
`<relay_dir>/inbox/`; the oldest one is read, moved to `inbox/processed/`, and handled as a
tag-mode reply (tag_mode.py). No network and no API key are involved.

`<relay_dir>/sessions.json` maps each session to its 8-hex-digit handle, with its task and
sequence numbers, so numbering goes on across turns and restarts, and an outbox still
unanswered when the agent stopped is waited on again rather than written anew. One inbox
serves one relay directory, so turns of different sessions take their turn, whichever
provider (or spelling of the directory in a config) they come through; one process should
use a relay directory at a time.

In an LLM config the relay is `provider: "relay"`, its directory `base_url`
(`relay:///abs/dir`, `relay://rel/dir` or a plain path; A3S_RELAY_DIR when empty).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import stat
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..base.errors import FailedPrecondition, Unavailable
from ..llm.provider import CompletionRequest, ProviderEvent
from ..tools.atomic import write_atomically
from .renderer import CONTINUATION_PROMPT, render_outbox
from .tag_mode import (
    Chat,
    TurnOutcome,
    TurnScope,
    content_text,
    last_turn_outcome,
    pending_summary,
    plan_reply,
    reply_events,
    scope_of,
    summary_events,
    workspace_files,
)

log = logging.getLogger(__name__)

RELAY_SCHEME = "relay://"

_turn_locks: weakref.WeakValueDictionary[Path, asyncio.Lock] = weakref.WeakValueDictionary()


def _turn_lock(relay_dir: Path) -> asyncio.Lock:
    """The lock of a (resolved) relay directory, shared by every provider using it in this process:
    a turn reads sessions.json, waits for its reply and saves its copy back, so two at once would
    each take the other's reply or drop the other's numbering."""
    lock = _turn_locks.get(relay_dir)
    if lock is None:
        lock = _turn_locks[relay_dir] = asyncio.Lock()
    return lock


def relay_dir_of(base_url: str, default: str = "") -> Path:
    """The relay directory an LLM config names in `base_url`, else `default` (A3S_RELAY_DIR)."""
    value = base_url.removeprefix(RELAY_SCHEME) or default
    if not value:
        raise FailedPrecondition(
            "the relay provider needs a directory: set llm.base_url to relay:///path/to/dir, or A3S_RELAY_DIR"
        )
    return Path(value).expanduser()


@dataclass(frozen=True)
class RelayTiming:
    """How long to wait for a reply, how often to look, and how long a reply file must be left
    untouched before it is read (so a file still being saved is not read half-written)."""

    wait_timeout_s: float = 3600.0
    poll_s: float = 0.5
    settle_s: float = 1.0


# sessions.json


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class RelaySession:
    """One session's relay state. `sequence` is the last outbox written, `answered` the last one
    whose reply was read; `complete` is set by a reply with DONE."""

    handle: str
    session_id: str
    workspace: str
    task: str
    sequence: int = 0
    answered: int = 0
    complete: bool = False
    created_at: str = ""
    updated_at: str = ""

    @property
    def pending(self) -> bool:
        """Whether the last outbox still waits for its reply."""
        return self.answered < self.sequence


def sessions_path(relay_dir: Path) -> Path:
    return relay_dir / "sessions.json"


def load_sessions(relay_dir: Path) -> dict[str, RelaySession]:
    """The relay sessions by handle (none before the first outbox)."""
    path = sessions_path(relay_dir)
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return {handle: RelaySession(**fields) for handle, fields in data.items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, AttributeError) as exc:
        raise FailedPrecondition(f"{path} is not a relay sessions file: {exc}") from exc


def save_sessions(relay_dir: Path, sessions: dict[str, RelaySession]) -> None:
    data = {handle: asdict(session) for handle, session in sessions.items()}
    write_atomically(sessions_path(relay_dir), (json.dumps(data, indent=2) + "\n").encode("utf-8"))


def _session_for(
    sessions: dict[str, RelaySession], session_id: str, workspace: Path, task: str
) -> RelaySession:
    """The session's relay state, made (with a new handle) on its first turn."""
    for session in sessions.values():
        if session.session_id == session_id:
            return session
    handle = secrets.token_hex(4)
    while handle in sessions:
        handle = secrets.token_hex(4)
    stamp = _now()
    session = RelaySession(handle, session_id, str(workspace), task, created_at=stamp, updated_at=stamp)
    sessions[handle] = session
    return session


def _prompt(messages: list[Chat]) -> tuple[str, bool]:
    """The user's latest words, and whether this turn continues the task rather than starting one:
    it does when the model has spoken since, or when they are the continuation prompt itself."""
    roles = [message.get("role") for message in messages]
    last_user = max((i for i, role in enumerate(roles) if role == "user"), default=-1)
    last_assistant = max((i for i, role in enumerate(roles) if role == "assistant"), default=-1)
    text = content_text(messages[last_user].get("content")).strip() if last_user >= 0 else ""
    return text, last_user < last_assistant or text == CONTINUATION_PROMPT


class RelayProvider:
    """A provider whose model is a person relaying files to a chat LLM.

    The session and workspace of a turn come from the request (`scope_of`), or from `scope`
    for a provider serving one session (the relay CLI). `on_waiting(outbox)` is told each
    time a reply to `outbox` is awaited.
    """

    def __init__(
        self,
        relay_dir: Path,
        *,
        scope: TurnScope | None = None,
        timing: RelayTiming | None = None,
        on_waiting: Callable[[Path], None] | None = None,
    ) -> None:
        self.relay_dir = relay_dir.resolve()
        self.outbox = self.relay_dir / "outbox"
        self.inbox = self.relay_dir / "inbox"
        self._scope = scope
        self._timing = timing or RelayTiming()
        self._on_waiting = on_waiting
        self._turns = _turn_lock(self.relay_dir)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        scope = self._scope or scope_of(request)
        if not scope.session_id or scope.workspace is None:
            raise FailedPrecondition("the relay provider needs the session and workspace of each model turn")
        if not request.tools:
            raise FailedPrecondition("the relay provider runs tool-using generations only (tools are off)")
        summary = pending_summary(request.messages)
        if summary is not None:
            events = summary_events(summary)
        else:
            async with self._turns:
                try:
                    events = reply_events(
                        await self._exchange(scope.session_id, scope.workspace, request.messages)
                    )
                except OSError as exc:
                    raise FailedPrecondition(
                        f"cannot use the relay directory {self.relay_dir}: {exc}"
                    ) from exc
        for event in events:
            yield event

    async def close(self) -> None:
        """Nothing to release: the relay holds no connections."""

    async def _exchange(self, session_id: str, workspace: Path, messages: list[Chat]) -> str:
        """Write the turn's outbox (unless one is still unanswered) and return the reply's text."""
        for directory in (self.outbox, self.inbox / "processed"):
            directory.mkdir(parents=True, exist_ok=True)
        sessions = load_sessions(self.relay_dir)
        task, continuation = _prompt(messages)
        session = _session_for(sessions, session_id, workspace, task)
        if not session.pending:
            if not continuation:
                session.task, session.complete = task, False
            await self._write_outbox(sessions, session, workspace, last_turn_outcome(messages), continuation)
        log.info("relay: waiting for the reply to %s in %s", self._outbox_path(session), self.inbox)
        if self._on_waiting is not None:
            self._on_waiting(self._outbox_path(session))
        reply = await self._wait_for_reply(session)
        text = reply.read_text(encoding="utf-8-sig", errors="replace")
        os.replace(
            reply, self.inbox / "processed" / f"{session.handle}_seq{session.sequence:04d}_{reply.name}"
        )
        session.answered, session.complete = session.sequence, plan_reply(text).summary is not None
        session.updated_at = _now()
        await asyncio.to_thread(save_sessions, self.relay_dir, sessions)
        return text

    def _outbox_path(self, session: RelaySession) -> Path:
        return self.outbox / f"{session.handle}_seq{session.sequence:04d}.txt"

    async def _write_outbox(
        self,
        sessions: dict[str, RelaySession],
        session: RelaySession,
        workspace: Path,
        outcome: TurnOutcome,
        continuation: bool,
    ) -> None:
        files = await asyncio.to_thread(workspace_files, workspace, skip=self.relay_dir)
        session.sequence += 1
        session.updated_at = _now()
        document = render_outbox(
            session.handle,
            session.sequence,
            session.task,
            files,
            outcome.results,
            outcome.files,
            continuation,
        )
        outbox = self._outbox_path(session)

        def write() -> None:
            write_atomically(outbox, document.encode("utf-8"))
            save_sessions(self.relay_dir, sessions)

        # Synced writes, on a worker thread: a busy disk must not stall every other session. A turn
        # cancelled meanwhile waits for both: an outbox is never left without its record.
        writing = asyncio.ensure_future(asyncio.to_thread(write))
        try:
            await asyncio.shield(writing)
        except asyncio.CancelledError:
            await writing
            raise

    async def _wait_for_reply(self, session: RelaySession) -> Path:
        """The reply file, polled for: a person saves it, no event announces it."""
        try:
            async with asyncio.timeout(self._timing.wait_timeout_s):
                while True:
                    reply = self._oldest_reply()
                    if reply is not None:
                        return reply
                    await asyncio.sleep(self._timing.poll_s)
        except TimeoutError:
            raise Unavailable(
                f"no reply came to {self._outbox_path(session)} within {self._timing.wait_timeout_s:g} s; "
                f"save the answer as a .txt file in {self.inbox}, then resume the session"
            ) from None

    def _oldest_reply(self) -> Path | None:
        """The inbox's oldest .txt file, once it has been left alone for the settle time."""
        replies: list[tuple[int, str, Path]] = []
        for path in self.inbox.glob("*.txt"):
            try:
                info = path.stat()
            except OSError:  # gone since it was listed
                continue
            if stat.S_ISREG(info.st_mode) and not path.name.startswith("."):
                replies.append((info.st_mtime_ns, path.name, path))
        if not replies:
            return None
        modified, _, path = min(replies)
        return path if time.time_ns() - modified >= self._timing.settle_s * 1e9 else None
