"""A flood of idle and slowloris connections on the HTTP port of a real `a3s-agent serve` started
with 1,024 open files: gRPC and its health checks keep answering, HTTP answers again once the slow
connections time out, and the log stays short."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent.base.sparse_log import LINES_PER_WINDOW, WINDOW_S
from a3s_agent.config import DEFAULT_MAX_HTTP_CONNECTIONS
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.flood import FLOOD, Flood

from ..conftest import eventually
from .flood import healthz, limited_to, raise_own_open_files_limit
from .test_listeners import GuardedServer
from .test_listeners import servers as servers  # the fixture that kills them

pytestmark = pytest.mark.security

_REFUSAL_LINE = re.compile(r"refused HTTP connection|more requests refused")
_CAP_FULL = f"{DEFAULT_MAX_HTTP_CONNECTIONS} HTTP connections are open (max_http_connections)"


def _grpc_answers(server: GuardedServer) -> tuple[int, int]:
    """HealthCheck and grpc.health.v1 over a new connection, made during the flood."""
    with server.channel() as channel:
        agent = pb_grpc.CodeAgentServiceStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=20)
        standard = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=20)
    return agent.status, standard.status


@pytest.mark.parametrize("hard_limit_too", [False, True], ids=["soft-1024", "soft-and-hard-1024"])
async def test_a_connection_flood_on_http_does_not_stop_grpc(
    tmp_path: Path, servers: list[GuardedServer], hard_limit_too: bool
) -> None:
    raise_own_open_files_limit(FLOOD + 512)
    server = GuardedServer(tmp_path, prefix=limited_to(hard_limit_too=hard_limit_too))
    servers.append(server.start())
    started = time.monotonic()
    flood = Flood([server.http_port], slowloris=True)
    try:
        await eventually(flood.all_connected, "every attacker has a connection", 60)
        # full when the server says so: counting its open files cannot tell the cap from the
        # kernel's accept queue, where a connect the client sees as done may still wait
        await eventually(lambda: _CAP_FULL in server.log(), "the cap is full", 60)
        for _ in range(2):
            agent, standard = await asyncio.to_thread(_grpc_answers, server)
            assert agent == pb.HealthCheckResponse.STATUS_HEALTHY
            assert standard == health_pb2.HealthCheckResponse.SERVING
        await flood.stop_reconnecting()  # the connections held stay open until the server times them out
        assert await healthz(server.http_port, within_s=60) == 200
    finally:
        await flood.close()
    elapsed = time.monotonic() - started
    refusals = [line for line in server.log().splitlines() if _REFUSAL_LINE.search(line)]
    windows = int(elapsed // WINDOW_S) + 2
    assert 0 < len(refusals) <= windows * (LINES_PER_WINDOW + 1), "\n".join(refusals)
    log = server.log()
    assert "Too many open files" not in log and "Traceback" not in log, log[-4000:]
