"""ListSessions pages, asked for and handed out in metadata (ListSessionsRequest has no fields).

Request metadata `a3s-page-size` (1..MAX_PAGE_SIZE, default MAX_PAGE_SIZE) and `a3s-page-token`
(from a previous reply); when more sessions follow, the reply's trailing metadata carries
`a3s-next-page-token`. Sessions come oldest first, so a page token stays valid while sessions are
created and destroyed."""

from __future__ import annotations

from typing import Any

from ...app.sessions import PageKey
from ...base.errors import InvalidArgument
from ..agent_service import MAX_PAGE_SIZE

PAGE_SIZE_KEY = "a3s-page-size"
PAGE_TOKEN_KEY = "a3s-page-token"
NEXT_PAGE_TOKEN_KEY = "a3s-next-page-token"


def requested_page(context: Any) -> tuple[int, PageKey | None]:
    """(page size, key of the last session already listed) from the call's metadata."""
    metadata = dict(call_metadata(context))
    size_text = metadata.get(PAGE_SIZE_KEY)
    size = MAX_PAGE_SIZE
    if size_text is not None:
        if not (_is_number(size_text) and 1 <= int(size_text) <= MAX_PAGE_SIZE):
            raise InvalidArgument(
                f"{PAGE_SIZE_KEY} must be a whole number from 1 to {MAX_PAGE_SIZE}, not {size_text[:50]!r}"
            )
        size = int(size_text)
    token = metadata.get(PAGE_TOKEN_KEY)
    return size, parse_token(token) if token else None


def token(after: PageKey) -> str:
    """The token of the page after the session whose listing key is `after`."""
    created_at, session_id = after
    return f"{created_at}:{session_id}"


def parse_token(text: str) -> PageKey:
    created_at, _, session_id = text.partition(":")
    if not (_is_number(created_at) and session_id):
        raise InvalidArgument(f"{PAGE_TOKEN_KEY} {text[:100]!r} is not a page token this server handed out")
    return int(created_at), session_id


def hand_out(context: Any, next_token: str) -> None:
    """Put the next page's token in the reply's trailing metadata (callers without metadata, the
    HTTP face, get the first page)."""
    set_trailing = getattr(context, "set_trailing_metadata", None)
    if set_trailing is not None:
        set_trailing(((NEXT_PAGE_TOKEN_KEY, next_token),))


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20


def call_metadata(context: Any) -> tuple[tuple[str, str], ...]:
    """The call's metadata; none for callers that have none (the HTTP face's context)."""
    read = getattr(context, "invocation_metadata", None)
    return tuple(read() or ()) if read is not None else ()
