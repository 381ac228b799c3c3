"""The A2A routes of the HTTP face (server.py passes them in, as /mcp's): the agent card at the
well-known path, open as the probes are so that a client learns the token it needs, and JSON-RPC
at /a2a, behind the face's token, guard and readiness gate, served by the SDK's dispatcher driven
from aiohttp (faces/asgi.py).

A message to a task that is working steers it: the run takes it in at its next safe point and
answers it (app.control.steer), and the message is answered with the task as it is.

A resubscription to a working task whose turn runs here taps that turn (the SDK's way); to one
whose turn does not (its server stopped, or another replica runs it) it gets the stored task and
then a turn of its own that follows the run on from the last chunk that task holds (executor.py):
what it was shown and what follows meet at that seq, so nothing is lost or shown twice."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from a2a.helpers.proto_helpers import get_message_text
from a2a.server.agent_execution import RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryPushNotificationConfigStore,
)
from a2a.types.a2a_pb2 import (
    AgentCard,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from aiohttp import web
from starlette.applications import Starlette

from ...app import Application
from ...base.errors import FailedPrecondition
from ..asgi import serve_asgi
from .card import RPC_PATH, agent_card
from .executor import Executor
from .tasks import StoredTasks

CARD_PATH = AGENT_CARD_WELL_KNOWN_PATH


class A2aHttp:
    def __init__(self, app: Application) -> None:
        self._app = app
        self._handler: Steering | None = None
        self._rpc: Starlette | None = None

    def routes(self) -> list[web.RouteDef]:
        return [web.get(CARD_PATH, self._card), web.post(RPC_PATH, self._call)]

    async def _card(self, request: web.Request) -> web.Response:
        card = await agent_card(self._app, f"{request.scheme}://{request.host}")
        return web.json_response(agent_card_to_dict(card))

    async def _call(self, request: web.Request) -> web.StreamResponse:
        if self._rpc is None:
            card = await agent_card(self._app, f"{request.scheme}://{request.host}", extended=True)
            self._handler = Steering(self._app, card)
            self._rpc = Starlette(routes=create_jsonrpc_routes(self._handler, RPC_PATH))
        return await serve_asgi(request, self._rpc)

    async def stop(self) -> None:
        """End the tasks' turns still going (their runs are stopped with the server's)."""
        if self._handler is not None:
            await self._handler.aclose()


class Steering(DefaultRequestHandler):
    """The SDK's handler over our executor, with a message to a working task taken as a steer."""

    def __init__(self, app: Application, card: AgentCard) -> None:
        self._tasks = StoredTasks(app.a2a_tasks, app.lifecycle.settings.a2a_max_tasks)
        self._executor = Executor(app)
        self._pushing = None
        push: dict[str, Any] = {}
        if app.push.offered:  # to the operator's URLs only, through the checked fetcher
            configs = InMemoryPushNotificationConfigStore()
            self._pushing = app.push.client()
            sender = BasePushNotificationSender(self._pushing, configs, push_url_validator=app.push.allowed)
            push = {
                "push_config_store": configs,
                "push_sender": sender,
                "push_url_validator": app.push.allowed,
            }
        super().__init__(
            self._executor,
            self._tasks,
            card,
            extended_agent_card=card,
            extended_card_modifier=self._extended,
            **push,
        )
        self._app = app

    async def _extended(self, card: AgentCard, context: ServerCallContext) -> AgentCard:
        """The card for a client with the token, as the server's agents and skills are now."""
        base = card.supported_interfaces[0].url.removesuffix(RPC_PATH)
        return await agent_card(self._app, base, extended=True)

    async def aclose(self) -> None:
        await super().aclose()
        await self._tasks.aclose()
        if self._pushing is not None:
            await self._pushing.aclose()

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        steered = await self._steer(params, context)
        return steered if steered is not None else await super().on_message_send(params, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        steered = await self._steer(params, context)
        if steered is not None:
            yield steered
            return
        async for event in super().on_message_send_stream(params, context):
            yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        task = await self._tasks.get(params.id, context)
        if (
            task is None
            or task.status.state != TaskState.TASK_STATE_WORKING
            or task.id in self._executor.turning
        ):
            async for event in super().on_subscribe_to_task(params, context):
                yield event
            return
        active = await self._active_task_registry.get_or_create(task.id, call_context=context)
        follow = RequestContext(context, task_id=task.id, context_id=task.context_id)
        # The turn's first status update comes as the task it applies to: the one the turn follows
        # on from, shown first as the protocol wants; later ones as the updates they are.
        shown = False
        async for event in active.subscribe(request=follow, replace_status_update_with_task=True):
            if shown and isinstance(event, Task):
                yield TaskStatusUpdateEvent(
                    task_id=event.id, context_id=event.context_id, status=event.status
                )
            else:
                yield event
            shown = True
        if not shown:  # another turn ended the task meanwhile
            yield await self._tasks.get(task.id, context) or task

    async def _steer(self, params: SendMessageRequest, context: ServerCallContext) -> Task | None:
        """The task, when the message names one that is working and its run took the message in."""
        if not params.message.task_id:
            return None
        task = await self._tasks.get(params.message.task_id, context)
        if task is None or task.status.state != TaskState.TASK_STATE_WORKING:
            return None
        text = get_message_text(params.message)
        if not text.strip():
            return None
        try:
            await self._app.control.steer(task.context_id, text)
        except FailedPrecondition:  # the run has given its answer: the message goes as the SDK sends it
            return None
        return task
