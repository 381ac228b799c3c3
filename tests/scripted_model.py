"""An in-process scripted model: the provider port (`a3s_agent/llm/provider.py`) played from a script.

The counterpart of openai-agents' `ScriptedModel`. It plugs into the real runtime through
`Runtime(..., connect=scripted.connect)` (fixture `scripted_agent` in conftest), so tests of the
agent loop, the context and the control plane run without HTTP. Tests of the wire (the SSE parser,
HTTP errors and retries, provider error texts) keep the real-HTTP fake server,
`a3s_agent/testing/fake_llm.py`.

Turns reuse the fake server's helpers (`text`, `tool_call`, `tool_calls`, `Reply` with `delay`,
`chunk_delay` and `break_after`, `hang`, callables of the request body); a turn may also be a domain
error (`ContextOverflow`, `Unavailable`, ...), raised as a provider raises it, and a callable may be
async (see `after`). Like the strict fake, a history every real API refuses (a tool message that
answers no call, a call left unanswered) is refused with InvalidArgument and consumes no turn::

    scripted.script(tool_call("read_file", {"path": "a.txt"}), text("done"))
    ...
    assert scripted.requests[1].messages[-1]["role"] == "tool"
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any

from a3s_agent.base.errors import AgentError, ContextOverflow, InvalidArgument, Unavailable
from a3s_agent.base.models import LLMConfig, Usage
from a3s_agent.llm.provider import CompletionRequest, ProviderEvent, TextDelta, ToolCallReady, TurnEnd
from a3s_agent.testing.fake_llm import Hang, Reply, _message_problem, _pieces, _usage, text

ScriptedTurn = Reply | Hang | AgentError | str | Callable[[dict[str, Any]], Any]
"""A turn to play; a callable gets the request body and returns (or, async, resolves to) a turn."""


@dataclass(frozen=True)
class ScriptedRequest:
    """One model call as the provider received it (a copy: the agent goes on changing its lists)."""

    body: dict[str, Any]
    """The CompletionRequest's fields: model, messages, tools, temperature, ... session_id, workspace."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.body["tools"]

    @property
    def model(self) -> str:
        return self.body["model"]


def overflow(message: str = "This model's maximum context length is 16384 tokens") -> ContextOverflow:
    """A provider's refusal of a prompt longer than the model's window, as the provider reports it."""
    return ContextOverflow(f"the prompt is longer than the model's context window: {message}")


def after(event: asyncio.Event, turn: ScriptedTurn) -> Callable[[dict[str, Any]], Awaitable[ScriptedTurn]]:
    """`turn`, played once `event` is set: the model call stays open until the test lets it go."""

    async def held(_body: dict[str, Any]) -> ScriptedTurn:
        await event.wait()
        return turn

    return held


class ScriptedProvider:
    """Plays one scripted turn per `stream` call and records every request.

    `fallback` is played once the script is exhausted; without one such a call raises Unavailable
    naming the request, so the test fails loudly. Text streams in `text_chunk`-character deltas.
    """

    def __init__(
        self, *turns: ScriptedTurn, fallback: ScriptedTurn | None = None, text_chunk: int = 8
    ) -> None:
        self._turns: deque[ScriptedTurn] = deque(turns)
        self.fallback = fallback
        self.text_chunk = text_chunk
        self.requests: list[ScriptedRequest] = []
        self.configs: list[LLMConfig] = []
        """The LLM configurations the runtime built a provider for (one per endpoint and key)."""
        self.finished = 0
        """Turns the agent consumed to their end (the TurnEnd taken)."""
        self._closed = asyncio.Event()

    def script(self, *turns: ScriptedTurn) -> ScriptedProvider:
        """Append turns; each model call plays the next one."""
        self._turns.extend(turns)
        return self

    @property
    def remaining(self) -> int:
        return len(self._turns)

    def connect(self, llm: LLMConfig) -> ScriptedProvider:
        """The runtime's provider factory (`Runtime(..., connect=...)`): every endpoint is this model."""
        self.configs.append(llm)
        return self

    async def close(self) -> None:
        """End the turns hanging now; a runtime started later with this model waits afresh."""
        self._closed.set()
        self._closed = asyncio.Event()

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        # A copy, as the wire would carry it: the agent goes on appending to its conversation.
        body = json.loads(json.dumps({f.name: getattr(request, f.name) for f in fields(request)}))
        self.requests.append(ScriptedRequest(body))
        problem = _message_problem(body["messages"])
        if problem is not None:
            raise InvalidArgument(f"the scripted model refused the request: {problem}")
        turn = await self._next_turn(body)
        if isinstance(turn, AgentError):
            raise turn
        if isinstance(turn, Hang):
            await self._wait(turn.seconds)
            raise Unavailable(f"the scripted model hung for {turn.seconds:g} s")
        await self._wait(turn.delay)
        async for event in self._events(body, turn):
            yield event
        self.finished += 1

    async def _next_turn(self, body: dict[str, Any]) -> Reply | Hang | AgentError:
        if self._turns:
            turn: Any = self._turns.popleft()
        elif self.fallback is not None:
            turn = self.fallback
        else:
            raise Unavailable(
                f"scripted model exhausted: call #{len(self.requests)} arrived but no turn is left "
                "and no fallback is set"
            )
        while callable(turn):
            turn = turn(body)
            if inspect.isawaitable(turn):
                turn = await turn
        if isinstance(turn, str):
            return text(turn)
        if not isinstance(turn, Reply | Hang | AgentError):
            raise TypeError(
                f"not a scripted turn: {turn!r} (wire-level turns need a3s_agent/testing/fake_llm.py)"
            )
        return turn

    async def _events(self, body: dict[str, Any], reply: Reply) -> AsyncIterator[ProviderEvent]:
        """The reply as a provider streams it; `break_after` events and then a broken-off reply."""
        events: list[ProviderEvent] = []
        if reply.content:
            events += [TextDelta(piece) for piece in _pieces(reply.content, self.text_chunk)]
        number = len(self.requests)
        events += [
            ToolCallReady(call.id or f"call_{number}_{index}", call.name, call.arguments_json())
            for index, call in enumerate(reply.tool_calls)
        ]
        for count, event in enumerate(events):
            if reply.break_after is not None and count >= reply.break_after:
                raise Unavailable("the scripted model's reply broke off")
            if count and reply.chunk_delay:
                await self._wait(reply.chunk_delay)
            yield event
        usage = _usage(body, reply)
        finish_reason = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        yield TurnEnd(finish_reason, Usage(usage["prompt_tokens"], usage["completion_tokens"]))

    async def _wait(self, seconds: float) -> None:
        """Sleep (part of the scenario), cut short when the provider is closed."""
        if seconds > 0:
            try:
                await asyncio.wait_for(self._closed.wait(), seconds)
            except TimeoutError:
                pass
