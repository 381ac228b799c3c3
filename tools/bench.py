#!/usr/bin/env python3
"""Benchmarks of a3s-agent, reported as ratios against baselines measured in the same run.

Usage: python tools/bench.py [--seconds S] [--only NAME ...]

Each section starts what it measures as real processes on 127.0.0.1 and prints
rows of (metric, value, target). Nothing here is a test: figures go to the README.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from a3s_agent.proto import code_agent_pb2 as pb  # noqa: E402
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc  # noqa: E402

CONCURRENCY = 32


@dataclass
class Row:
    metric: str
    value: str
    target: str = ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Process:
    """A server subprocess on a free port, stopped on exit."""

    def __init__(self, argv: list[str], port: int, cwd: Path) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_healthy(self, timeout_s: float = 20) -> float:
        """Seconds from process start until HealthCheck answers HEALTHY."""
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            while time.monotonic() < deadline:
                try:
                    if stub.HealthCheck(pb.HealthCheckRequest(), timeout=0.2).status == 1:
                        return time.perf_counter() - self.started
                except grpc.RpcError:
                    time.sleep(0.005)
        raise RuntimeError(f"{self.address} never became healthy")

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def agent_process(workspace: Path) -> Process:
    port = _free_port()
    argv = [sys.executable, "-m", "a3s_agent", "serve", "--listen", f"127.0.0.1:{port}",
            "--workspace", str(workspace), "--log-level", "WARNING", "--max-sessions", "10000000"]  # fmt: skip
    return Process(argv, port, workspace)


def bare_process(workspace: Path) -> Process:
    port = _free_port()
    return Process([sys.executable, __file__, "--bare-server", str(port)], port, workspace)


async def _bare_server(port: int) -> None:
    """The baseline: a grpc.aio server with one trivial unary method and nothing else."""

    class Bare(pb_grpc.CodeAgentServiceServicer):
        async def HealthCheck(
            self, request: pb.HealthCheckRequest, context: object
        ) -> pb.HealthCheckResponse:
            return pb.HealthCheckResponse(status=pb.HealthCheckResponse.STATUS_HEALTHY)

    server = grpc.aio.server()
    pb_grpc.add_CodeAgentServiceServicer_to_server(Bare(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


async def calls_per_second(
    address: str, make_call: Callable[[pb_grpc.CodeAgentServiceStub], Awaitable[object]], seconds: float
) -> float:
    """Completed calls/s with CONCURRENCY calls in flight from one client."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        for _ in range(50):  # warm up
            await make_call(stub)
        done = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await make_call(stub)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return done / (time.perf_counter() - started)


def _health(stub: pb_grpc.CodeAgentServiceStub) -> Awaitable[object]:
    return stub.HealthCheck(pb.HealthCheckRequest())


async def _session_pair(stub: pb_grpc.CodeAgentServiceStub) -> None:
    created = await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(name="bench")))
    await stub.GetSession(pb.GetSessionRequest(session_id=created.session_id))


async def bench_foundation(seconds: float, workspace: Path) -> list[Row]:
    with bare_process(workspace) as bare:
        bare.wait_healthy()
        bare_rate = await calls_per_second(bare.address, _health, seconds)
    with agent_process(workspace) as agent:
        startup_s = agent.wait_healthy()
        time.sleep(0.5)
        idle_rss = _rss_mb(agent.proc.pid)
        agent_rate = await calls_per_second(agent.address, _health, seconds)
        pairs = await calls_per_second(agent.address, _session_pair, seconds)
    return [
        Row("HealthCheck calls/s: a3s-agent", f"{agent_rate:,.0f}"),
        Row("HealthCheck calls/s: bare grpc.aio server", f"{bare_rate:,.0f}"),
        Row("HealthCheck ratio (agent / bare)", f"{agent_rate / bare_rate:.2f}", ">= 0.9"),
        Row("start to SERVING (s)", f"{startup_s:.2f}", "< 1"),
        Row("idle RSS (MB)", f"{idle_rss:.1f}", "< 80"),
        Row("CreateSession+GetSession pairs/s (SQLite)", f"{pairs:,.0f}", "report"),
    ]


SECTIONS: dict[str, Callable[[float, Path], Awaitable[list[Row]]]] = {
    "foundation": bench_foundation,
}


def _print(rows: list[Row]) -> None:
    widths = [max(len(r.metric) for r in rows), max(len(r.value) for r in rows)]
    print(f"| {'metric':<{widths[0]}} | {'value':>{widths[1]}} | target |")
    print(f"|{'-' * (widths[0] + 2)}|{'-' * (widths[1] + 2)}|--------|")
    for row in rows:
        print(f"| {row.metric:<{widths[0]}} | {row.value:>{widths[1]}} | {row.target} |")


async def main(seconds: float, only: list[str]) -> None:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, section in SECTIONS.items():
            if only and name not in only:
                continue
            workspace = Path(tmp) / name
            workspace.mkdir()
            rows.extend(await section(seconds, workspace))
    print(
        f"a3s-agent benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, python {sys.version.split()[0]}"
    )
    _print(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    parser.add_argument("--only", nargs="*", default=[], help=f"sections to run: {', '.join(SECTIONS)}")
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        asyncio.run(_bare_server(args.bare_server))
    else:
        asyncio.run(main(args.seconds, args.only))
