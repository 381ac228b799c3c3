"""The server's own CPU: `task_cpu` (per six-turn task, today against an older commit) and
`turn_cpu` (per turn of each tool of the task)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .common import (
    TASK_SOURCE,
    FakeLLMProcess,
    agent_process,
    checkout_of,
    initialize,
    run_task,
    task_server,
    warmed_up,
)
from .report import Row, Skipped

CPU_BASELINE = "194aea5"
"""The commit before the third round of CPU work: its server runs beside today's in `task_cpu`."""


def _per_thread(pid: int, file: str, count: Callable[[str], int]) -> int:
    """The sum of count(/proc/<pid>/task/<thread>/<file>'s text) over the process's threads."""
    total = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += count(Path(f"/proc/{pid}/task/{thread}/{file}").read_text())
    return total


def _switches(pid: int) -> int:
    """How often the process's threads have been switched off the CPU so far, voluntarily (to wait)
    or not. /proc/<pid>/status counts its first thread only, so each thread's is read."""
    return _per_thread(
        pid,
        "status",
        lambda text: sum(
            int(line.split()[1])
            for line in text.splitlines()
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"))
        ),
    )


async def _wake_cpu_us(wakes: int = 300) -> float:
    """This machine's price of a wake-up: the CPU an event loop's thread spends per 1 ms sleep it
    wakes from (median of three runs). A server pays it for every message, commit and reply it
    waits for, so it scales the task's figure from machine to machine."""
    runs = []
    for _ in range(3):
        started = time.thread_time()
        for _ in range(wakes):
            await asyncio.sleep(0.001)
        runs.append((time.thread_time() - started) / wakes * 1e6)
    return statistics.median(runs)


async def bench_task_cpu(seconds: float, workspace: Path) -> list[Row]:
    """The server's own CPU per scripted six-turn task, each in a new session, today and on
    CPU_BASELINE: two servers at once (each with its fake LLM), batches of tasks alternating between
    them after a warm-up task each, medians over the batches. The kernel counts CPU in 10 ms ticks,
    so a batch holds ten tasks; alternating keeps a loaded machine's swings out of the comparison.
    Beside it: how often each server's threads were switched off the CPU per task, and what one
    wake-up costs on this machine."""
    try:
        import psutil  # type: ignore[import-untyped]  # no stubs installed
    except ImportError:
        raise Skipped("psutil is not installed (the test extra brings it)") from None
    batches, batch = max(6, int(seconds * 4)), 10
    per_task: dict[str, list[float]] = {"today": [], CPU_BASELINE: []}
    switches: dict[str, list[float]] = {"today": [], CPU_BASELINE: []}
    wake_us = await _wake_cpu_us()
    async with contextlib.AsyncExitStack() as stack:
        old = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        servers = []
        for name, source in (("today", None), (CPU_BASELINE, checkout_of(CPU_BASELINE, old))):
            fake, agent = task_server(stack, workspace, name, batches * batch + 1, source=source)
            servers.append((name, fake, agent))
        channels = []
        for name, fake, agent in servers:
            stub = await warmed_up(stack, fake, agent, name)
            channels.append((name, stub, psutil.Process(agent.proc.pid)))
        for round_ in range(batches):
            for name, stub, server in channels if round_ % 2 == 0 else channels[::-1]:
                before, switched = server.cpu_times(), _switches(server.pid)
                for _ in range(batch):
                    await run_task(stub)
                after = server.cpu_times()
                switches[name].append((_switches(server.pid) - switched) / batch)
                spent = (after.user + after.system - before.user - before.system) * 1000
                per_task[name].append(spent / batch)
    today, base = statistics.median(per_task["today"]), statistics.median(per_task[CPU_BASELINE])
    return [
        Row(
            f"server CPU per six-turn task, median of {batches} batches of {batch} (ms)",
            f"{today:.1f}",
            "report",
        ),
        Row("server CPU per six-turn task, lowest / highest batch (ms)", spread(per_task["today"])),
        Row(f"server CPU per six-turn task on {CPU_BASELINE}, alternating (ms)", f"{base:.1f}"),
        Row(
            f"server CPU per six-turn task on {CPU_BASELINE}, lowest / highest (ms)",
            spread(per_task[CPU_BASELINE]),
        ),
        Row(f"server CPU per task, today / {CPU_BASELINE}", f"{today / base:.2f}", "report"),
        Row(
            f"server threads switched off the CPU per task, today / on {CPU_BASELINE}",
            f"{statistics.median(switches['today']):.0f} / {statistics.median(switches[CPU_BASELINE]):.0f}",
        ),
        Row("this machine: CPU per event-loop wake-up from a 1 ms sleep (us)", f"{wake_us:.0f}"),
    ]


TURN_KINDS: dict[str, tuple[str, dict[str, object]] | None] = {
    "the answer alone": None,
    "read_file": ("read_file", {"path": "task.py"}),
    "grep": ("grep", {"pattern": "def greet", "path": "."}),
    "bash": ("bash", {"command": "head -c 64 task.py"}),
    "write_file": ("write_file", {"path": "task.py", "content": TASK_SOURCE}),
}
"""What `turn_cpu` measures: tasks of one tool five times, then the answer (None: the answer alone)."""


def _kind_turns(call: tuple[str, dict[str, object]] | None) -> list[dict[str, object]]:
    turn: dict[str, object] = (
        {} if call is None else {"tool_calls": [{"name": call[0], "arguments": call[1]}]}
    )
    return [*([turn] * (5 if call else 0)), {"content": "Done."}]


def cpu_ns(pid: int) -> int:
    """The CPU the process's threads have run so far, in ns (schedstat: finer than the 10 ms ticks
    of cpu_times, which a per-turn figure needs)."""
    return _per_thread(pid, "schedstat", lambda text: int(text.split()[0]))


async def bench_turn_cpu(seconds: float, workspace: Path) -> list[Row]:
    """Where the six-turn task's CPU goes: the server's own CPU per task of one tool five times and
    then the answer, for each tool of the task, in batches of ten tasks (each in a new session)
    alternating between the kinds after a warm-up round; medians. A tool's turn is its task less
    the answer alone, over five."""
    if sys.platform != "linux":
        raise Skipped("it reads Linux's /proc/<pid>/schedstat")
    rounds, batch, kinds = max(4, int(seconds)), 10, list(TURN_KINDS)
    order = [kind for r in range(rounds + 1) for kind in (kinds if r % 2 == 0 else kinds[::-1])]
    script = workspace / "turns.json"
    script.write_text(
        json.dumps([t for kind in order for _ in range(batch) for t in _kind_turns(TURN_KINDS[kind])])
    )
    root = workspace / "turns"
    root.mkdir()
    (root / "task.py").write_text(TASK_SOURCE)
    per_task: dict[str, list[float]] = {kind: [] for kind in kinds}
    with FakeLLMProcess(0, turns_file=script) as fake, agent_process(root) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await initialize(stub, fake.base_url)
            for index, kind in enumerate(order):
                before = cpu_ns(agent.proc.pid)
                for _ in range(batch):
                    if errors := await run_task(stub):
                        raise RuntimeError(f"a {kind} task failed: {errors}")
                if index >= len(kinds):  # the first round warms up
                    per_task[kind].append((cpu_ns(agent.proc.pid) - before) / batch / 1e6)
    answer = statistics.median(per_task["the answer alone"])
    rows = [Row("server CPU per task: the answer alone, in a new session (ms)", f"{answer:.1f}")]
    for kind in kinds[1:]:
        task = statistics.median(per_task[kind])
        rows.append(
            Row(f"server CPU per {kind} turn (its task {task:.1f} ms) (ms)", f"{(task - answer) / 5:.2f}")
        )
    return rows


def spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {max(values):.1f}"
