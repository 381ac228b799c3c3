"""Generation, plain and structured: as a stream of domain events or as the final result.

`chunks` and `generate` run on when their caller goes away (runtime/runs.py): each event is in
the session's log with its seq before the caller sees it, and a caller that lost its stream
resumes it from the last seq it saw. `stream` runs in the caller's task."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from ..base.models import Message
from ..core.loop.agent import AgentEvent, DoneEvent, GenerateOptions
from ..core.loop.agent import Generation as Result
from ..core.loop.structured import StructuredDone, run_structured
from ..runtime import Runtime
from ..runtime.runs import Chunk


class Generation:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def chunks(
        self, session_id: str, messages: list[Message], options: GenerateOptions, after_seq: int | None = None
    ) -> AsyncIterator[Chunk]:
        """The generation's events with their seqs as they are committed, a DoneEvent last. With
        `after_seq` nothing starts: the run that wrote that chunk is followed from the next one
        (`messages` and `options` are not used)."""
        async for chunk in await self.follow(session_id, messages, options, after_seq):
            yield chunk

    async def follow(
        self, session_id: str, messages: list[Message], options: GenerateOptions, after_seq: int | None = None
    ) -> AsyncIterator[Chunk]:
        """`chunks` for a caller that must know when the generation has started (its first event
        is committed) or, with `after_seq`, its run is found: it returns then. Iterate what it
        returns at once: its subscription is closed when that iteration ends."""
        if after_seq is None:
            return await self._rt.runs.start(session_id, messages, options)
        return await self._rt.runs.resume(session_id, after_seq)

    async def follow_run(self, session_id: str, run_id: str, after_seq: int) -> AsyncIterator[Chunk]:
        """The chunks of the run `run_id` after `after_seq`, to its end (see Runs.follow_run)."""
        return await self._rt.runs.follow_run(session_id, run_id, after_seq)

    async def stop_runs(self) -> None:
        """Stop every run still going (at a stop, once the grace is over): their tools are killed
        and each one's stream ends with the reason."""
        await self._rt.runs.stop()

    async def stream(
        self, session_id: str, messages: list[Message], options: GenerateOptions
    ) -> AsyncGenerator[AgentEvent, None]:
        """A generation run by the caller's task, its events as they happen and a DoneEvent last:
        it stops when the caller goes away (for faces that stop it themselves: coven, ACP, MCP)."""
        await self._rt.sessions.refresh(session_id)
        async for event in self._rt.agent.run(session_id, messages, options):
            yield event

    async def generate(self, session_id: str, messages: list[Message], options: GenerateOptions) -> Result:
        """The result of a generation that runs on if the caller goes away (as `chunks`)."""
        async for event, _ in self.chunks(session_id, messages, options):
            if isinstance(event, DoneEvent):
                return event.generation
        raise AssertionError("the agent loop ended without a result")

    async def stream_structured(
        self, session_id: str, messages: list[Message], options: GenerateOptions, schema: str
    ) -> AsyncIterator[AgentEvent | StructuredDone]:
        """Events until the answer validates against `schema` (JSON Schema text); StructuredDone last."""
        await self._rt.sessions.refresh(session_id)
        async for event in run_structured(self._rt.agent, session_id, messages, options, schema):
            yield event

    async def generate_structured(
        self, session_id: str, messages: list[Message], options: GenerateOptions, schema: str
    ) -> StructuredDone:
        async for event in self.stream_structured(session_id, messages, options, schema):
            if isinstance(event, StructuredDone):
                return event
        raise AssertionError("structured generation ended without a result")
