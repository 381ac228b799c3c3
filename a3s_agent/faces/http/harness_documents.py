"""The A3S harness protocol's response documents (key order as the spec lists them), the
command digest, and the error document with its fixed message per status."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from ...app.harness_types import ChangeSet, Command, Identity, Page, Receipt
from .harness_schema import ACTIONS, IDENTITY_SCHEMA, PROTOCOL

RECEIPT_SCHEMA = "a3s.code.agent-command-receipt.v1"
PAGE_SCHEMA = "a3s.code.agent-event-page.v1"
CHANGE_SET_SCHEMA = "a3s.code.agent-change-set.v1"
ERROR_SCHEMA = "a3s.code.agent-error.v1"
PREFIX = "a3s.code.agent_protocol."

MESSAGES = {
    400: "Agent protocol request is invalid",
    404: "Agent protocol resource was not found",
    409: "Agent protocol identity or state conflicts with the request",
    422: "Agent run has no Git-compatible change set",
    425: "Agent run changes are still being captured",
    500: "Agent Harness could not complete the request",
    503: "Agent Harness is unavailable",
}
INVALID_JSON_MESSAGE = "request body is not a valid bounded Agent protocol document"
DRAINING_MESSAGE = "Agent Harness is draining"

# app/harness.py HarnessRefusal reasons and schema Refused codes: HTTP status and error code.
STATUS_OF = {
    "invalid_json": 400,
    "unsupported_schema": 400,
    "invalid_field": 400,
    "session_not_found": 404,
    "run_not_found": 404,
    "release_mismatch": 409,
    "session_mismatch": 409,
    "run_unavailable": 409,
    "change_set_unavailable": 422,
    "change_set_pending": 425,
    "workspace_isolation": 500,
    "harness_closed": 503,
    "session_capacity": 503,
}


def error_document(reason: str) -> tuple[int, dict[str, Any]]:
    """Status and body for a refusal; a reason not in STATUS_OF is an A3S Code error code (500)."""
    status = STATUS_OF.get(reason, 500)
    code = PREFIX + reason if reason in STATUS_OF else reason
    message = INVALID_JSON_MESSAGE if reason == "invalid_json" else MESSAGES[status]
    if reason == "harness_closed":
        message = DRAINING_MESSAGE
    return status, {"schema": ERROR_SCHEMA, "error": {"code": code, "message": message}}


def identity_json(identity: Identity) -> dict[str, Any]:
    return {
        "schema": IDENTITY_SCHEMA,
        "protocol": PROTOCOL,
        "agent_release_identity": identity.release,
        "session_id": identity.session_id,
        "run_id": identity.run_id,
    }


def command_digest(command: Command) -> str:
    """sha256 of the command in canonical form: compact JSON, keys in the spec's order, non-ASCII
    as UTF-8 (so it does not depend on how the client wrote its JSON)."""
    schema, own = ACTIONS[command.action]
    canonical = {
        "action": command.action,
        "request": {
            "schema": schema,
            "request_id": command.request_id,
            "identity": identity_json(command.identity),
            own: command.argument,
        },
    }
    text = json.dumps(canonical, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def receipt_json(command: Command, receipt: Receipt) -> dict[str, Any]:
    return {
        "schema": RECEIPT_SCHEMA,
        "action": command.action,
        "request_id": command.request_id,
        "identity": identity_json(command.identity),
        "command_digest": command_digest(command),
        "state": receipt.state,
        "latest_event_sequence_exclusive": receipt.events,
        "observed_at_ms": receipt.observed_at_ms,
        "replayed": receipt.replayed,
    }


def page_json(identity: Identity, after: int | None, page: Page) -> dict[str, Any]:
    return {
        "schema": PAGE_SCHEMA,
        "identity": identity_json(identity),
        "after_event_sequence": after,
        "first_available_sequence": page.first_available,
        "latest_sequence_exclusive": page.latest_exclusive,
        "next_after_event_sequence": page.next_after,
        "state": page.state,
        "observed_at_ms": page.observed_at_ms,
        "retention_gap": page.retention_gap,
        "has_more": page.has_more,
        "events": [
            {
                "sequence": e.sequence,
                "occurred_at_ms": e.occurred_at_ms,
                "event": {
                    "version": 1,
                    "type": e.type,
                    "payload": e.payload,
                    "metadata": {
                        "run_id": identity.run_id,
                        "session_id": identity.session_id,
                        "sequence": e.sequence,
                        "timestamp_ms": e.occurred_at_ms,
                    },
                },
            }
            for e in page.events
        ],
    }


def change_set_json(identity: Identity, changes: ChangeSet) -> dict[str, Any]:
    return {
        "schema": CHANGE_SET_SCHEMA,
        "identity": identity_json(identity),
        "state": changes.state,
        "format": "git_unified_diff_v1",
        "encoding": "base64",
        "base_tree": f"git-tree:{changes.base_tree}",
        "result_tree": f"git-tree:{changes.result_tree}",
        "patch_digest": "sha256:" + hashlib.sha256(changes.patch).hexdigest(),
        "patch_bytes": len(changes.patch),
        "patch_base64": base64.b64encode(changes.patch).decode("ascii"),
        "observed_at_ms": changes.observed_at_ms,
    }
