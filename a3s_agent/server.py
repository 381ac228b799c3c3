"""Assembles the runtime, the application layer over it and the faces, and runs until
SIGTERM/SIGINT or a Shutdown RPC.

Start-up: every face binds (gRPC, HTTP) and the coven agent starts connecting before anything
reports ready; a face that cannot bind ends the start with exit 2. Stop: health says NOT_SERVING
(and stays answerable), new work is refused, calls in flight get the grace period, then are
cancelled with a reason; see faces/readiness.py."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from .app import Application
from .base import metrics, telemetry
from .base.errors import Unavailable
from .config import Settings, exposed_listeners
from .faces.grpc.auth import BearerTokenInterceptor
from .faces.grpc.readiness import ReadinessInterceptor
from .faces.grpc.service import add_to_server
from .faces.grpc.tracing import TracingInterceptor
from .faces.open_files import (
    TooFewOpenFiles,
    fit_connection_caps,
    listening_addresses,
    log_accept_errors_sparsely,
    raise_open_file_limit,
)
from .faces.readiness import Readiness
from .faces.refusals import RefusalLog
from .proto import code_agent_pb2 as pb
from .runtime import Runtime, gauges
from .runtime.warmup import WarmUp
from .tools.builtin import builtin_registry

if TYPE_CHECKING:
    from .faces.a2a import A2aHttp
    from .faces.mcp import McpHttp

log = logging.getLogger(__name__)

AGENT_SERVICE = pb.DESCRIPTOR.services_by_name["CodeAgentService"].full_name
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
FLUSH_S = 1.0
"""After the drain: how long grpc may take to send the last statuses before it drops connections."""
HANDSHAKE_TIMEOUT_S = 5.0
"""From the accept to the client's HTTP/2 settings, the TLS handshake included (as the HTTP face's
header timeout): a connection silent for longer is closed."""


class BindError(RuntimeError):
    """The gRPC address could not be bound (usually: already in use)."""


class AgentServer:
    """The grpc.aio server with CodeAgentService, grpc.health.v1 and reflection (v1alpha and v1);
    TLS when the settings name a certificate and key. Health says SERVING only after `start`, which
    the server calls once every other face listens too."""

    def __init__(self, app: Application, refusals: RefusalLog | None = None) -> None:
        self.app = app
        self.refusals = refusals or RefusalLog()
        self.readiness = Readiness(app.lifecycle)
        settings = app.lifecycle.settings
        token = settings.auth_token
        # grpc caps each listening socket on its own: the cap is shared among them.
        per_address = max(1, settings.max_grpc_connections // listening_addresses(settings.listen))
        self.server = grpc.aio.server(
            interceptors=[  # the token first: only an authenticated caller learns the phase
                *([TracingInterceptor()] if telemetry.enabled() else []),  # a span for refused calls too
                *([BearerTokenInterceptor(token, self.refusals)] if token else []),
                ReadinessInterceptor(self.readiness),
            ],
            options=[
                # Never share a port with another process: a taken port must be an error.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # A connection over the cap is closed as soon as it is accepted.
                ("grpc.max_allowed_incoming_connections", per_address),
                ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
            ],
        )
        add_to_server(app, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [AGENT_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1]
        reflection.enable_server_reflection(names, self.server)
        self._add_reflection_v1(names)
        self.port = 0

    def _add_reflection_v1(self, names: list[str]) -> None:
        """grpcio-reflection serves only v1alpha; v1 has the same messages, so serve it too."""
        servicer = ReflectionServicer(names)
        handler = grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
        )

    def bind(self, address: str) -> int:
        settings = self.app.lifecycle.settings
        try:
            if settings.tls_cert and settings.tls_key:
                pair = (settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())
                self.port = self.server.add_secure_port(address, grpc.ssl_server_credentials([pair]))
            else:
                self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise BindError(
                f"cannot listen for gRPC on {address}: the address is already in use or not available"
                " (choose another with --listen or LISTEN_ADDR)"
            ) from exc
        return self.port

    async def start(self) -> None:
        """Accept calls and report ready: call it once every face listens."""
        for name in ("", AGENT_SERVICE):  # grpc's servicer starts with "" SERVING
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        self.readiness.mark_ready()
        for name in ("", AGENT_SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        """Graceful stop. The listener stays open through the grace (grpc's own stop would close
        it at once): health answers NOT_SERVING, new calls get UNAVAILABLE, calls in flight (on
        every face sharing `readiness`) get `grace_s`, then are cancelled, their tools with them."""
        self.readiness.begin_stop()
        await self.health.enter_graceful_shutdown()
        self.app.events.end_all()  # event streams end now; they would otherwise use up the grace
        cancelled = await self.readiness.drain(grace_s)
        if cancelled:
            log.warning("cancelled %d calls still running at the end of the %.0f s grace", cancelled, grace_s)
        await self.app.generation.stop_runs()  # those whose client went away too
        await self.server.stop(FLUSH_S)


async def run(settings: Settings) -> int:
    """Serve until asked to stop; the exit code of `a3s-agent serve`."""
    try:
        settings = fit_connection_caps(settings, raise_open_file_limit())
    except TooFewOpenFiles as exc:
        log.error("%s", exc)
        return 2
    log_accept_errors_sparsely(asyncio.get_running_loop())
    if not settings.auth_token:
        for listener in exposed_listeners(settings):  # check_serving let it through: the operator opted in
            log.warning(
                "serving %s WITHOUT a token (--allow-unauthenticated): anyone who can reach it can"
                " run commands here",
                listener,
            )
    if settings.mcp_tools and not settings.mcp_http:
        log.warning(
            "--mcp-tools (A3S_MCP_TOOLS) does nothing without --mcp-http: this server offers no MCP tools"
        )
    runtime = Runtime(settings, registry=builtin_registry())
    app = Application(runtime)
    if telemetry.configure(app.lifecycle.info.version):  # before the faces: they trace only then
        log.info("exporting traces over OTLP/HTTP (the OTEL_* variables configure it)")
    if metrics.configure(app.lifecycle.info.version, settings.prometheus_metrics, settings.model_prices):
        gauges.observe(runtime)
        if metrics.wanted():
            log.info("exporting metrics over OTLP/HTTP (the OTEL_* variables configure it)")
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # first: a stop during start-up is a graceful one too
        loop.add_signal_handler(sig, app.lifecycle.request_shutdown)
    refusals = RefusalLog()  # one for both faces: a flood on one cannot hide refusals on the other
    server = AgentServer(app, refusals)
    try:
        port = server.bind(settings.listen)
    except BindError as exc:
        log.error("%s", exc)
        return 2
    try:
        await runtime.start()
    except Unavailable as exc:  # the store cannot be reached: say why, no traceback
        log.error("%s", exc)
        await runtime.close()
        return 1
    # Imported only now: aiohttp's import is a good part of the start-up time.
    from .faces.http import HttpBindError, HttpListener, start_http
    from .faces.http.metrics_route import metrics_routes
    from .faces.http.spaces import spaces_routes

    mcp = _mcp_http(app) if settings.mcp_http else None
    a2a = _a2a(app) if settings.a2a else None
    http: HttpListener | None = None
    if settings.http_listen != "off":
        try:
            http = await start_http(
                app,
                settings.http_listen,
                extra_routes=[
                    *spaces_routes(app),
                    *(mcp.routes() if mcp else []),
                    *(metrics_routes() if settings.prometheus_metrics else []),
                    *(a2a.routes() if a2a else []),
                ],
                refusals=refusals,
                readiness=server.readiness,  # /health/ready says 503 until gRPC starts below
            )
        except HttpBindError as exc:
            log.error("%s", exc)
            await server.stop(0)  # never started: nothing has said SERVING
            await runtime.close()
            return 2
    coven = _Coven(app, settings.coven_gateway) if settings.coven_gateway else None
    await server.start()  # last: health says SERVING only now
    warm_up = WarmUp(runtime)  # after ready, in the background: it must not delay readiness
    warm_up.start()
    host = settings.listen.rsplit(":", 1)[0]
    scheme = "TLS" if settings.tls_cert else "plaintext"
    log.info("a3s-agent %s serving on %s:%d (%s)", app.lifecycle.info.version, host, port, scheme)
    if http is not None:
        http_host = settings.http_listen.rsplit(":", 1)[0]
        log.info(
            "HTTP (REST, server-sent events, WebSocket, /healthz, /health/ready) on %s:%d",
            http_host,
            http.port,
        )
        if mcp is not None:
            log.info("MCP server (Streamable HTTP) at /mcp on the HTTP listener")
        if a2a is not None:
            log.info("A2A at /a2a on the HTTP listener (card at /.well-known/agent-card.json)")
    await app.lifecycle.shutdown_requested()
    log.info("shutting down (grace %gs)", settings.grace_seconds)
    await warm_up.stop()
    await asyncio.gather(server.stop(settings.grace_seconds), *([coven.stop()] if coven else []))
    if http is not None:
        await http.stop()  # after the drain: /health/ready answered 503 all through it
    if mcp is not None:
        await mcp.stop()  # its sessions' calls had the grace as requests of the HTTP face
    if a2a is not None:
        await a2a.stop()
    await runtime.close()  # Agent Spaces runs still going are cancelled first
    await asyncio.to_thread(telemetry.shutdown)  # the last spans exported (the exporter's timeout)
    await asyncio.to_thread(metrics.shutdown)  # the last metrics exported
    log.info("stopped")
    return 0


def _mcp_http(app: Application) -> McpHttp:
    from .faces.mcp import McpHttp  # imported only when asked for: the mcp SDK is slow to import

    return McpHttp(app, app.lifecycle.settings.mcp_tools)


def _a2a(app: Application) -> A2aHttp:
    from .faces.a2a import A2aHttp  # imported only when asked for: the a2a SDK is slow to import

    return A2aHttp(app)


class _Coven:
    """The coven agent beside the server. It counts as listening once it has started connecting:
    a gateway that is down must not keep the gRPC and HTTP faces from reporting ready."""

    def __init__(self, app: Application, gateway: str) -> None:
        from .faces.coven import default_name, run_coven_agent

        self._stop = asyncio.Event()
        self._task = asyncio.create_task(
            run_coven_agent(app, gateway, name=default_name(), agent_id=None, stop=self._stop)
        )
        log.info("coven agent connecting to %s", gateway)

    async def stop(self) -> None:
        self._stop.set()
        await self._task
