"""Members of a model server's JSON, read where a member of the wrong type counts as absent (a
server's bug, or a hostile one, must not become an internal error halfway through a reply)."""

from __future__ import annotations

from typing import Any


def as_object(value: Any) -> dict[str, Any]:
    """`value` where a JSON object belongs, or an empty one."""
    return value if isinstance(value, dict) else {}


def as_array(value: Any) -> list[Any]:
    """`value` where a JSON array belongs, or an empty one."""
    return value if isinstance(value, list) else []


def as_text(value: Any) -> str:
    """`value` where a JSON string belongs, or an empty one."""
    return value if isinstance(value, str) else ""
