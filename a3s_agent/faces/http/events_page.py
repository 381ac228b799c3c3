"""`GET /sessions/{id}/events?after_seq=&limit=`: a page of a session's log, for clients that poll.

`after_seq` (default 0: from the start) is the seq of the last entry already read; `limit` is 1 to
MAX_PAGE, 1000 (default 100). The reply is `{"events": [...], "last_seq": N, "has_more": bool}`: `last_seq`
is the cursor for the next page (the seq of the page's last entry, `after_seq` when it is empty),
`has_more` says whether the log holds entries after it now. Every entry has `seq` and `kind`:

- `"event"`: the AgentEvent's JSON as SubscribeEvents sends it (its seq in `data.seq` too);
- `"chunk"`: a generation's chunk, `{"seq", "kind", "session_id", "run", "timestamp",
  "timestamp_ms", "chunk"}` (times as an event's: Unix seconds, and the milliseconds) with
  `chunk` the GenerateChunk's JSON as StreamGenerate sends it (the done chunk without
  intermediate steps); the entry that ends a run without a result has `error` (`{"code",
  "message", "details"}`, as a stream's error) instead of `chunk`.

A cursor older than the retained log is FAILED_PRECONDITION (409) with `details.oldest_seq`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...app import Application
from ...app.events import MAX_PAGE
from ...app.types import Event, LogEntry, entry_chunk
from ...base.errors import AgentError, InvalidArgument
from ..call_metadata import seq_number
from ..status import failure
from . import convert
from .codec import encode
from .convert import Plain
from .errors import CallError

DEFAULT_LIMIT = 100
_PARAMETERS = {"after_seq", "limit"}


async def events_page(app: Application, session_id: str, query: Mapping[str, str]) -> Plain:
    unknown = sorted(set(query) - _PARAMETERS)
    if unknown:
        raise InvalidArgument(f"GET .../events takes ?after_seq=&limit= (unknown: {', '.join(unknown)})")
    after = seq_number(query.get("after_seq", "0"), "after_seq")
    limit = _limit(query.get("limit"))
    entries, last = await app.events.page(session_id, after, limit)
    cursor = entries[-1].seq if entries else after
    return {"events": [_entry(e) for e in entries], "last_seq": cursor, "has_more": cursor < last}


def _limit(text: str | None) -> int:
    """A whole number (the app checks its range); DEFAULT_LIMIT when not given."""
    if text is None:
        return DEFAULT_LIMIT
    if not (text.isascii() and text.isdigit() and len(text) <= 9):
        raise InvalidArgument(f"limit must be a whole number from 1 to {MAX_PAGE}, not {text[:50]!r}")
    return int(text)


def _entry(entry: Event | LogEntry) -> dict[str, Any]:
    if isinstance(entry, Event):
        return {"seq": entry.seq, "kind": "event", **encode("AgentEvent", convert.event(entry))}
    item: dict[str, Any] = {
        "seq": entry.seq,
        "kind": "chunk",
        "session_id": entry.session_id,
        "run": entry.body["run"],
        "timestamp": entry.timestamp // 1000,
        "timestamp_ms": entry.timestamp,
    }
    try:
        event = entry_chunk(entry)
    except AgentError as exc:
        item["error"] = CallError(*failure(exc)).to_json()
    else:
        item["chunk"] = encode("GenerateChunk", convert.chunk(entry.session_id, event, False, entry.seq))
    return item
