"""`first`: the first calls of a fresh server, at once after ready and once its warm-up is done,
before the warm-up and today."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .common import FakeLLMProcess, agent_process, checkout_of, rss_mb
from .report import Row

WARM_BASELINE = "3e06dfc"
"""The last commit before the warm-up: started beside today's code in one run."""
WARMED_AFTER_S = 2.0
"""How long after ready the "once warmed" calls come (the warm-up takes a fraction of it)."""


async def _first_calls(workspace: Path, base_url: str, source: Path | None, pause_s: float) -> list[float]:
    """A fresh `serve` (its own data dir) with the fake as its model: [ready s, RSS MB when the
    first call comes, first CreateSession ms, first Generate ms, a later Generate ms], the first
    call `pause_s` after ready."""
    data = tempfile.mkdtemp(dir=workspace.parent)
    env = {"A3S_LLM_PROVIDER": "openai", "A3S_LLM_MODEL": "fake-model", "A3S_LLM_BASE_URL": base_url,
           "A3S_LLM_API_KEY": "sk-bench"}  # fmt: skip
    with agent_process(workspace, source=source, extra=("--data-dir", data), env=env) as agent:
        ready = agent.wait_healthy()
        await asyncio.sleep(pause_s)
        rss = rss_mb(agent.proc.pid)
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            started = time.perf_counter()
            created = await stub.CreateSession(pb.CreateSessionRequest())
            create_ms = (time.perf_counter() - started) * 1000
            generations = []
            for session_id in (
                created.session_id,
                (await stub.CreateSession(pb.CreateSessionRequest())).session_id,
            ):
                request = pb.GenerateRequest(
                    session_id=session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content="go")]
                )
                started = time.perf_counter()
                await stub.Generate(request)
                generations.append((time.perf_counter() - started) * 1000)
    return [ready, rss, create_ms, *generations]


async def bench_first(seconds: float, workspace: Path, rounds: int = 5) -> list[Row]:
    """The first CreateSession and Generate of a fresh server, at once after ready and once the
    warm-up is done, before the warm-up (WARM_BASELINE) and today, alternating (medians)."""
    (workspace / "small.txt").write_text("lorem ipsum\n")
    runs: dict[tuple[str, float], list[list[float]]] = {}
    with tempfile.TemporaryDirectory() as old, FakeLLMProcess(rounds=1) as fake:
        sources = {"before": checkout_of(WARM_BASELINE, Path(old)), "today": None}
        for _ in range(rounds):
            for name, source in sources.items():
                for pause_s in (0.0, WARMED_AFTER_S):
                    runs.setdefault((name, pause_s), []).append(
                        await _first_calls(workspace, fake.base_url, source, pause_s)
                    )
    med = {
        key: [statistics.median(values) for values in zip(*found, strict=True)] for key, found in runs.items()
    }
    ready = {
        name: statistics.median(r[0] for key, found in runs.items() if key[0] == name for r in found)
        for name in sources
    }
    now_b, now_t = med[("before", 0.0)], med[("today", 0.0)]
    warm_b, warm_t = med[("before", WARMED_AFTER_S)], med[("today", WARMED_AFTER_S)]
    later = f"{WARMED_AFTER_S:g} s after ready"
    return [
        Row(f"first: ready (s), before the warm-up ({WARM_BASELINE})", f"{ready['before']:.2f}"),
        Row("first: ready (s), today", f"{ready['today']:.2f}"),
        Row("first: ready ratio (today / before)", f"{ready['today'] / ready['before']:.2f}", "<= 1.05"),
        Row("first: CreateSession at once after ready (ms), before", f"{now_b[2]:.1f}"),
        Row("first: CreateSession at once after ready (ms), today", f"{now_t[2]:.1f}", "report"),
        Row(f"first: CreateSession {later} (ms), before", f"{warm_b[2]:.1f}"),
        Row(f"first: CreateSession {later} (ms), today", f"{warm_t[2]:.1f}", "report"),
        Row(f"first: Generate {later} (ms), before", f"{warm_b[3]:.1f}"),
        Row(f"first: Generate {later} (ms), today", f"{warm_t[3]:.1f}"),
        Row("first: first Generate / a later one, before", f"{warm_b[3] / warm_b[4]:.2f}"),
        Row("first: first Generate / a later one, today", f"{warm_t[3] / warm_t[4]:.2f}", "<= 1.5"),
        Row(f"first: idle RSS {later} (MB), before", f"{warm_b[1]:.0f}"),
        Row(f"first: idle RSS {later} (MB), today (tokenizer loaded)", f"{warm_t[1]:.0f}", "report"),
    ]
