"""The A3S harness protocol's request documents, read as its server reads them: a closed object per
schema (an unknown, missing, duplicated or wrongly typed key is `invalid_json`), then each value's
rule (`unsupported_schema` for a wrong schema constant, `invalid_field` for the rest), in the order
schema, ids, identity, then the action's own field."""

from __future__ import annotations

import re
from typing import Any, cast

from ...app.harness_types import Action, Command, Identity
from ...base.errors import InvalidArgument
from ...base.jsontext import parse_json

PROTOCOL = "a3s.code.agent.v1"
MAX_BODY_BYTES = 128 * 1024
U64_MAX = 2**64 - 1
MAX_ID_BYTES = 256
MAX_REASON_BYTES = 1024
MAX_PROMPT_BYTES = 64 * 1024
MAX_PAGE_LIMIT = 64
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

IDENTITY_SCHEMA = "a3s.code.agent-run-identity.v1"
START_SCHEMA = "a3s.code.agent-run-start.v1"
CANCEL_SCHEMA = "a3s.code.agent-run-cancel.v1"
RECOVER_SCHEMA = "a3s.code.agent-run-recover.v1"
STEER_SCHEMA = "a3s.code.agent-run-steer.v1"  # ours: A3S's command union has no steer
PAGE_REQUEST_SCHEMA = "a3s.code.agent-event-page-request.v1"
CHANGE_SET_REQUEST_SCHEMA = "a3s.code.agent-change-set-request.v1"

# action: (request schema, the action's own field)
ACTIONS = {
    "start": (START_SCHEMA, "prompt"),
    "cancel": (CANCEL_SCHEMA, "reason"),
    "recover": (RECOVER_SCHEMA, "checkpoint_run_id"),
    "steer": (STEER_SCHEMA, "input"),
}
IDENTITY_KEYS = ("schema", "protocol", "agent_release_identity", "session_id", "run_id")


class Refused(Exception):
    """The request is refused with this code (`invalid_json`, `unsupported_schema`, `invalid_field`)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def load(raw: bytes) -> Any:
    """One JSON document from the body; invalid_json for anything else (a duplicated key, NaN or
    Infinity, nesting deeper than base/jsontext.py allows, a lone surrogate included)."""
    try:
        return parse_json(raw.decode("utf-8"), "the request body", max_chars=MAX_BODY_BYTES, strict=True)
    except (UnicodeError, InvalidArgument):
        raise Refused("invalid_json") from None


def _object(value: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """A closed object: every required key present, nothing else."""
    if not isinstance(value, dict):
        raise Refused("invalid_json")
    keys = set(value)
    if not set(required) <= keys or not keys <= set(required) | set(optional):
        raise Refused("invalid_json")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise Refused("invalid_json")
    return value


def _unsigned(value: Any, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise Refused("invalid_json")
    return value


def _typed_identity(value: Any) -> dict[str, str]:
    identity = _object(value, IDENTITY_KEYS)
    return {key: _string(identity[key]) for key in IDENTITY_KEYS}


def _bounded_text(value: str, limit: int, *, lines: bool) -> str:
    if not value.strip() or len(value.encode()) > limit or "\0" in value:
        raise Refused("invalid_field")
    if not lines and ("\r" in value or "\n" in value):
        raise Refused("invalid_field")
    return value


def check_id(value: str) -> str:
    return _bounded_text(value, MAX_ID_BYTES, lines=False)


def _schema(value: str, expected: str) -> None:
    if value != expected:
        raise Refused("unsupported_schema")


def _identity(fields: dict[str, str]) -> Identity:
    _schema(fields["schema"], IDENTITY_SCHEMA)
    if fields["protocol"] != PROTOCOL or not _DIGEST.fullmatch(fields["agent_release_identity"]):
        raise Refused("invalid_field")
    return Identity(
        fields["agent_release_identity"], check_id(fields["session_id"]), check_id(fields["run_id"])
    )


def command(body: Any) -> Command:
    top = _object(body, ("action", "request"))
    action = top["action"]
    if not isinstance(action, str) or action not in ACTIONS:
        raise Refused("invalid_json")
    schema, own = ACTIONS[action]
    request = _object(top["request"], ("schema", "request_id", "identity", own))
    texts = {key: _string(request[key]) for key in ("schema", "request_id", own)}
    identity_fields = _typed_identity(request["identity"])
    _schema(texts["schema"], schema)
    request_id = check_id(texts["request_id"])
    identity = _identity(identity_fields)
    if own in ("prompt", "input"):
        argument = _bounded_text(texts[own], MAX_PROMPT_BYTES, lines=True)
    elif own == "reason":
        argument = _bounded_text(texts[own], MAX_REASON_BYTES, lines=False)
    else:
        argument = check_id(texts[own])
    return Command(cast(Action, action), request_id, identity, argument)


def page_request(body: Any) -> tuple[Identity, int | None, int]:
    request = _object(body, ("schema", "identity", "limit"), ("after_event_sequence",))
    schema = _string(request["schema"])
    identity_fields = _typed_identity(request["identity"])
    after = request.get("after_event_sequence")
    after = None if after is None else _unsigned(after, U64_MAX)
    limit = _unsigned(request["limit"], 65535)
    _schema(schema, PAGE_REQUEST_SCHEMA)
    identity = _identity(identity_fields)
    if not 1 <= limit <= MAX_PAGE_LIMIT:
        raise Refused("invalid_field")
    return identity, after, limit


def change_set_request(body: Any) -> Identity:
    request = _object(body, ("schema", "identity"))
    schema = _string(request["schema"])
    identity_fields = _typed_identity(request["identity"])
    _schema(schema, CHANGE_SET_REQUEST_SCHEMA)
    return _identity(identity_fields)
