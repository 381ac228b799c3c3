"""The A3S harness protocol's operations in domain terms (app/harness.py): what a request names,
what the answers hold, and the refusals the face maps to the protocol's error documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["start", "cancel", "recover", "steer"]


class HarnessRefusal(Exception):
    """A request the protocol answers with an error document; `reason` names which (the face maps
    it to a status and code)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Identity:
    release: str
    session_id: str
    run_id: str


@dataclass(frozen=True)
class Command:
    action: Action
    request_id: str
    identity: Identity
    argument: str  # start: the prompt; cancel: the reason; recover: the checkpoint run id; steer: the input


@dataclass(frozen=True)
class Receipt:
    state: str
    events: int
    observed_at_ms: int
    replayed: bool


@dataclass(frozen=True)
class EventRecord:
    sequence: int
    occurred_at_ms: int
    type: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Page:
    first_available: int | None
    latest_exclusive: int
    next_after: int | None
    state: str
    observed_at_ms: int
    retention_gap: bool
    has_more: bool
    events: list[EventRecord]


@dataclass(frozen=True)
class ChangeSet:
    state: str
    base_tree: str
    result_tree: str
    patch: bytes
    observed_at_ms: int
