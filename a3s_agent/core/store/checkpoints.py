"""Checkpoints (core/sessions/checkpoints.py) as the store keeps them: one row per checkpoint of a
session, named by its seq (the seq of the `checkpoint_created` entry logged with the row), so that
any replica lists, diffs and restores them. The trees themselves are in the workspace's shadow git
repository (tools/shadow_repo.py), where the workspace lives."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .protocol import LogEntry

COLUMNS = (
    "session_id, seq, workspace, tree, kind, message_count, archived_count, user_message, changed, skipped,"
    " outside, created_at"
)
"""What `record_of` reads, in its order."""


@dataclass(frozen=True)
class CheckpointRecord:
    session_id: str
    workspace: str  # the workspace's resolved path
    tree: str  # the shadow repository's tree of the workspace's files
    kind: str  # turn (before a generation), tool (before a direct tool call), rewind, restore
    message_count: int  # the live history's length when it was taken
    archived_count: int
    """How many archived messages the session had then (archived_count), so that the history of
    that moment is found again after compaction or a rewind archived it."""
    user_message: str  # the turn's user message (shortened); "" for other kinds
    changed: list[dict[str, Any]]  # the files changed since the session's previous checkpoint
    skipped: list[dict[str, Any]]  # the files left out: over the size cap, with their size
    outside: list[str]  # files changed by someone else since the session's last run ended
    created_at: int  # ms since the epoch
    seq: int = 0  # set by the store: the seq of its checkpoint_created log entry

    def row(self) -> tuple[Any, ...]:
        """The values the insert takes: COLUMNS without seq (the store's)."""
        return (
            self.session_id,
            self.workspace,
            self.tree,
            self.kind,
            self.message_count,
            self.archived_count,
            self.user_message,
            json.dumps(self.changed),
            json.dumps(self.skipped),
            json.dumps(self.outside),
            self.created_at,
        )


def record_of(row: Sequence[Any]) -> CheckpointRecord:
    session_id, seq, workspace, tree, kind, messages, archived, user, changed, skipped, outside, at = row
    return CheckpointRecord(
        session_id=session_id,
        workspace=workspace,
        tree=tree,
        kind=kind,
        message_count=int(messages),
        archived_count=int(archived),
        user_message=user,
        changed=json.loads(changed),
        skipped=json.loads(skipped),
        outside=json.loads(outside),
        created_at=int(at),
        seq=int(seq),
    )


class CheckpointTable(Protocol):
    async def add(self, record: CheckpointRecord, log: Sequence[LogEntry]) -> CheckpointRecord | None:
        """Store the record with `log` (its last entry the checkpoint_created event, whose seq
        names it) in one transaction; the record as stored, None when the entry was refused."""
        ...

    async def archived_count(self, session_id: str) -> int:
        """How many of the session's messages are archived now (a record's archived_count)."""
        ...

    async def of_session(self, session_id: str) -> list[CheckpointRecord]:
        """The session's checkpoints, oldest first."""
        ...

    async def get(self, session_id: str, seq: int) -> CheckpointRecord | None: ...

    async def prune(self, session_id: str, keep: int, older_than: int) -> list[str]:
        """Remove all but the session's newest `keep` checkpoints, and those created before
        `older_than` (ms; never the newest); the trees no checkpoint of the workspace names now."""
        ...

    async def forget(self, session_id: str) -> list[str]:
        """Remove every checkpoint of the session; the trees no checkpoint of the workspace names now."""
        ...
