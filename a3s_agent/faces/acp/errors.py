"""Domain errors as JSON-RPC errors, and the one log line per call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from acp import RequestError

from ...base import telemetry
from ...base.errors import AgentError
from ...base.log_lines import note_session
from ..status import MAX_MESSAGE_CHARS, log_call, shortened, status_name

# JSON-RPC codes ACP uses: -32002 resource not found, -32602 invalid params, -32603 internal error.
CODES = {"NOT_FOUND": -32002, "INVALID_ARGUMENT": -32602, "ALREADY_EXISTS": -32602}
INTERNAL = -32603


def request_error(exc: AgentError) -> RequestError:
    """The error response for a domain error: its message, and its status name in `data`."""
    name = status_name(exc)
    return RequestError(CODES.get(name, INTERNAL), shortened(str(exc), MAX_MESSAGE_CHARS), {"status": name})


@contextmanager
def answering(method: str, session_id: str = "", meta: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Around one request's handling: a domain error becomes its JSON-RPC error; one log line; its
    server span when tracing is on, under the W3C trace context (`traceparent`...) of its `_meta`."""
    started = time.perf_counter()
    note_session(session_id)  # the library runs each request in a task of its own
    status = "OK"
    try:
        if not telemetry.enabled():
            yield
            return
        carrier = {key: value for key, value in (meta or {}).items() if isinstance(value, str)}
        attributes = {"rpc.system": "jsonrpc", "rpc.method": method}
        if session_id:
            attributes["gen_ai.conversation.id"] = session_id
        with telemetry.span(method, attributes, kind="server", carrier=carrier):
            yield
    except AgentError as exc:
        status = status_name(exc)
        raise request_error(exc) from exc
    except RequestError:
        status = "INVALID_ARGUMENT"
        raise
    except asyncio.CancelledError:
        status = "CANCELLED"
        raise
    except Exception:
        status = "INTERNAL"
        raise
    finally:
        log_call(method, session_id, started, status)
