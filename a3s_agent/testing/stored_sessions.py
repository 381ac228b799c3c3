"""A sessions store of many long sessions, written straight into SQLite (through the server it
would take minutes): for the ListSessions tests and the benchmark's `sizes` section."""

from __future__ import annotations

import json
from pathlib import Path

from a3s_agent.base.models import SessionConfig
from a3s_agent.base.sqlite import connect
from a3s_agent.core.store.sqlite_store import MIGRATIONS

CREATED_AT = 1_700_000_000_000


def session_id(number: int) -> str:
    return f"stored-{number:06d}"


def write_sessions(data_dir: Path, workspace: Path, sessions: int, messages: int) -> None:
    """`sessions` sessions of `messages` short messages each, in the server's own schema, in
    `data_dir`/sessions.db; session n was created at CREATED_AT + n."""
    db = connect(data_dir / "sessions.db", MIGRATIONS)
    db.execute("PRAGMA synchronous=OFF")
    config = json.dumps(SessionConfig(workspace=str(workspace.resolve())).to_storable())
    db.execute("BEGIN")
    for number in range(sessions):
        sid, stamp = session_id(number), CREATED_AT + number
        db.execute(
            "INSERT INTO sessions (id, config, state, created_at, updated_at) VALUES (?, ?, 1, ?, ?)",
            (sid, config, stamp, stamp),
        )
        db.executemany(
            "INSERT INTO messages (session_id, role, content, data, created_at) VALUES (?, ?, ?, '{}', ?)",
            ((sid, ("user", "assistant")[m % 2], f"message {m} of {sid}", stamp) for m in range(messages)),
        )
    db.execute("COMMIT")
    db.close()
