"""JSON sent by clients: parsed, or an InvalidArgument naming the field (even when nested too deeply)."""

from __future__ import annotations

import json
from typing import Any

from .errors import InvalidArgument


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidArgument(f"{what}: not valid JSON: nested too deeply") from None
    except ValueError as exc:
        raise InvalidArgument(f"{what}: not valid JSON: {exc}") from exc
