"""The server's log lines on stderr: text (the default) or, for a log pipeline, one JSON object per
line that joins the traces (base/telemetry.py): time, level, logger, message, and when known the
trace and span the line was written in, the session the call was about and the replica.

What a line says is decided before it is formatted (rate limits: base/sparse_log.py; secrets kept
out of messages where they are made), so both forms say the same."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

from . import telemetry

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_session: ContextVar[str] = ContextVar("a3s_log_session", default="")
SESSION_ID_CHARS = 128


def note_session(session_id: str) -> None:
    """The session the call running in this task is about: its lines, and those of the tasks it
    starts (a generation's tool calls), name it. Each call runs in a task of its own (grpc's, aiohttp's).
    A caller's made-up id is cut to SESSION_ID_CHARS, as the call's log line cuts it."""
    _session.set(session_id[:SESSION_ID_CHARS])


class JsonLines(logging.Formatter):
    """A record as one JSON object on one line (a message's newlines escaped)."""

    def __init__(self, replica_id: str) -> None:
        super().__init__()
        self._replica_id = replica_id

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ids = telemetry.current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if session_id := _session.get():
            line["session_id"] = session_id
        line["replica_id"] = self._replica_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def begin_logging(level: str, log_format: LogFormat, replica_id: str) -> None:
    """Log to stderr (stdout may be a protocol) at `level`, in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines(replica_id) if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
