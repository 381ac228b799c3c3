"""Checkpoints of sessions' workspaces and going back to them: list a session's checkpoints, rewind
it to before one (conversation, and files unless asked not to), restore its files only, diff two
checkpoints or one and now, fork it at one. Every face reaches them here; the machinery is
core/sessions/checkpoints.py (records in the store, trees in tools/shadow_repo.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from ..base.errors import FailedPrecondition, InvalidArgument
from ..core.sessions.checkpoints import Diff, FileTexts, Restored
from ..core.store.checkpoints import CheckpointRecord
from ..runtime import Runtime
from ..tools.restore_journal import RestoreFailed
from ..tools.shadow_repo import FileChange, ShadowUnavailable
from .sessions import Sessions, SessionView

__all__ = ["CheckpointRecord", "Checkpoints", "Diff", "FileChange", "FileTexts", "Restored", "Rewound"]

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rewound:
    restored: Restored
    messages: int
    """How many messages the live history holds after the rewind."""


class Checkpoints:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def of_session(self, session_id: str) -> list[CheckpointRecord]:
        """The session's checkpoints, oldest first."""
        await self._rt.sessions.refresh(session_id)
        return await self._rt.checkpoints.of_session(session_id)

    async def rewind(
        self, session_id: str, checkpoint: int, *, conversation_only: bool = False, force: bool = False
    ) -> Rewound:
        """Back to before `checkpoint`: later messages archived, files restored (unless
        `conversation_only`); FailedPrecondition while a run is going, or when files someone else
        changed since would be overwritten (unless `force`). The state before is a checkpoint."""
        await self._rt.sessions.refresh(session_id)
        restored, messages = await _mapped(
            self._rt.checkpoints.rewind(
                session_id,
                _checked(checkpoint, "checkpoint"),
                conversation_only=conversation_only,
                force=force,
            )
        )
        return Rewound(restored, messages)

    async def restore_files(self, session_id: str, checkpoint: int, *, force: bool = False) -> Restored:
        """The files as they were at `checkpoint`; the conversation stays as it is."""
        await self._rt.sessions.refresh(session_id)
        return await _mapped(
            self._rt.checkpoints.restore_files(session_id, _checked(checkpoint, "checkpoint"), force=force)
        )

    async def diff(
        self, session_id: str, from_checkpoint: int, to_checkpoint: int | None, paths: list[str]
    ) -> Diff:
        """From `from_checkpoint` to `to_checkpoint` (None: the workspace now)."""
        await self._rt.sessions.refresh(session_id)
        to = None if to_checkpoint is None else _checked(to_checkpoint, "to")
        return await _mapped(
            self._rt.checkpoints.diff(session_id, _checked(from_checkpoint, "from"), to, paths)
        )

    async def fork(
        self, session_id: str, checkpoint: int | None, *, copy_workspace: bool = False, workspace: str = ""
    ) -> SessionView:
        """A new session with the history before `checkpoint` (None: all of it, the files as they
        are now) and the session's settings, in the same workspace or (`copy_workspace`) a copy of
        its files at that checkpoint. FailedPrecondition for a fork of now while a run goes on."""
        await self._rt.sessions.refresh(session_id)
        forked = await _mapped(
            self._rt.checkpoints.fork(
                session_id,
                None if checkpoint is None else _checked(checkpoint, "checkpoint"),
                copy_workspace=copy_workspace,
                workspace=workspace,
            )
        )
        return await Sessions(self._rt).get(forked.id)

    async def run_texts(self, session_id: str, checkpoint: int) -> list[FileTexts]:
        """The text files the session's last generation changed since `checkpoint`, before and
        after ([] when they cannot be read: a review is shown without them)."""
        try:
            return await self._rt.checkpoints.run_texts(session_id, checkpoint)
        except (ShadowUnavailable, OSError) as exc:
            log.warning("no review of session %s's changes: %s", session_id, exc)
            return []


def _checked(seq: int, field: str) -> int:
    if seq <= 0:
        raise InvalidArgument(f"{field} must name a checkpoint (its seq, a positive number), not {seq}")
    return seq


async def _mapped(call: Awaitable[T]) -> T:
    """git or the file system failing is the workspace's state, not the request's fault."""
    try:
        return await call
    except (ShadowUnavailable, RestoreFailed) as exc:
        raise FailedPrecondition(str(exc)) from None
