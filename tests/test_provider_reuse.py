"""Both HTTP providers keep their connection from turn to turn: what follows the end of a reply
(OpenAI's [DONE], Anthropic's message_stop) is read, normally just the end of the chunked body,
which may come in a later read, so the connection goes back to the pool; a server that goes on
streaming after the end does not hold the turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from a3s_agent.base.models import LLMConfig
from a3s_agent.llm.anthropic_provider import AnthropicProvider
from a3s_agent.llm.openai_compat import OpenAICompatibleProvider
from a3s_agent.llm.provider import CompletionRequest, Provider, TextDelta
from a3s_agent.testing.fake_anthropic import sse_frames

OPENAI_REPLY = (
    f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': 'hi'}, 'finish_reason': 'stop'}]})}\n\n"
    "data: [DONE]\n\n"
)
ANTHROPIC_EVENTS: list[dict[str, Any]] = [
    {"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 0}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
    {"type": "message_stop"},
]
ANTHROPIC_REPLY = b"".join(sse_frames(ANTHROPIC_EVENTS)).decode()


async def _server(endless: bool) -> AsyncIterator[tuple[str, set[int]]]:
    connections: set[int] = set()

    def replying(body: str) -> Handler:
        async def reply(request: web.Request) -> web.StreamResponse:
            assert request.transport is not None
            connections.add(id(request.transport))
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(body.encode())
            await asyncio.sleep(0.01)  # the body's end comes in a read of its own
            while endless:
                await response.write(b": still here\n\n")
                await asyncio.sleep(0.01)
            await response.write_eof()
            return response

        return reply

    app = web.Application()
    app.router.add_post("/v1/chat/completions", replying(OPENAI_REPLY))
    app.router.add_post("/v1/messages", replying(ANTHROPIC_REPLY))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", connections
    finally:
        await runner.cleanup()


async def _turn(provider: Provider) -> str:
    request = CompletionRequest(model="m", messages=[{"role": "user", "content": "go"}])
    return "".join([e.text async for e in provider.stream(request) if isinstance(e, TextDelta)])


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("endless", [False, True])
async def test_turns_share_one_connection_unless_the_server_streams_on(kind: str, endless: bool) -> None:
    async for base_url, connections in _server(endless):
        llm = LLMConfig(provider=kind, model="m", base_url=base_url, api_key="sk-test")
        provider: Provider = AnthropicProvider(llm) if kind == "anthropic" else OpenAICompatibleProvider(llm)
        try:
            for _ in range(3):
                assert await asyncio.wait_for(_turn(provider), 5) == "hi"
        finally:
            await provider.close()
        # Streaming on after the end, the server gets a connection per turn, and each turn still ends.
        assert len(connections) == (3 if endless else 1)
