"""The gRPC call's `a3s-*` metadata (faces/call_metadata.py): read from the request metadata,
handed out in the reply's trailing metadata."""

from __future__ import annotations

from typing import Any

from ..call_metadata import Metadata, Pairs


def given(context: Any) -> Metadata:
    """The call's request metadata by name."""
    return dict(context.invocation_metadata() or ())


def hand_out(context: Any, pairs: Pairs) -> None:
    """Put `pairs` in the reply's trailing metadata (once per call: a second call replaces it)."""
    if pairs:
        context.set_trailing_metadata(tuple(pairs))
