"""Gateway threads as a3s sessions: one persisted session per thread, found again after a restart."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

from ...app.sessions import Sessions
from ...app.types import SESSION_ID_PATTERN, ConfirmationPolicy
from ...base.models import SessionConfig

SESSION_PREFIX = "coven:"
_HASH_CHARS = 16
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def session_id_for(thread_id: str) -> str:
    """`coven:<thread_id>` when that is a valid session id; otherwise the thread id made safe and
    cut short, plus a hash of the whole of it, so two threads never share a session."""
    plain = SESSION_PREFIX + thread_id
    if SESSION_ID_PATTERN.fullmatch(plain):
        return plain
    digest = hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    room = 128 - len(SESSION_PREFIX) - len(digest) - 1
    return f"{SESSION_PREFIX}{_UNSAFE.sub('_', thread_id)[:room]}-{digest}"


class Threads:
    """The sessions of gateway threads, and the one used last (InjectContext names no thread)."""

    def __init__(self, sessions: Sessions, approval: ConfirmationPolicy | None) -> None:
        self._sessions = sessions
        self._approval = approval
        self.last_session: str | None = None

    async def session_for(self, thread_id: str) -> str:
        """The thread's session, created on first use (with the approval policy, if one is set)."""
        session_id = session_id_for(thread_id)
        approval = replace(self._approval) if self._approval is not None else None
        await self._sessions.ensure(session_id, SessionConfig(name=f"coven thread {thread_id}"), approval)
        self.last_session = session_id
        return session_id
