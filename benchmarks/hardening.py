"""What the hardening costs and how the server holds under attack: `security` (the same calls
before the security checks and with them), `flood` (silent connections against a server with 1,024
open files, before the connection cap and today) and `sizes` (HealthCheck while a 50 MB request is
processed, ListSessions over a big store)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.flood import (
    FLOOD,
    SERVER_NOFILE,
    TooFewOpenFiles,
    open_files,
    raise_own_open_files_limit,
)
from a3s_agent.testing.ports import free_port
from a3s_agent.testing.stored_sessions import write_sessions

from .common import (
    ROOT,
    FakeLLMProcess,
    agent_process,
    calls_per_second,
    checkout_of,
    health,
    http_ready,
    read_file_call,
    requests_per_second,
)
from .report import Row, Skipped

SECURITY_BASELINE = "378f305"
"""The last commit before the security issue's checks: measured beside today's code in one run."""


async def _security_rates(workspace: Path, seconds: float, source: Path | None) -> tuple[float, float, float]:
    http_port = free_port()
    with agent_process(workspace, http_port, source) as agent:
        agent.wait_healthy()
        health_rate = await calls_per_second(agent.address, health, seconds)
        reads = await calls_per_second(agent.address, read_file_call("small.txt"), seconds)
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{http_port}") as client:
            await http_ready(client)
            healthz = await requests_per_second(client, "/healthz", seconds)
    return health_rate, reads, healthz


async def bench_security(seconds: float, workspace: Path) -> list[Row]:
    """The cost of the security checks: the same calls against the code before them and today's,
    alternating (two rounds each, medians), so machine load affects both alike."""
    (workspace / "small.txt").write_text(("lorem ipsum dolor sit amet " * 3 + "\n") * 50)  # ~4 KB
    with tempfile.TemporaryDirectory() as old:
        before_source = checkout_of(SECURITY_BASELINE, Path(old))
        runs: dict[str, list[tuple[float, float, float]]] = {"before": [], "after": []}
        for _ in range(2):
            runs["before"].append(await _security_rates(workspace, seconds, before_source))
            runs["after"].append(await _security_rates(workspace, seconds, None))
    before = [statistics.median(values) for values in zip(*runs["before"], strict=True)]
    after = [statistics.median(values) for values in zip(*runs["after"], strict=True)]
    rows = []
    for index, name in enumerate(
        ("HealthCheck calls/s", "ExecuteTool(read_file 4 KB) calls/s", "GET /healthz requests/s")
    ):
        rows += [
            Row(f"{name}: before the security checks ({SECURITY_BASELINE})", f"{before[index]:,.0f}"),
            Row(f"{name}: with them", f"{after[index]:,.0f}"),
            Row(f"{name}: ratio (with / before)", f"{after[index] / before[index]:.2f}", ">= 0.9"),
        ]
    return rows


CLIENT_OPTIONS = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
MESSAGE_BYTES = 1_000_000  # the big request is made of messages of this size


FLOOD_BASELINE = "341aeed"
"""The last commit without the gRPC connection cap, handshake timeout and open-files budget."""


class _AttackerProcess:
    """benchmarks/attacker.py on `ports`, started at enter, ended at exit."""

    def __init__(self, ports: list[int]) -> None:
        argv = [sys.executable, "-m", "benchmarks.attacker", *map(str, ports)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    async def __aenter__(self) -> _AttackerProcess:
        assert self.proc.stdout is not None
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if line.strip() != "connected":
            raise RuntimeError(f"the attacker did not start: {line!r}")
        return self

    def stop_reconnecting(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)

    async def __aexit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def _latencies(call: Callable[[], Awaitable[object]], seconds: float) -> tuple[list[float], int]:
    """Round trips (seconds) of `call`, one after another for `seconds`, and how many failed."""
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        try:
            await call()
        except (grpc.RpcError, RuntimeError):
            failed += 1
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.01)
    return latencies, failed


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _sample_open_files(pid: int, samples: list[int]) -> None:
    """Append the process's count of open files to `samples` every 50 ms, until cancelled."""
    while True:
        samples.append(open_files(pid))
        await asyncio.sleep(0.05)


async def _bash_echo(stub: pb_grpc.CodeAgentServiceStub) -> None:
    request = pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": "echo flood"}))
    reply = await stub.ExecuteTool(request, timeout=30)
    if not reply.result.success:
        raise RuntimeError(reply.result.error)


async def _first_answer_s(address: str, within_s: float) -> float:
    """Seconds until a HealthCheck over a new connection answers (nan: not within `within_s`)."""
    started = time.perf_counter()
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_reconnect_backoff_ms", 1000)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        while time.perf_counter() - started < within_s:
            try:
                await stub.HealthCheck(pb.HealthCheckRequest(), timeout=2, wait_for_ready=True)
                return time.perf_counter() - started
            except grpc.RpcError:
                continue
    return float("nan")


async def _under_flood(
    workspace: Path, seconds: float, source: Path | None, both_ports: bool
) -> dict[str, float]:
    """One server with 1,024 open files (soft and hard): HealthCheck and `bash` over a connection
    made before, without a flood and during one of FLOOD silent connections per port (the gRPC
    port, or both), then how long a new connection waits once the attacker stops reconnecting."""
    limit = ("prlimit", f"--nofile={SERVER_NOFILE}:{SERVER_NOFILE}", "--")
    http_port = free_port()
    with agent_process(workspace, http_port, source, prefix=limit) as server:
        server.wait_healthy()
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(server.address, options=options) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)

            async def health() -> None:
                await stub.HealthCheck(pb.HealthCheckRequest(), timeout=30)

            quiet, _ = await _latencies(health, seconds)
            async with _AttackerProcess([server.port, http_port] if both_ports else [server.port]) as flood:
                files: list[int] = []
                sampler = asyncio.create_task(_sample_open_files(server.proc.pid, files))
                cpu_before, started = _cpu_s(server.proc.pid), time.perf_counter()
                flooded, health_failed = await _latencies(health, seconds)
                cpu_share = (_cpu_s(server.proc.pid) - cpu_before) / (time.perf_counter() - started)
                bash, bash_failed = await _latencies(lambda: _bash_echo(stub), seconds)
                sampler.cancel()
                flood.stop_reconnecting()
                new_connection = await _first_answer_s(server.address, 180)
    return {
        "quiet p99": _p99(quiet),
        "flood p99": _p99(flooded),
        "health failed": health_failed / len(flooded),
        "bash median": statistics.median(bash),
        "bash failed": bash_failed / len(bash),
        "open files": max(files),
        "cpu share": cpu_share,
        "new connection": new_connection,
    }


async def bench_flood(seconds: float, workspace: Path) -> list[Row]:
    """Silent connections against a server with 1,024 open files: the code before the connection
    cap and the open-files budget (FLOOD_BASELINE) and today's, on the same machine in one run."""
    try:  # the attacker, a child of this process, has the same hard limit
        raise_own_open_files_limit(2 * FLOOD + 256)
    except TooFewOpenFiles as exc:
        raise Skipped(str(exc)) from None
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as old:
        before_source = checkout_of(FLOOD_BASELINE, Path(old))
        for both_ports in (False, True):
            ports = "gRPC and HTTP ports" if both_ports else "gRPC port"
            before = await _under_flood(workspace, seconds, before_source, both_ports)
            today = await _under_flood(workspace, seconds, None, both_ports)
            rows += [
                Row(f"{ports}, {name}: before / today", f"{show(before)} / {show(today)}")
                for name, show in (
                    ("HealthCheck p99 without a flood (ms)", lambda v: f"{v['quiet p99'] * 1000:.1f}"),
                    ("HealthCheck p99 during the flood (ms)", lambda v: f"{v['flood p99'] * 1000:.1f}"),
                    ("HealthChecks failed during the flood", lambda v: f"{v['health failed']:.0%}"),
                    (
                        "bash ExecuteTool median during the flood (ms)",
                        lambda v: f"{v['bash median'] * 1000:.1f}",
                    ),
                    ("bash ExecuteTools failed during the flood", lambda v: f"{v['bash failed']:.0%}"),
                    ("server's most open files during the flood", lambda v: f"{v['open files']:.0f}"),
                    ("server's CPU during the flood (cores)", lambda v: f"{v['cpu share']:.2f}"),
                    (
                        "new connection's first HealthCheck once the attacker stops (s)",
                        lambda v: f"{v['new connection']:.1f}",
                    ),
                )
            ]
            rows += [
                Row(
                    f"{ports}: HealthCheck p99 during the flood / without, today",
                    f"{today['flood p99'] / today['quiet p99']:.2f}",
                    "<= 2",
                ),
                Row(
                    f"{ports}: new connection's wait, today / before",
                    f"{today['new connection'] / before['new connection']:.2f}",
                    "<= 0.2",
                ),
            ]
    return rows


def _big_messages(megabytes: int) -> list[pb.Message]:
    """Code-like text: `megabytes` messages of about 1 MB, each different (no count is cached)."""
    line = "def handler_{n}(request):\n    return {{'status': {n}, 'items': [x * 2 for x in request]}}\n"
    per_message = MESSAGE_BYTES // len(line.format(n=100000))
    return [
        pb.Message(
            role=pb.Message.ROLE_USER,
            content="".join(line.format(n=m * per_message + i) for i in range(per_message)),
        )
        for m in range(megabytes)
    ]


async def _health_latencies_during(call: Awaitable[object], address: str) -> list[float]:
    """HealthCheck round trips (seconds), one after another on a connection of their own (as a
    health probe has), while `call` runs."""
    task = asyncio.ensure_future(call)
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        await stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)  # connected before measuring
        while not task.done():
            started = time.perf_counter()
            await stub.HealthCheck(pb.HealthCheckRequest(), timeout=120)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
    await task
    return latencies


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


async def health_during_big_requests(workspace: Path, megabytes: int) -> list[Row]:
    """p99 HealthCheck latency while a CreateSession and a Generate of `megabytes` MB are processed."""
    messages = _big_messages(megabytes)
    rows: list[Row] = []
    with (
        FakeLLMProcess(0) as fake,
        agent_process(workspace, extra=("--data-dir", str(workspace / ".data-big"))) as server,
    ):
        server.wait_healthy(120)
        async with grpc.aio.insecure_channel(server.address, options=CLIENT_OPTIONS) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            llm = pb.LLMConfig(provider="openai", model="gpt-4o", base_url=fake.base_url, api_key="sk-bench")
            await stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))
            requests: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                (
                    "CreateSession",
                    lambda: stub.CreateSession(pb.CreateSessionRequest(initial_context=messages)),
                ),
            ]
            session = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
            requests.append(
                ("Generate", lambda: stub.Generate(pb.GenerateRequest(session_id=session, messages=messages)))
            )
            for name, make in requests:
                started = time.perf_counter()
                latencies = await _health_latencies_during(make(), server.address)
                took = time.perf_counter() - started
                rows.append(Row(f"{name} of {megabytes} MB (s)", f"{took:.2f}"))
                rows.append(
                    Row(
                        f"HealthCheck p99 during a {megabytes} MB {name} (ms)",
                        f"{_p99(latencies) * 1000:.1f}",
                        "report",
                    )
                )
    return rows


async def list_sessions_after_restart(workspace: Path, sessions: int, messages: int) -> list[Row]:
    """Start-up time and ListSessions time over a store of sessions x messages."""
    data_dir = workspace / ".data-many"
    started = time.perf_counter()
    write_sessions(data_dir, workspace, sessions, messages)
    print(
        f"[store of {sessions} x {messages} written in {time.perf_counter() - started:.1f}s]", file=sys.stderr
    )
    with agent_process(workspace, extra=("--data-dir", str(data_dir))) as server:
        startup = server.wait_healthy(120)
        async with grpc.aio.insecure_channel(server.address, options=CLIENT_OPTIONS) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            times = []
            for _ in range(5):
                started = time.perf_counter()
                reply = await stub.ListSessions(pb.ListSessionsRequest(), timeout=600)
                times.append(time.perf_counter() - started)
            assert len(reply.sessions) == sessions, len(reply.sessions)
    label = f"{sessions:,} sessions x {messages:,} messages"
    return [
        Row(f"start-up with {label} (s)", f"{startup:.2f}"),
        Row(f"ListSessions with {label} (ms, median of 5)", f"{sorted(times)[2] * 1000:.1f}", "report"),
    ]


async def bench_sizes(seconds: float, workspace: Path) -> list[Row]:
    """Big requests and big stores (`seconds` is unused: these are single big operations)."""
    return [
        *await health_during_big_requests(workspace, 50),
        *await list_sessions_after_restart(workspace, 1000, 10_000),
    ]
