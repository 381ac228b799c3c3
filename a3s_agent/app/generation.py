"""Generation, plain and structured: as a stream of domain events or as the final result."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from ..base.models import Message
from ..core.agent import AgentEvent, DoneEvent, GenerateOptions
from ..core.agent import Generation as Result
from ..core.structured import StructuredDone, run_structured
from ..runtime import Runtime


class Generation:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def stream(
        self, session_id: str, messages: list[Message], options: GenerateOptions
    ) -> AsyncGenerator[AgentEvent, None]:
        """The generation's events as they happen, a DoneEvent last."""
        return self._rt.agent.run(session_id, messages, options)

    async def generate(self, session_id: str, messages: list[Message], options: GenerateOptions) -> Result:
        async for event in self.stream(session_id, messages, options):
            if isinstance(event, DoneEvent):
                return event.generation
        raise AssertionError("the agent loop ended without a result")

    async def stream_structured(
        self, session_id: str, messages: list[Message], options: GenerateOptions, schema: str
    ) -> AsyncIterator[AgentEvent | StructuredDone]:
        """Events until the answer validates against `schema` (JSON Schema text); StructuredDone last."""
        async for event in run_structured(self._rt.agent, session_id, messages, options, schema):
            yield event

    async def generate_structured(
        self, session_id: str, messages: list[Message], options: GenerateOptions, schema: str
    ) -> StructuredDone:
        async for event in self.stream_structured(session_id, messages, options, schema):
            if isinstance(event, StructuredDone):
                return event
        raise AssertionError("structured generation ended without a result")
