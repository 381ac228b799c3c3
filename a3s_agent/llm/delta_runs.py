"""What one network read of a reply brings, passed on together: a run of text deltas adjacent in the
stream as one delta, a run of reasoning deltas as one; nothing joined across another event, so the
order of text, reasoning and tool calls is the stream's. A client then gets one chunk where a
server's small deltas came together, and as many as before from a server that sends them apart."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from .http import drain
from .provider import ProviderEvent, ReasoningDelta, TextDelta
from .sse import ServerEvent, event_batches

if TYPE_CHECKING:
    import aiohttp

Take = Callable[[list[ServerEvent], list[ProviderEvent]], bool]
"""Feeds one read's events to a provider's reader, adding what they complete to the list; True
once the reply's end came (what follows it is only drained)."""


async def by_read(response: aiohttp.ClientResponse, take: Take) -> AsyncIterator[ProviderEvent]:
    """A streamed reply's events, those of one network read passed on together (`joined`); what a
    read brought before a failure in it goes out before the failure."""
    batches = event_batches(response.content.iter_any())
    async for batch in batches:
        events: list[ProviderEvent] = []
        try:
            ended = take(batch, events)
        except Exception:
            for ready in joined(events):
                yield ready
            raise
        for ready in joined(events):
            yield ready
        if ended:
            await drain(response.content)
            break
    await batches.aclose()


def joined(events: list[ProviderEvent]) -> list[ProviderEvent]:
    """`events` with each run of adjacent deltas of one kind made one delta (their texts joined)."""
    if len(events) < 2:
        return events
    out: list[ProviderEvent] = []
    last: TextDelta | ReasoningDelta | None = None  # the delta that ends `out`, its run's texts in `run`
    run: list[str] = []
    for event in events:
        if isinstance(event, TextDelta | ReasoningDelta):
            if type(event) is type(last):
                run.append(event.text)
                continue
            _close(last, run)
            last, run = event, [event.text]
        else:
            _close(last, run)
            last = None
        out.append(event)
    _close(last, run)
    return out


def _close(delta: TextDelta | ReasoningDelta | None, run: list[str]) -> None:
    if delta is not None and len(run) > 1:
        delta.text = "".join(run)
