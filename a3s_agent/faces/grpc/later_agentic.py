"""The later dialect's server-side agentic loop and delegation (a3s-string-dialect.md 4.11): each RPC
a conversion of code_agent_later_pb2's messages around `app.agentic` (app/agentic.py says what the
runs do; faces/later_service.py builds the replies and events both faces send)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ...app import Application
from ...app.agentic import Item
from ...proto import code_agent_later_pb2 as later
from .. import later_service as groups
from .errors import rpc


class LaterAgenticService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def AgenticGenerate(
        self, request: later.AgenticGenerateRequest, context: Any
    ) -> later.AgenticGenerateResponse:
        done = await groups.outcome(self._generate(request))
        return later.AgenticGenerateResponse(**groups.agentic_reply(request.session_id, done))

    @rpc
    async def StreamAgenticGenerate(
        self, request: later.AgenticGenerateRequest, context: Any
    ) -> AsyncIterator[later.AgenticGenerateEvent]:
        async for fields in groups.agentic_events(request.session_id, self._generate(request)):
            yield later.AgenticGenerateEvent(**fields)

    @rpc
    async def Delegate(self, request: later.DelegateRequest, context: Any) -> later.DelegateResponse:
        done = await groups.outcome(self._delegate(request))
        return later.DelegateResponse(**groups.delegate_reply(request.session_id, done))

    @rpc
    async def StreamDelegate(
        self, request: later.DelegateRequest, context: Any
    ) -> AsyncIterator[later.AgenticGenerateEvent]:
        async for fields in groups.agentic_events(
            request.session_id, self._delegate(request), delegation=True
        ):
            yield later.AgenticGenerateEvent(**fields)

    def _generate(self, request: later.AgenticGenerateRequest) -> AsyncIterator[Item]:
        return groups.agentic_generate(
            self.app, request.session_id, request.prompt, request.strategy, request.max_steps,
            request.planning, request.reflection,
        )  # fmt: skip

    def _delegate(self, request: later.DelegateRequest) -> AsyncIterator[Item]:
        return self.app.agentic.delegate(
            request.session_id, request.agent_name, request.task, max_steps=request.max_steps,
            allowed_tools=tuple(request.allowed_tools),
        )  # fmt: skip
