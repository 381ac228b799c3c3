"""How a subagent's session row names its parent (session.py ParentLink): three columns, NULL
for every other session, the same on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .session import ParentLink

MIGRATION = """
ALTER TABLE sessions ADD COLUMN parent_id TEXT;
ALTER TABLE sessions ADD COLUMN parent_call_id TEXT;
ALTER TABLE sessions ADD COLUMN agent TEXT;
CREATE INDEX sessions_by_parent ON sessions(parent_id)
"""
"""The migration that adds the link (appended to both stores' MIGRATIONS)."""

LINK_COLUMNS = "parent_id, parent_call_id, agent"
"""The link's columns, in the order `link_values` gives and `link_of` reads them."""


def link_values(link: ParentLink | None) -> tuple[str | None, str | None, str | None]:
    if link is None:
        return None, None, None
    return link.session_id, link.tool_call_id, link.agent


def link_of(values: Sequence[Any]) -> ParentLink | None:
    parent, call, agent = values
    return None if parent is None else ParentLink(parent, call or "", agent or "")
