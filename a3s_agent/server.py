"""Assembles the runtime and the gRPC listener, and runs until SIGTERM/SIGINT or a Shutdown RPC."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from .config import Settings, exposed_listeners
from .faces.auth import BearerTokenInterceptor
from .faces.grpc.service import add_to_server
from .faces.refusals import RefusalLog
from .proto import code_agent_pb2 as pb
from .runtime import Runtime
from .tools.builtin import builtin_registry

log = logging.getLogger(__name__)

AGENT_SERVICE = pb.DESCRIPTOR.services_by_name["CodeAgentService"].full_name
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class BindError(RuntimeError):
    """The listen address could not be bound (usually: already in use)."""


class AgentServer:
    """The grpc.aio server with CodeAgentService, grpc.health.v1 and reflection (v1alpha and v1);
    TLS when the settings name a certificate and key."""

    def __init__(self, runtime: Runtime, refusals: RefusalLog | None = None) -> None:
        self.runtime = runtime
        self.refusals = refusals or RefusalLog()
        token = runtime.settings.auth_token
        self.server = grpc.aio.server(
            interceptors=[BearerTokenInterceptor(token, self.refusals)] if token else None,
            options=[
                # Never share a port with another process: a taken port must be an error.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self.service = add_to_server(runtime, self.server)
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
        settings = self.runtime.settings
        try:
            if settings.tls_cert and settings.tls_key:
                pair = (settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())
                self.port = self.server.add_secure_port(address, grpc.ssl_server_credentials([pair]))
            else:
                self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise BindError(
                f"cannot listen on {address}: the address is already in use or not available"
                " (choose another with --listen or LISTEN_ADDR)"
            ) from exc
        return self.port

    async def start(self) -> None:
        await self.server.start()
        for name in ("", AGENT_SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        """Graceful stop: health NOT_SERVING, refuse new calls, let in-flight ones finish."""
        self.runtime.shutting_down = True
        await self.health.enter_graceful_shutdown()
        self.runtime.events.close()  # event streams end now; they would otherwise use up the grace
        await self.server.stop(grace_s)


def raise_open_file_limit() -> None:
    """Every connection, session database and tool pipe is a file descriptor: allow the most we may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.debug("open files limit stays %d (hard limit %d): %s", soft, hard, exc)
        return
    log.debug("open files limit raised from %d to the hard limit %d", soft, hard)


async def run(settings: Settings) -> int:
    """Serve until asked to stop; the exit code of `a3s-agent serve`."""
    raise_open_file_limit()
    if not settings.auth_token:
        for listener in exposed_listeners(settings):  # check_serving let it through: the operator opted in
            log.warning(
                "serving %s WITHOUT a token (--allow-unauthenticated): anyone who can reach it can"
                " run commands here",
                listener,
            )
    runtime = Runtime(settings, registry=builtin_registry())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # first: a stop during start-up is a graceful one too
        loop.add_signal_handler(sig, runtime.shutdown_requested.set)
    refusals = RefusalLog()  # one for both faces: a flood on one cannot hide refusals on the other
    server = AgentServer(runtime, refusals)
    try:
        port = server.bind(settings.listen)
    except BindError as exc:
        log.error("%s", exc)
        return 2
    await runtime.start()
    await server.start()  # gRPC (and so health) first; the HTTP face follows
    # Imported only now: aiohttp's import is a good part of the start-up time.
    from .faces.http import HttpBindError, HttpListener, start_http
    from .faces.http.spaces import spaces_routes
    from .spaces import Spaces

    spaces = Spaces(
        settings.resolved_data_dir,
        runtime.registry,
        env=lambda: runtime.init.env,
        max_runs=settings.max_space_runs,
    )
    await spaces.open()
    http: HttpListener | None = None
    if settings.http_listen != "off":
        try:
            routes = spaces_routes(runtime, spaces)
            http = await start_http(
                runtime, server.service, settings.http_listen, extra_routes=routes, refusals=refusals
            )
        except HttpBindError as exc:
            log.error("%s", exc)
            await server.stop(0)
            await spaces.close()
            await runtime.close()
            return 2
    host = settings.listen.rsplit(":", 1)[0]
    scheme = "TLS" if settings.tls_cert else "plaintext"
    log.info("a3s-agent %s serving on %s:%d (%s)", runtime.info.version, host, port, scheme)
    if http is not None:
        http_host = settings.http_listen.rsplit(":", 1)[0]
        log.info("HTTP (REST, server-sent events, WebSocket, /healthz) on %s:%d", http_host, http.port)
    coven = None
    if settings.coven_gateway:
        from .faces.coven import default_name, run_coven_agent

        coven_stop = asyncio.Event()
        coven = asyncio.create_task(
            run_coven_agent(
                runtime, settings.coven_gateway, name=default_name(), agent_id=None, stop=coven_stop
            )
        )
        log.info("coven agent connecting to %s", settings.coven_gateway)
    await runtime.shutdown_requested.wait()
    if coven is not None:
        coven_stop.set()
        await coven
    log.info("shutting down (grace %.0fs)", settings.grace_seconds)
    await asyncio.gather(server.stop(settings.grace_seconds), *([http.stop()] if http else []))
    await spaces.close()
    await runtime.close()
    log.info("stopped")
    return 0
