"""How a call ends, said the same way by every face: the status (by its gRPC code name) a domain
error maps to, the message the caller gets, and the one log line per call."""

from __future__ import annotations

import logging
import time

from ..base import errors

call_log = logging.getLogger("a3s_agent.rpc")

MAX_MESSAGE_CHARS = 2000
"""gRPC status messages travel in metadata, and clients refuse more than 16 KB by default."""

DISCONNECTED = "DISCONNECTED"
"""The status logged for a call whose connection closed before it ended: its client went away (or,
for a WebSocket, the server's stop closed it). No client is sent it; what the call started may go
on, as a generation does until Cancel."""

STATUS_NAMES: dict[type[errors.AgentError], str] = {
    errors.NotFound: "NOT_FOUND",
    errors.InvalidArgument: "INVALID_ARGUMENT",
    errors.AlreadyExists: "ALREADY_EXISTS",
    errors.FailedPrecondition: "FAILED_PRECONDITION",
    errors.ResourceExhausted: "RESOURCE_EXHAUSTED",
    errors.Unavailable: "UNAVAILABLE",
    errors.Cancelled: "CANCELLED",
    errors.Internal: "INTERNAL",
}


def status_name(exc: BaseException) -> str:
    """The status a domain error maps to: INVALID_ARGUMENT for a bare AgentError, INTERNAL for
    anything that is not a domain error."""
    for kind in type(exc).__mro__:
        if kind in STATUS_NAMES:
            return STATUS_NAMES[kind]
    return "INVALID_ARGUMENT" if isinstance(exc, errors.AgentError) else "INTERNAL"


def failure(exc: BaseException) -> tuple[str, str]:
    """(status name, message) for a call that raised `exc`; an INTERNAL one that is not a domain
    error names the exception's type."""
    name = status_name(exc)
    if name == "INTERNAL" and not isinstance(exc, errors.AgentError):
        return name, f"internal error: {type(exc).__name__}: {exc}"
    return name, str(exc)


def shortened(text: str, limit: int) -> str:
    """At most `limit` characters: a message quoting a huge value must still fit a client's limits."""
    return (
        text if len(text) <= limit else f"{text[: limit - 30]}... [{len(text) - limit + 30} more characters]"
    )


def log_call(method: str, session_id: str, started: float, status: str) -> None:
    """The one line per call: `started` is the time.perf_counter() at its start."""
    if call_log.isEnabledFor(logging.INFO):
        call_log.info(
            "rpc %s session=%s status=%s duration_ms=%.2f",
            method,
            shortened(session_id or "-", 128),
            status,
            (time.perf_counter() - started) * 1000,
        )
