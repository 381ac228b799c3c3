"""The faces against a baseline: `http` (Agent Spaces runs against a plain write loop, /healthz),
`acp` (a prompt over ACP against the same generation over gRPC) and `dialect` (telling the two A3S
gRPC dialects apart, against a plain decode and a HealthCheck's server time)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import aiohttp
import grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.ports import free_port

from .common import (
    FakeLLMProcess,
    agent_process,
    calls_per_second,
    health,
    http_ready,
    initialize,
    requests_per_second,
)
from .report import Row


async def bench_http(seconds: float, workspace: Path) -> list[Row]:
    count = 1000
    plain_dir = workspace / "plain"
    plain_dir.mkdir()
    started = time.perf_counter()
    for index in range(count):
        (plain_dir / f"f{index}.txt").write_text(f"file {index}\n")
    plain_rate = count / (time.perf_counter() - started)
    operations = {
        "protocolVersion": "1.0",
        "operations": [
            {"type": "createFile", "id": f"op{i}", "path": f"f{i}.txt", "content": f"file {i}\n"}
            for i in range(count)
        ],
    }
    http_port = free_port()
    with agent_process(workspace, http_port) as agent:
        agent.wait_healthy()
        base = f"http://127.0.0.1:{http_port}"
        async with aiohttp.ClientSession(base_url=base) as client:
            await http_ready(client)
            async with client.post("/v1/spaces", json={"policy": "permissive"}) as reply:
                space = (await reply.json())["spaceId"]
            started = time.perf_counter()
            async with client.post(f"/v1/spaces/{space}/runs", json=operations) as reply:
                events = (await reply.json())["events"]
            run_rate = count / (time.perf_counter() - started)
            assert all(e["success"] for e in events), events[:3]
            healthz = await requests_per_second(client, "/healthz", seconds)
    return [
        Row("createFile ops/s via /v1/spaces runs (1,000 in one run)", f"{run_rate:,.0f}"),
        Row("plain Python write_text loop (files/s)", f"{plain_rate:,.0f}"),
        Row("Agent Spaces ratio (runs / plain loop)", f"{run_rate / plain_rate:.2f}", ">= 0.3"),
        Row("GET /healthz requests/s", f"{healthz:,.0f}", "report"),
    ]


class _AcpEditor:
    """The editor's end of the ACP benchmark: counts the session updates it is sent (of an ACP
    client's methods, the agent calls only this one here)."""

    def __init__(self) -> None:
        self.updates = 0

    async def session_update(self, session_id: str, update: object, **kwargs: object) -> None:
        self.updates += 1


async def _generate_on(stub: pb_grpc.CodeAgentServiceStub, session_id: str) -> None:
    request = pb.GenerateRequest(
        session_id=session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content="go")]
    )
    async for _ in stub.StreamGenerate(request):
        pass


async def bench_acp(seconds: float, workspace: Path) -> list[Row]:
    """A prompt's round trip over ACP (session/prompt until its answer, every update received)
    against the same generation through StreamGenerate; the fake LLM answers at once, and both
    stores commit without fsync (A3S_DURABILITY=normal: the syncs, the same for both, would drown
    the rest), so what is left is each face's own cost. Both agents run side by side and take
    turns, one session each, so load on the machine and the growth of the histories fall on both
    alike; medians."""
    from acp import PROTOCOL_VERSION, Client, spawn_agent_process, text_block
    from acp.schema import ClientCapabilities

    prompts = max(50, int(seconds * 20))
    acp_times: list[float] = []
    grpc_times: list[float] = []
    env = {**os.environ, "A3S_LLM_MODEL": "fake-model", "A3S_LLM_API_KEY": "sk-bench",
           "A3S_DATA_DIR": f"{workspace}.acp-data", "A3S_LOG_LEVEL": "WARNING", "A3S_DURABILITY": "normal"}  # fmt: skip
    editor = _AcpEditor()
    with FakeLLMProcess(0) as fake, agent_process(workspace, env={"A3S_DURABILITY": "normal"}) as agent:
        agent.wait_healthy()
        async with (
            grpc.aio.insecure_channel(agent.address) as channel,
            spawn_agent_process(
                cast(Client, editor), sys.executable, "-m", "a3s_agent", "acp", cwd=workspace,
                env={**env, "A3S_LLM_BASE_URL": fake.base_url}, transport_kwargs={"stderr": subprocess.DEVNULL},
            ) as (conn, _),
        ):  # fmt: skip
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await initialize(stub, fake.base_url)
            grpc_session = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
            await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities())
            acp_session = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            for number in range(prompts + 1):  # the first of each warms up
                started = time.perf_counter()
                await _generate_on(stub, grpc_session)
                grpc_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                await conn.prompt(session_id=acp_session, prompt=[text_block("go")])
                acp_times.append(time.perf_counter() - started)
                if number == 0:
                    acp_times.clear()
                    grpc_times.clear()
    acp_ms, grpc_ms = statistics.median(acp_times) * 1000, statistics.median(grpc_times) * 1000
    return [
        Row(f"prompt round trip over ACP, instant model, median of {prompts} (ms)", f"{acp_ms:.2f}"),
        Row("the same generation through StreamGenerate (ms)", f"{grpc_ms:.2f}"),
        Row("ACP / gRPC round trip ratio", f"{acp_ms / grpc_ms:.2f}", "<= 1.5"),
        Row("session updates per ACP prompt", f"{editor.updates / (prompts + 1):.1f}"),
    ]


def _per_call_us(fn: Callable[[], object], seconds: float) -> float:
    """Median over five runs of the mean µs per call of `fn`, each run about seconds / 5 long."""
    runs = []
    count = max(100, int(seconds * 20_000 / 5))
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(count):
            fn()
        runs.append((time.perf_counter() - started) / count * 1e6)
    return statistics.median(runs)


def _generate_sized(later: bool) -> bytes:
    """A Generate request of 20 messages, about 8 KB, in either dialect."""
    from a3s_agent.proto import code_agent_later_pb2 as lp

    body = "def handler(request):\n    return {'status': 200, 'items': [x * 2 for x in request]}\n" * 5
    if later:
        messages = [lp.Message(role="assistant" if i % 2 else "user", content=body) for i in range(20)]
        return lp.GenerateRequest(session_id="bench", messages=messages).SerializeToString()
    roles = (pb.Message.ROLE_USER, pb.Message.ROLE_ASSISTANT)
    box = [pb.Message(role=roles[i % 2], content=body) for i in range(20)]
    return pb.GenerateRequest(session_id="bench", messages=box).SerializeToString()


async def bench_dialect(seconds: float, workspace: Path) -> list[Row]:
    """Per-request dialect detection (faces/grpc/dialect.py) on Generate-sized requests, against a
    plain Box decode and against the server time of one HealthCheck-class RPC (1 / its throughput
    over a real channel, measured now)."""
    from a3s_agent.faces.grpc import later_convert
    from a3s_agent.faces.grpc.dialect import generate_dialect
    from a3s_agent.proto import code_agent_later_pb2 as lp

    box, later = _generate_sized(False), _generate_sized(True)
    assert generate_dialect(box) == "box" and generate_dialect(later) == "later"
    plain = _per_call_us(lambda: pb.GenerateRequest.FromString(box), seconds)
    detect = _per_call_us(lambda: generate_dialect(box), seconds)
    detect_box = _per_call_us(lambda: (generate_dialect(box), pb.GenerateRequest.FromString(box)), seconds)
    detect_later = _per_call_us(
        lambda: (
            generate_dialect(later),
            later_convert.generate_request(lp.GenerateRequest.FromString(later)),
        ),
        seconds,
    )
    with agent_process(workspace) as agent:
        agent.wait_healthy()
        health_rate = await calls_per_second(agent.address, health, seconds)
    health_us = 1e6 / health_rate
    return [
        Row("Generate-sized request (20 messages), bytes", f"{len(box):,}"),
        Row("plain Box decode (µs/request)", f"{plain:.1f}"),
        Row("dialect detection alone (µs/request)", f"{detect:.1f}"),
        Row("detection + Box decode (µs/request)", f"{detect_box:.1f}"),
        Row("detection + later decode + conversion to Box (µs/request)", f"{detect_later:.1f}"),
        Row("HealthCheck calls/s over a real channel", f"{health_rate:,.0f}"),
        Row("server time of one HealthCheck (µs)", f"{health_us:.0f}"),
        Row("detection / one HealthCheck's server time", f"{detect / health_us:.1%}", "<= 5%"),
    ]
