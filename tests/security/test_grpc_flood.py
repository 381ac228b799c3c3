"""A flood of silent connections on the gRPC port (and on both ports at once) of a real
`a3s-agent serve` started with 1,024 open files (soft and hard): the connection caps leave open
files for tools, the store and health, so a client already connected keeps working and /healthz
keeps answering; the silent connections are closed after the handshake timeout, so a new client
gets through once the attacker stops opening more; and the log stays short. With fewer open files
the caps are lowered (and the log says so); with too few the server refuses to start; and when the
process runs out of open files anyway, failed accepts are logged a few lines at a time."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent.base.sparse_log import LINES_PER_WINDOW
from a3s_agent.config import DEFAULT_MAX_GRPC_CONNECTIONS, DEFAULT_MAX_HTTP_CONNECTIONS
from a3s_agent.faces.open_files import RESERVED_FILES
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.flood import FLOOD, Flood, open_files

from ..conftest import eventually
from .flood import healthz, limited_to, raise_own_open_files_limit
from .test_listeners import GuardedServer, _self_signed
from .test_listeners import servers as servers  # the fixture that kills them

pytestmark = pytest.mark.security

CALL_S = 30.0
"""Each call's deadline: a client connecting after the flood waits for the silent connections'
handshake timeout (5 s) and grpc's reconnect backoff."""


def _own_channel(server: GuardedServer) -> grpc.Channel:
    """A channel with a connection of its own (grpc would otherwise share one between channels)."""
    return grpc.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)])


def _everything_answers(channel: grpc.Channel, workspace: Path, name: str) -> None:
    """HealthCheck, grpc.health.v1, a `bash` command and a `write_file` over `channel`."""
    agent = pb_grpc.CodeAgentServiceStub(channel)
    ready = {"timeout": CALL_S, "wait_for_ready": True}
    assert agent.HealthCheck(pb.HealthCheckRequest(), **ready).status == pb.HealthCheckResponse.STATUS_HEALTHY
    standard = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), **ready)
    assert standard.status == health_pb2.HealthCheckResponse.SERVING
    bash = agent.ExecuteTool(
        pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": f"echo ran-{name}"})),
        **ready,
    )
    assert bash.result.success and f"ran-{name}" in bash.result.output, bash.result
    write = agent.ExecuteTool(
        pb.ExecuteToolRequest(
            tool_name="write_file", arguments=json.dumps({"path": f"{name}.txt", "content": name})
        ),
        **ready,
    )
    assert write.result.success, write.result
    assert (workspace / f"{name}.txt").read_text() == name


async def _closed_by_the_server(port: int, first_bytes: bytes, within_s: float) -> bool:
    """Whether a connection that sends `first_bytes`, then nothing, is closed by the server."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(first_bytes)
        while True:  # a server that gives up on us may say so first (an HTTP/2 GOAWAY)
            if await asyncio.wait_for(reader.read(4096), within_s) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        writer.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
async def test_a_connection_silent_before_its_handshake_ends_is_closed(
    tmp_path: Path, servers: list[GuardedServer], tls: bool
) -> None:
    """Silent from the start, or stopped in the middle of the TLS handshake (a record header of a
    ClientHello): the server closes it after its handshake timeout, not grpc's default 2 minutes."""
    args: tuple[str, ...] = ()
    ca = None
    if tls:
        ca, key = _self_signed(tmp_path)
        args = ("--tls-cert", str(ca), "--tls-key", str(key))
    server = GuardedServer(tmp_path, *args, ca=ca)
    servers.append(server.start())
    starts = [b"", b"\x16\x03\x01\x02\x00"] if tls else [b"", b"PRI * HTTP/2.0\r\n"]
    closed = await asyncio.gather(*(_closed_by_the_server(server.port, start, 30) for start in starts))
    assert closed == [True] * len(starts)


def _caps_within(nofile: int) -> tuple[int, int]:
    """The gRPC and HTTP caps of a server with the default caps and `nofile` open files."""
    wanted = DEFAULT_MAX_GRPC_CONNECTIONS + DEFAULT_MAX_HTTP_CONNECTIONS
    room = min(wanted, nofile - RESERVED_FILES)
    return DEFAULT_MAX_GRPC_CONNECTIONS * room // wanted, DEFAULT_MAX_HTTP_CONNECTIONS * room // wanted


@pytest.mark.parametrize(
    ("ports", "nofile"),
    [("grpc", 1024), ("grpc-and-http", 1024), ("grpc-and-http", 512)],
    ids=["grpc", "grpc-and-http", "grpc-and-http-in-512-files"],
)
async def test_a_flood_of_silent_grpc_connections_leaves_the_server_working(
    tmp_path: Path, servers: list[GuardedServer], ports: str, nofile: int
) -> None:
    raise_own_open_files_limit(2 * FLOOD + 512)
    server = GuardedServer(tmp_path, prefix=limited_to(nofile))
    servers.append(server.start())
    grpc_cap, http_cap = _caps_within(nofile)
    lowered = (  # the defaults fit in 1,024 files; in fewer, both caps are lowered, and the log says so
        f"connection caps are lowered to gRPC {grpc_cap} (A3S_MAX_GRPC_CONNECTIONS is"
        f" {DEFAULT_MAX_GRPC_CONNECTIONS}) and HTTP {http_cap} (A3S_MAX_HTTP_CONNECTIONS is"
        f" {DEFAULT_MAX_HTTP_CONNECTIONS})"
    )
    assert (lowered in server.log()) is (grpc_cap < DEFAULT_MAX_GRPC_CONNECTIONS), server.log()
    workspace = tmp_path / "workspace"
    connected_before = _own_channel(server)
    await asyncio.to_thread(_everything_answers, connected_before, workspace, "before")
    flood = Flood([server.port, server.http_port] if ports == "grpc-and-http" else [server.port])
    try:
        await eventually(flood.all_connected, "every attacker has had a connection", 60)
        await eventually(lambda: open_files(server.pid) >= grpc_cap, "the gRPC cap is full", 60)
        for round_ in range(2):  # the attackers keep reconnecting as the server closes them
            await asyncio.to_thread(_everything_answers, connected_before, workspace, f"during-{round_}")
            if ports == "grpc":
                assert await healthz(server.http_port, within_s=20) == 200
        await flood.stop_reconnecting()  # the connections held now stay open, silent
        with _own_channel(server) as connected_after:
            await asyncio.to_thread(_everything_answers, connected_after, workspace, "after")
        assert await healthz(server.http_port, within_s=60) == 200
    finally:
        connected_before.close()
        await flood.close()
    log = server.log()
    assert "Too many open files" not in log and "Traceback" not in log, log[-4000:]
    assert len(log.splitlines()) < 100, log[-4000:]


async def test_failed_accepts_are_logged_a_few_lines_at_a_time(
    tmp_path: Path, servers: list[GuardedServer]
) -> None:
    """Out of open files anyway (here: the limit lowered under the running server), each listener
    fails to accept: a line now and then, not a traceback per attempt."""
    server = GuardedServer(tmp_path, prefix=limited_to())
    servers.append(server.start())
    in_use = open_files(server.pid)
    resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (in_use + 8, 1024))
    flood = Flood([server.port, server.http_port], per_port=64)
    try:
        await eventually(lambda: "Too many open files" in server.log(), "a failed accept logged", 30)
        await asyncio.sleep(3)  # the attackers keep trying: more failed accepts, not more lines
    finally:
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        await flood.close()
    with _own_channel(server) as channel:
        await asyncio.to_thread(_everything_answers, channel, tmp_path / "workspace", "after")
    log = server.log()
    failed = [line for line in log.splitlines() if "Too many open files" in line]
    assert len(failed) <= 2 * LINES_PER_WINDOW, "\n".join(failed[:20])
    assert "Traceback" not in log, log[-4000:]


def test_too_few_open_files_for_the_reserve_and_the_listeners_is_refused(tmp_path: Path) -> None:
    nofile = RESERVED_FILES + 16
    server = GuardedServer(tmp_path, prefix=limited_to(nofile))
    result = subprocess.run(
        server.command(), env=server.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert f"the open-files limit is {nofile}: a3s-agent needs at least" in result.stderr
    assert "ulimit -n" in result.stderr and "Traceback" not in result.stderr
