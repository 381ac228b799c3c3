"""The later dialect's server-side agentic loop and delegation over HTTP (the streaming two as SSE),
as faces/grpc/later_agentic.py serves them over gRPC (faces/later_service.py builds both faces'
replies and events)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from ...app import Application
from ...app.agentic import Item
from .. import later_service as groups
from .convert import Given, Plain
from .rpc_table import Handlers, Started

HANDLERS = Handlers()


@HANDLERS.rpc("AgenticGenerate")
async def _agentic_generate(app: Application, request: Given) -> Plain:
    return groups.agentic_reply(request["session_id"], await groups.outcome(_generate(app, request)))


@HANDLERS.streams("StreamAgenticGenerate")
async def _stream_agentic_generate(
    app: Application, request: Given, started: Started
) -> AsyncIterator[Plain]:
    async for fields in groups.agentic_events(request["session_id"], _generate(app, request)):
        started()  # at its first event: the run has begun (a Cancel sent after it finds it)
        yield fields


@HANDLERS.rpc("Delegate")
async def _delegate(app: Application, request: Given) -> Plain:
    return groups.delegate_reply(request["session_id"], await groups.outcome(_delegation(app, request)))


@HANDLERS.streams("StreamDelegate")
async def _stream_delegate(app: Application, request: Given, started: Started) -> AsyncIterator[Plain]:
    async for fields in groups.agentic_events(
        request["session_id"], _delegation(app, request), delegation=True
    ):
        started()
        yield fields


def _generate(app: Application, request: Given) -> AsyncIterator[Item]:
    return groups.agentic_generate(
        app, request["session_id"], request["prompt"], request["strategy"], request["max_steps"],
        request["planning"], request["reflection"],
    )  # fmt: skip


def _delegation(app: Application, request: Given) -> AsyncIterator[Item]:
    return app.agentic.delegate(
        request["session_id"], request["agent_name"], request["task"], max_steps=request["max_steps"],
        allowed_tools=tuple(request["allowed_tools"]),
    )  # fmt: skip
