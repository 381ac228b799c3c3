"""llm/http.py, what both HTTP providers share: how long a server asked to wait before a retry.
(The retries themselves run through the real server in tests/test_fake_llm.py, test_dialects.py and
test_anthropic.py; the proxy in test_proxies.py.) Then both providers reading a reply a network
read at a time from a real HTTP server: the deltas of one read joined, none kept for the next."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from a3s_agent.base.models import LLMConfig
from a3s_agent.llm.anthropic_provider import AnthropicProvider
from a3s_agent.llm.http import MAX_RETRY_AFTER_S, Retryable, retry_after
from a3s_agent.llm.openai_compat import OpenAICompatibleProvider
from a3s_agent.llm.provider import CompletionRequest, TextDelta, TurnEnd
from a3s_agent.testing.fake_anthropic import sse_frames


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "250"}, 0.25),  # OpenAI's, in milliseconds, first
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),  # an unreadable one does not hide the other
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_in_seconds_or_milliseconds(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers) == seconds


def test_retry_after_as_an_http_date() -> None:
    asked = retry_after({"retry-after": email.utils.formatdate(time.time() + 30, usegmt=True)})
    assert asked is not None and 28 <= asked <= 30


def test_a_delay_asked_is_taken_only_when_sensible() -> None:
    assert Retryable("x", 2.0).delay(0.5) == 2.0
    for unreasonable in (None, 0.0, -5.0, MAX_RETRY_AFTER_S + 1):  # none, a date past, an hour
        assert Retryable("x", unreasonable).delay(0.5) == 0.5


# --- a reply a network read at a time (both providers, over real HTTP) --------------------------


def _openai(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)


def _delta(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _claude(*events: dict[str, Any]) -> bytes:
    return b"".join(sse_frames(list(events)))


def _text(piece: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}


_CLAUDE_END = (
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
    {"type": "message_stop"},
)
_WRITES = {  # what the server writes before and after it is let go on
    "openai": (
        _openai(_delta({"content": "Hel"}), _delta({"content": "lo"})),
        _openai(_delta({"content": " world"}), _delta({}, "stop")) + b"data: [DONE]\n\n",
    ),
    "anthropic": (
        _claude(
            {"type": "message_start", "message": {"usage": {"input_tokens": 5}}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            _text("Hel"),
            _text("lo"),
        ),
        _claude(_text(" world"), *_CLAUDE_END),
    ),
}


@asynccontextmanager
async def _model(writes: list[bytes], go_on: asyncio.Event) -> AsyncIterator[str]:
    """A real HTTP server whose one reply is `writes[0]`, then (once `go_on` is set) the rest."""

    async def reply(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(writes[0])
        await go_on.wait()
        for write in writes[1:]:
            await response.write(write)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", reply)
    app.router.add_post("/v1/messages", reply)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


def _provider(kind: str, base_url: str) -> OpenAICompatibleProvider | AnthropicProvider:
    llm = LLMConfig(provider=kind, model="m", base_url=base_url, api_key="k")
    return OpenAICompatibleProvider(llm) if kind == "openai" else AnthropicProvider(llm)


@pytest.mark.parametrize("kind", sorted(_WRITES))
async def test_the_deltas_of_one_read_go_on_together_without_waiting_for_the_next(kind: str) -> None:
    go_on = asyncio.Event()
    async with _model(list(_WRITES[kind]), go_on) as base_url:
        provider = _provider(kind, base_url)
        stream = provider.stream(CompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}]))
        try:
            # The first write's two deltas, as one, while the server still holds back the rest.
            assert await asyncio.wait_for(anext(stream), 30) == TextDelta("Hello")
            go_on.set()
            rest = [event async for event in stream]
        finally:
            go_on.set()
            await provider.close()
    assert rest[0] == TextDelta(" world") and isinstance(rest[-1], TurnEnd) and len(rest) == 2


async def test_text_is_not_joined_across_a_tool_call_that_came_between() -> None:
    """Text, a call made whole by the next one's start, more text: in one read, three events and
    the rest, in the model's order."""
    call = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}
    second = {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}
    writes = [
        _openai(
            _delta({"content": "one "}),
            _delta({"content": "two "}),
            _delta({"tool_calls": [call]}),
            _delta({"tool_calls": [second]}),
            _delta({"content": "three "}),
            _delta({"content": "four"}),
            _delta({}, "tool_calls"),
        )
        + b"data: [DONE]\n\n"
    ]
    go_on = asyncio.Event()
    go_on.set()
    async with _model(writes, go_on) as base_url:
        provider = _provider("openai", base_url)
        request = CompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
        try:
            events = [event async for event in provider.stream(request)]
        finally:
            await provider.close()
    assert [(type(e).__name__, getattr(e, "text", "") or getattr(e, "name", "")) for e in events] == [
        ("TextDelta", "one two "),
        ("ToolCallReady", "f"),
        ("TextDelta", "three four"),
        ("ToolCallReady", "g"),
        ("TurnEnd", ""),
    ]
