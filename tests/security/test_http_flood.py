"""A flood of idle and slowloris connections on the HTTP port of a real `a3s-agent serve` started
with 1,024 open files: gRPC and its health checks keep answering, HTTP answers again once the slow
connections time out, and the log stays short."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import time
from pathlib import Path

import aiohttp
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent.config import DEFAULT_MAX_HTTP_CONNECTIONS
from a3s_agent.faces.refusals import LINES_PER_WINDOW, WINDOW_S
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from ..conftest import eventually
from .test_listeners import GuardedServer
from .test_listeners import servers as servers  # the fixture that kills them

pytestmark = pytest.mark.security

FLOOD = 1100
"""Connections held open at once: more than the server's 1,024 open files."""
SERVER_NOFILE = 1024
RECONNECT_S = 0.2
_REFUSAL_LINE = re.compile(r"refused HTTP connection|more requests refused")


def _raise_own_open_files_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"this test opens {needed} files; the hard limit here is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def _hold(
    port: int,
    slow: bool,
    stop: asyncio.Event,
    connected: asyncio.Event,
    left_open: list[asyncio.StreamWriter],
) -> None:
    """One attacker connection, opened again whenever the server closes it: idle, or sending a
    request header a byte at a time (slowloris). `connected` is set once it first got through;
    at `stop` it stops reconnecting and leaves its connection open (in `left_open`)."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(RECONNECT_S)
            continue
        connected.set()
        try:
            if slow:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            while not stop.is_set():
                if slow:
                    writer.write(b"x")
                try:
                    if await asyncio.wait_for(reader.read(4096), 0.5) == b"":
                        break  # closed by the server
                except TimeoutError:
                    continue
        except OSError:
            pass
        if stop.is_set():
            left_open.append(writer)
            return
        writer.close()
        await asyncio.sleep(RECONNECT_S)


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _grpc_answers(server: GuardedServer) -> tuple[int, int]:
    """HealthCheck and grpc.health.v1 over a new connection, made during the flood."""
    with server.channel() as channel:
        agent = pb_grpc.CodeAgentServiceStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=20)
        standard = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=20)
    return agent.status, standard.status


async def _healthz(port: int, within_s: float) -> int:
    """The status of /healthz from a fresh client, retried while the server turns connections away."""
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
        while True:
            try:
                async with client.get(f"http://127.0.0.1:{port}/healthz") as reply:
                    if reply.status != 503 or time.monotonic() > deadline:
                        return reply.status
            except (aiohttp.ClientError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("hard_limit_too", [False, True], ids=["soft-1024", "soft-and-hard-1024"])
async def test_a_connection_flood_on_http_does_not_stop_grpc(
    tmp_path: Path, servers: list[GuardedServer], hard_limit_too: bool
) -> None:
    _raise_own_open_files_limit(FLOOD + 512)
    limits = f"ulimit -Sn {SERVER_NOFILE}" + (f" && ulimit -Hn {SERVER_NOFILE}" if hard_limit_too else "")
    server = GuardedServer(tmp_path, prefix=("sh", "-c", f'{limits} && exec "$@"', "sh"))
    servers.append(server.start())
    stop = asyncio.Event()
    started = time.monotonic()
    connected = [asyncio.Event() for _ in range(FLOOD)]
    left_open: list[asyncio.StreamWriter] = []
    attackers = [
        asyncio.create_task(_hold(server.http_port, i % 2 == 1, stop, connected[i], left_open))
        for i in range(FLOOD)
    ]
    try:
        await eventually(lambda: all(c.is_set() for c in connected), "every attacker has a connection", 60)
        await eventually(
            lambda: _open_files(server.pid) >= DEFAULT_MAX_HTTP_CONNECTIONS, "the cap is full", 60
        )
        for _ in range(2):
            agent, standard = await asyncio.to_thread(_grpc_answers, server)
            assert agent == pb.HealthCheckResponse.STATUS_HEALTHY
            assert standard == health_pb2.HealthCheckResponse.SERVING
        stop.set()  # no new attacks; the connections held stay open until the server times them out
        await asyncio.wait_for(asyncio.gather(*attackers), 30)
        assert await _healthz(server.http_port, within_s=60) == 200
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*attackers, return_exceptions=True), 30)
        for writer in left_open:
            writer.close()
    elapsed = time.monotonic() - started
    refusals = [line for line in server.log().splitlines() if _REFUSAL_LINE.search(line)]
    windows = int(elapsed // WINDOW_S) + 2
    assert 0 < len(refusals) <= windows * (LINES_PER_WINDOW + 1), "\n".join(refusals)
    log = server.log()
    assert "Too many open files" not in log and "Traceback" not in log, log[-4000:]
