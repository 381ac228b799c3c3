"""The `checkpoints` section: what a workspace's checkpoints cost. The six-turn task end to end on a
server taking checkpoints against one that does not (A3S_CHECKPOINTS=0), side by side, batches
alternating; then, in this process's own runtime, the checkpointing of a turn that changed nothing,
and a checkpoint of a 10,000-file repository after a one-file change against `git status` on it,
calls alternating; medians."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import time
from pathlib import Path

import grpc

from a3s_agent.base.models import Message, SessionConfig
from a3s_agent.config import SandboxSettings, Settings
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.runtime import Runtime
from a3s_agent.tools.builtin import builtin_registry
from a3s_agent.tools.shadow_repo import EMPTY_TREE, ShadowRepo

from .common import initialize, run_task, task_server
from .report import Row

BATCH = 5
"""Tasks per batch of the end-to-end comparison."""
FILES = 10_000
MODEL_CALL_S = 0.1
"""The model's answer to a turn that changes nothing, as the no-change turn simulates it (a real
model's first token takes longer)."""
_GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


async def bench_checkpoints(seconds: float, workspace: Path) -> list[Row]:
    return [*await _task(seconds, workspace), *await _in_process(seconds, workspace / "own")]


async def _task(seconds: float, workspace: Path) -> list[Row]:
    """ms per six-turn task, with and without checkpoints, two servers at once."""
    batches = max(4, int(seconds * 2))
    per_task: dict[str, list[float]] = {"on": [], "off": []}
    async with contextlib.AsyncExitStack() as stack:
        stubs = {}
        for name in per_task:
            env = {"A3S_CHECKPOINTS": "1" if name == "on" else "0"}
            fake, agent = task_server(stack, workspace, name, batches * BATCH + 1, env=env)
            agent.wait_healthy()
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(agent.address))
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await initialize(stub, fake.base_url)
            if errors := await run_task(stub):  # warm-up
                raise RuntimeError(f"the six-turn task failed with checkpoints {name}: {errors}")
            stubs[name] = stub
        for round_ in range(batches):
            for name in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
                started = time.perf_counter()
                for _ in range(BATCH):
                    await run_task(stubs[name])
                per_task[name].append((time.perf_counter() - started) * 1000 / BATCH)
    on, off = statistics.median(per_task["on"]), statistics.median(per_task["off"])
    return [
        Row("six-turn task with checkpoints (ms, median of batches)", f"{on:.1f}", "report"),
        Row("six-turn task without checkpoints (ms)", f"{off:.1f}", "report"),
        Row("six-turn task, with / without checkpoints", f"{on / off:.2f}x", "<= 1.1x"),
    ]


async def _in_process(seconds: float, root: Path) -> list[Row]:
    small, big = root / "small", root / "big"
    small.mkdir(parents=True)
    (small / "task.py").write_text("print('hello')\n")
    await asyncio.to_thread(_repository, big)
    settings = Settings(
        listen="127.0.0.1:0",
        workspace=small,
        workspace_root=root,
        data_dir=root / "data",
        sandbox=SandboxSettings(),
    )
    runtime = Runtime(settings, registry=builtin_registry())
    await runtime.start()
    try:
        return [*await _no_change(runtime, small, seconds), *await _large(runtime, big, seconds)]
    finally:
        await runtime.close()


async def _no_change(runtime: Runtime, workspace: Path, seconds: float) -> list[Row]:
    """A turn whose model only answers, when nothing changed since the last one: what its
    checkpointing adds to the turn's path (the checkpoint is taken while the model is called,
    MODEL_CALL_S untimed; a turn's end waits for it if it is longer), the checkpoint's own time,
    and one spawn of git in the sandbox the checkpoint's git runs in, for scale."""
    session = await runtime.sessions.create(None, SessionConfig(workspace=str(workspace)), [])
    asked = [Message(role="user", content="go")]
    repo = ShadowRepo(runtime.settings.resolved_data_dir / "spawns", workspace)
    await repo.ensure()
    on_path, taken, spawns = [], [], []
    for _ in range(max(20, int(seconds * 10)) + 1):
        started = time.perf_counter()
        await runtime.checkpoints.turn_starting(session, asked, 0)
        path = time.perf_counter() - started
        await asyncio.sleep(MODEL_CALL_S)
        started = time.perf_counter()
        await runtime.checkpoints.turn_ended(session.id)
        on_path.append((path + time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await runtime.checkpoints.take(session.id, "turn", "go", (0, 0))  # the same checkpoint, timed
        taken.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await repo.has(EMPTY_TREE)
        spawns.append((time.perf_counter() - started) * 1000)
    return [
        Row(
            "checkpointing on the path of a turn that changed nothing (ms, median)",
            f"{statistics.median(on_path[1:]):.2f}",
            "< 1 ms",
        ),
        Row(
            "that turn's checkpoint, taken while the model is called (ms)",
            f"{statistics.median(taken[1:]):.1f}",
            "report",
        ),
        Row(
            "one git command in the sandbox, for scale (ms, median)",
            f"{statistics.median(spawns[1:]):.1f}",
            "report",
        ),
    ]


async def _large(runtime: Runtime, repository: Path, seconds: float) -> list[Row]:
    """A checkpoint of the 10,000-file repository after a one-file change, against `git status`
    after another one-file change, alternating."""
    session = await runtime.sessions.create(None, SessionConfig(workspace=str(repository)), [])
    await runtime.checkpoints.take(session.id, "turn", "", (0, 0))  # the session's index, made once
    taken, status = [], []
    for n in range(max(6, int(seconds * 2))):
        (repository / f"d{n % 100}" / f"f{n}.txt").write_text(f"changed {time.time_ns()}\n")
        started = time.perf_counter()
        await runtime.checkpoints.take(session.id, "turn", "", (0, 0))
        taken.append(time.perf_counter() - started)
        (repository / f"d{n % 100}" / f"f{n + 1}.txt").write_text(f"changed {time.time_ns()}\n")
        started = time.perf_counter()
        await asyncio.to_thread(_git, repository, "status", "--porcelain")
        status.append(time.perf_counter() - started)
    checkpoint, plain = statistics.median(taken) * 1000, statistics.median(status) * 1000
    return [
        Row(
            f"checkpoint of a {FILES:,}-file repository after a one-file change (ms)",
            f"{checkpoint:.1f}",
            "report",
        ),
        Row("`git status` on it after a one-file change (ms)", f"{plain:.1f}", "report"),
        Row("checkpoint / `git status`", f"{checkpoint / plain:.2f}x", "<= 2x"),
    ]


def _repository(path: Path) -> None:
    """FILES small files in 100 directories, committed."""
    for n in range(FILES):
        directory = path / f"d{n % 100}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n}.txt").write_text(f"file {n}\n")
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "-c", "user.name=b", "-c", "user.email=b@example.com", "commit", "-qm", "files")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_GIT_ENV}, check=True, capture_output=True)
