"""The server's own costs: `foundation` (HealthCheck against a bare grpc.aio server, start-up,
idle memory, sessions) and `durability` (what synced commits and file writes cost)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.ports import free_port
from a3s_agent.tools.atomic import write_atomically

from .common import ROOT, Process, agent_process, calls_per_second, health, rss_mb, session_pair
from .report import Row


def bare_process() -> Process:
    """benchmarks/bare_server.py on a free port."""
    port = free_port()
    return Process([sys.executable, "-m", "benchmarks.bare_server", str(port)], port, ROOT)


async def bench_foundation(seconds: float, workspace: Path) -> list[Row]:
    with bare_process() as bare:
        bare.wait_healthy()
        bare_rate = await calls_per_second(bare.address, health, seconds)
    with agent_process(workspace) as agent:
        startup_s = agent.wait_healthy()
        time.sleep(0.5)
        idle_rss = rss_mb(agent.proc.pid)
        agent_rate = await calls_per_second(agent.address, health, seconds)
        pairs = await calls_per_second(agent.address, session_pair, seconds)
    return [
        Row("HealthCheck calls/s: a3s-agent", f"{agent_rate:,.0f}"),
        Row("HealthCheck calls/s: bare grpc.aio server", f"{bare_rate:,.0f}"),
        Row("HealthCheck ratio (agent / bare)", f"{agent_rate / bare_rate:.2f}", ">= 0.9"),
        Row("start to SERVING (s)", f"{startup_s:.2f}", "report"),
        Row("idle RSS (MB)", f"{idle_rss:.1f}", "report"),
        Row("CreateSession+GetSession pairs/s (SQLite)", f"{pairs:,.0f}", "report"),
    ]


async def _write_file_call(stub: pb_grpc.CodeAgentServiceStub) -> None:
    request = pb.ExecuteToolRequest(
        tool_name="write_file", arguments=json.dumps({"path": "bench/out.txt", "content": "x" * 4096})
    )
    reply = await stub.ExecuteTool(request)
    assert reply.result.success, reply.result.error


async def bench_durability(seconds: float, workspace: Path) -> list[Row]:
    """What synced commits cost (A3S_DURABILITY=full, the default, vs normal), and synced file writes."""
    pairs: dict[str, float] = {}
    writes = 0.0
    for level in ("full", "normal"):
        level_workspace = workspace / level  # a fresh store for each
        level_workspace.mkdir()
        with agent_process(level_workspace, env={"A3S_DURABILITY": level}) as agent:
            agent.wait_healthy()
            pairs[level] = await calls_per_second(agent.address, session_pair, seconds)
            if level == "full":  # write_file fsyncs the file and its directory whatever the setting
                writes = await calls_per_second(agent.address, _write_file_call, seconds)
    synced = _atomic_writes_per_second(workspace / "synced", write_atomically)
    unsynced = _atomic_writes_per_second(workspace / "unsynced", _unsynced_write)
    return [
        Row("CreateSession+GetSession pairs/s, A3S_DURABILITY=full", f"{pairs['full']:,.0f}", "report"),
        Row("CreateSession+GetSession pairs/s, A3S_DURABILITY=normal", f"{pairs['normal']:,.0f}", "report"),
        Row("session pairs/s ratio (full / normal)", f"{pairs['full'] / pairs['normal']:.2f}", "report"),
        Row("ExecuteTool(write_file 4 KB) calls/s (file + directory fsync)", f"{writes:,.0f}", "report"),
        Row("4 KB atomic writes/s, file + directory fsync (the tools' helper)", f"{synced:,.0f}", "report"),
        Row("4 KB atomic writes/s, temp file + rename, no fsync", f"{unsynced:,.0f}", "report"),
        Row("fsync cost per write (ms)", f"{1000 / synced - 1000 / unsynced:.2f}", "report"),
    ]


def _unsynced_write(target: Path, data: bytes) -> None:
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, target)


def _atomic_writes_per_second(
    directory: Path, write: Callable[[Path, bytes], None], count: int = 300
) -> float:
    """The cost of the fsyncs alone: the same temp-file-and-rename writes with and without them."""
    directory.mkdir()
    data = b"x" * 4096
    started = time.perf_counter()
    for index in range(count):
        write(directory / f"f{index % 20}.txt", data)
    return count / (time.perf_counter() - started)
