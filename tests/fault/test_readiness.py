"""Honest readiness and graceful shutdown, against `a3s-agent serve` as a real process: health says
SERVING only once every face listens, a face that cannot bind ends the start before anything says
SERVING, and a stop keeps health answering NOT_SERVING while running calls get their grace."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from ..conftest import alive, host_pid, user
from .conftest import LoggedServer

pytestmark = pytest.mark.fault

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
GRACE_S = 4


def _server(tmp_path: Path, *extra_args: str) -> LoggedServer:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return LoggedServer(workspace, tmp_path / "data", tmp_path / "server.log", extra_args)


def _check(address: str, timeout_s: float = 0.5) -> str:
    """grpc.health.v1 Check on a new connection: the status name, or the error code's name."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError as err:
            return err.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def _http(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_taken_http_port_ends_the_start_before_anything_says_serving(tmp_path: Path) -> None:
    server = _server(tmp_path)
    seen: set[str] = set()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", server.http_port))
        blocker.listen()
        with server.log_path.open("w") as log:
            proc = subprocess.Popen(server.command(), env=server.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while proc.poll() is None:  # poll health from the moment the process starts until it ends
            assert time.monotonic() < deadline, f"the server did not exit:\n{server.log()}"
            seen.add(_check(server.address, 0.2))
    assert proc.wait(10) == 2
    assert "SERVING" not in seen
    output = server.log()
    assert f"cannot listen for HTTP on 127.0.0.1:{server.http_port}" in output
    assert "Traceback" not in output


def test_grpc_health_says_serving_only_once_the_http_face_is_ready(tmp_path: Path) -> None:
    server = _server(tmp_path)
    with server.log_path.open("w") as log:
        server.proc = subprocess.Popen(
            server.command(), env=server.env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
    try:
        deadline = time.monotonic() + 60
        while (status := _check(server.address, 0.2)) != "SERVING":
            assert server.proc.poll() is None and time.monotonic() < deadline, server.log()
            assert status in {"NOT_SERVING", "UNAVAILABLE", "DEADLINE_EXCEEDED"}, status
        # The first SERVING: the HTTP face must already listen and say ready.
        ready = _http(f"http://127.0.0.1:{server.http_port}/health/ready")
        assert ready == (200, {"schema": "a3s.code.agent-health.v1", "status": "ready"})
        assert _http(f"http://127.0.0.1:{server.http_port}/health/live") == (
            200,
            {"schema": "a3s.code.agent-health.v1", "status": "live"},
        )
        with server.channel() as channel:
            reply = pb_grpc.CodeAgentServiceStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=10)
        assert reply.status == pb.HealthCheckResponse.STATUS_HEALTHY
    finally:
        server.kill()


def _wait_for_pid(path: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.05)
    return host_pid(int(path.read_text()))  # $$ in the sandbox's PID namespace, on this machine


def test_a_stop_keeps_health_answering_and_gives_running_calls_their_grace(tmp_path: Path) -> None:
    server = _server(tmp_path, "--grace-seconds", str(GRACE_S))
    marker = server.workspace / "sleep.pid"  # where a sandboxed command may write
    script = (tool_call("bash", {"command": f"echo $$ > {marker}; exec sleep 60"}), text("never reached"))
    with FakeLLM(*script) as fake, ThreadPoolExecutor(1) as pool:
        server.start()
        assert server.proc is not None
        try:
            with server.channel() as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url)
                stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)), timeout=10)
                session = stub.CreateSession(pb.CreateSessionRequest(), timeout=10).session_id
                generation: Future[pb.GenerateResponse] = pool.submit(
                    stub.Generate, pb.GenerateRequest(session_id=session, messages=[user("go")]), timeout=60
                )
                sleep_pid = _wait_for_pid(marker, 30)
                server.proc.send_signal(signal.SIGTERM)
                _check_stopping(server, generation)
                with pytest.raises(grpc.RpcError) as ended:
                    generation.result(timeout=60)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "the server stopped" in ended.value.details(), ended.value.details()
            assert f"{GRACE_S:g} s shutdown grace" in ended.value.details()
            assert server.proc.wait(30) == 0
            # The generation runs apart from its call (it would outlive a client that went away):
            # the stop ends the call, then stops the generation and kills its tool before exiting.
            assert not alive(sleep_pid)
        finally:
            server.kill()
    log = server.log()
    assert "cancelled 1 calls still running" in log and "stopped" in log


def _check_stopping(server: LoggedServer, generation: Future[pb.GenerateResponse]) -> None:
    """Within the grace: health answers NOT_SERVING on new connections, /health/ready 503, new work
    is refused with UNAVAILABLE, and the running generation goes on."""
    deadline = time.monotonic() + 30
    while (status := _check(server.address, 5)) != "NOT_SERVING":  # until the signal is handled
        assert status == "SERVING" and time.monotonic() < deadline, status
    base = f"http://127.0.0.1:{server.http_port}"
    assert _http(f"{base}/health/ready") == (
        503,
        {"schema": "a3s.code.agent-health.v1", "status": "not_ready"},
    )
    assert _http(f"{base}/health/live")[0] == 200
    assert _http(f"{base}/healthz") == (503, {"status": "shutting_down"})
    code, body = _http(f"{base}/sessions")
    assert code == 503 and "shutting down" in str(body)
    with server.channel() as channel:  # a new connection
        stub = pb_grpc.CodeAgentServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.CreateSession(pb.CreateSessionRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in refused.value.details()
        health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
        assert health.status == pb.HealthCheckResponse.STATUS_UNHEALTHY
    assert not generation.done(), "the running generation did not get its grace period"


def test_a_coven_gateway_that_is_down_does_not_hold_up_readiness(tmp_path: Path) -> None:
    """coven counts as listening once the agent has started connecting: the other faces serve."""
    server = _server(tmp_path, "--coven-gateway", "127.0.0.1:9")  # nothing listens there
    server.start()
    try:
        assert _check(server.address) == "SERVING"
        assert _http(f"http://127.0.0.1:{server.http_port}/health/ready")[0] == 200
        assert server.stop() == 0
    finally:
        server.kill()
    assert "coven agent connecting to 127.0.0.1:9" in server.log()
