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


MODEL_NAME_CHARS = 200


def as_model_name(value: Any) -> str:
    """The name of the model that answered, as a server gives it: a string, cut to
    MODEL_NAME_CHARS (it is recorded on the request's span; a hostile server's essay is not)."""
    return as_text(value)[:MODEL_NAME_CHARS]
