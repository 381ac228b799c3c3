"""The coven agent: connects out to the gateway, registers (with an id that survives restarts),
serves the gateway's requests through the application layer, and reconnects with capped exponential
backoff when the stream breaks."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field

import grpc

from ...app import Application
from ...app.types import ConfirmationPolicy
from ...base.backoff import Backoff
from ...proto import coven_pb2 as pb
from ...proto import coven_pb2_grpc as pb_grpc
from .register import registration, stored_agent_id
from .stream import CovenStream, Ending
from .threads import Threads

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Status codes that retrying cannot fix when they come before the gateway welcomed the agent.
FATAL_CODES = frozenset(
    {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INVALID_ARGUMENT,
     grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
)  # fmt: skip


def default_name() -> str:
    return f"a3s-agent@{socket.gethostname()}"


@dataclass
class CovenConfig:
    """How to reach the gateway and present the agent to it.

    `agent_id` None means the id stored in the server's data dir. `approval`, when set, is the
    confirmation policy every new thread session starts with (tools then wait for the gateway's
    ToolApprovalResponse); None leaves sessions as a3s makes them, confirmation off.
    """

    gateway: str
    name: str = field(default_factory=default_name)
    agent_id: str | None = None
    capabilities: tuple[str, ...] = ("chat", "code")
    workspaces: tuple[str, ...] = ()
    approval: ConfirmationPolicy | None = None
    heartbeat_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


RECONNECT_JITTER = 0.2  # each reconnect delay is 80-100% of the exponential one


async def _pause(stop: asyncio.Event, delay_s: float) -> None:
    """Sleep `delay_s`, or less if `stop` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
    except TimeoutError:
        pass


class CovenAgent:
    def __init__(self, app: Application, config: CovenConfig) -> None:
        self._app = app
        self._config = config
        self._threads = Threads(app.sessions, config.approval)

    async def run(self, stop: asyncio.Event) -> int:
        """Serve the gateway until `stop` is set (0), it sends Shutdown (0), or it refuses the
        agent (1, with the reason logged). A RegistrationError with a suggested_id is retried
        once with that id, which is then kept for reconnects (not stored: the stored id stays)."""
        config = self._config
        agent_id = config.agent_id or stored_agent_id(self._app.lifecycle.data_dir)
        backoff = Backoff(config.backoff_initial_s, config.backoff_max_s, jitter=RECONNECT_JITTER)
        tried_suggestion = False
        while not stop.is_set():
            try:
                outcome = await self._connect(agent_id, stop)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in FATAL_CODES:
                    log.error(
                        "gateway %s refused the stream: %s %s", config.gateway, exc.code().name, exc.details()
                    )
                    return 1
                log.warning("gateway %s: %s %s", config.gateway, exc.code().name, exc.details())
            except (ConnectionError, TimeoutError, asyncio.InvalidStateError) as exc:
                log.warning("gateway %s: %s", config.gateway, exc or type(exc).__name__)
            else:
                if isinstance(outcome, pb.RegistrationError):
                    log.error("the gateway refused agent %s: %s", agent_id, outcome.reason)
                    if not outcome.suggested_id or tried_suggestion:
                        return 1
                    tried_suggestion = True
                    agent_id = outcome.suggested_id
                    log.info("registering again with the gateway's suggested id %s", agent_id)
                    continue
                if outcome is not Ending.DISCONNECTED:
                    log.info("coven agent %s: %s", agent_id, outcome.value)
                    return 0
                backoff.reset()  # it was welcomed: a new run of failures starts from the first delay
                log.warning("lost the gateway %s; reconnecting", config.gateway)
            await _pause(stop, backoff.next_s())
        return 0

    async def _connect(self, agent_id: str, stop: asyncio.Event) -> Ending | pb.RegistrationError:
        """One stream: register, then serve until it ends. Status errors come only before Welcome."""
        config = self._config
        async with _channel(config.gateway) as channel:
            call = pb_grpc.CovenControlStub(channel).AgentStream()
            stream = CovenStream(self._app, call, self._threads, config.heartbeat_s)
            register = await registration(
                agent_id, config.name, config.capabilities, config.workspaces, self._app.lifecycle.workspace
            )
            answer = await stream.register(register)
            if answer.HasField("registration_error"):
                return answer.registration_error
            self._welcome(answer.welcome)
            return await stream.serve(stop)

    def _welcome(self, welcome: pb.Welcome) -> None:
        log.info(
            "registered with gateway %s as %s (instance %s)",
            welcome.server_id, welcome.agent_id, welcome.instance_id,
        )  # fmt: skip
        if welcome.secrets:
            self._app.lifecycle.add_tool_env(welcome.secrets)  # tools get them as environment variables
            log.info("gateway secrets set for tools: %s", ", ".join(sorted(welcome.secrets)))
        if welcome.available_tools:
            names = ", ".join(t.name for t in welcome.available_tools)
            log.info("gateway pack tools (not offered to the model): %s", names)


def _channel(gateway: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        gateway,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )


async def run_coven_agent(
    app: Application, gateway: str, *, name: str, agent_id: str | None, stop: asyncio.Event
) -> int:
    """`a3s-agent coven`: serve the gateway at HOST:PORT until stopped; the exit code."""
    return await CovenAgent(app, CovenConfig(gateway=gateway, name=name, agent_id=agent_id)).run(stop)
