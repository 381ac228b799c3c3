"""`delegation`: a parent that sends two `explore` children (the `task` tool) to read and grep, then
answers, against the same reads and greps done inline in one session.

The fake model runs in a process of its own (`python -m benchmarks.delegation --fake-llm RECORDS`):
it plays each conversation from the first word of its first user message (the run's kind, or the
folder a child explores) and appends a line for each request to RECORDS, with the request's size at
a conversation's final turn."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_process import FakeServerProcess

from .common import ROOT, agent_process, initialize, run_task
from .cpu import cpu_ns
from .report import Row

SOURCES = {"lib_a": ("textwrap", "tokenize"), "lib_b": ("heapq", "selectors")}
"""What each child explores: a folder of two standard-library modules (about 45 KB each pair), copied
from this Python into the workspace, so the reads are of real source files."""
PATTERN = r"self\.\w+"
"""What each child greps its folder for (some 70 matching lines, 4-5 KB, in each)."""
EXTRA_FILE = "NOTES.md"
"""The one-line file read by the inline run's extra turn."""
DELEGATED, INLINE, EXTRA = "delegated", "inline", "inline+1"
KINDS = (DELEGATED, INLINE, EXTRA)

Call = tuple[str, dict[str, Any]]


def _explore_calls(folder: str) -> list[Call]:
    """The explorer's work in `folder`: read each module, then grep them, one call per turn."""
    reads: list[Call] = [("read_file", {"path": f"{folder}/{module}.py"}) for module in SOURCES[folder]]
    return [*reads, ("grep", {"pattern": PATTERN, "path": folder})]


def _child_prompt(folder: str) -> str:
    """A child's task; its first word names the folder, which the fake plays from."""
    return (
        f"{folder} Read the modules in {folder}/ and grep them for `self.` attributes: which state "
        "does each class keep, and where is it set? Name the files and lines."
    )


def _child_answer(folder: str) -> str:
    """An explorer's answer of a realistic length (about 700 bytes), the same for every run."""
    first, second = (f"{folder}/{module}.py" for module in SOURCES[folder])
    return (
        f"{first}: one class keeps its settings as attributes set in __init__ (lines 120-160) and "
        "reads them in its wrapping loop; the module-level helpers keep no state. "
        f"{second}: the classes keep their registered file objects in a dict built in __init__, "
        "a map of keys by descriptor, and a selector object where the platform has one; "
        "register and unregister change the map, select reads it, close drops it. "
        f"The grep for self-attributes found the same attributes in both files, set in __init__ and "
        "in the register methods only, never elsewhere: no class shares state with another, and "
        "nothing is set from outside the class. No global state beyond constants and caches."
    )


FINAL = (
    "Both folders keep their state in instance attributes set in __init__ (and the selectors' "
    "register/unregister): no shared or global state to worry about."
)


def scripts() -> dict[str, list[list[Call] | str]]:
    """Each conversation's turns, by the first word of its first user message: the tool calls of a
    turn, or its final answer."""
    task_calls: list[Call] = [
        ("task", {"agent": "explore", "description": f"explore {folder}", "prompt": _child_prompt(folder)})
        for folder in SOURCES
    ]
    inline: list[list[Call] | str] = [[c] for folder in SOURCES for c in _explore_calls(folder)]
    return {
        DELEGATED: [task_calls, FINAL],
        INLINE: [*inline, FINAL],
        EXTRA: [*inline, [("read_file", {"path": EXTRA_FILE})], FINAL],
        **{folder: [*([c] for c in _explore_calls(folder)), _child_answer(folder)] for folder in SOURCES},
    }


# --- the fake model ---------------------------------------------------------------------------------


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def serve_fake(records: Path) -> None:
    """The scripted fake of every conversation, appending a JSON line `{"script", "bytes"}` to
    `records` for each request: its conversation's script, and at the final turn the size of the
    request's body as compact JSON (tools included; None before)."""
    from a3s_agent.testing.fake_llm import READY_PREFIX, FakeLLM, text, tool_calls

    turns, lock = scripts(), threading.Lock()

    def play(body: dict[str, Any]) -> Any:
        messages = body.get("messages") or []
        first = next(i for i, m in enumerate(messages) if m.get("role") == "user")
        script = str(messages[first].get("content")).split()[0]
        turn = turns[script][sum(m.get("role") == "assistant" for m in messages[first:])]
        size = len(_compact(body)) if isinstance(turn, str) else None
        with lock, records.open("a") as out:
            out.write(json.dumps({"script": script, "bytes": size}) + "\n")
        return text(turn) if isinstance(turn, str) else tool_calls(turn)

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with FakeLLM(fallback=play) as fake:
            print(f"{READY_PREFIX} {fake.base_url}", flush=True)
            await stop.wait()

    asyncio.run(run())


def _recorded(records: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The requests of each script, and its final request's size (the same at every run: the
    median of them)."""
    requests: dict[str, int] = {}
    sizes: dict[str, list[int]] = {}
    for line in records.read_text().splitlines():
        record = json.loads(line)
        requests[record["script"]] = requests.get(record["script"], 0) + 1
        if record["bytes"] is not None:
            sizes.setdefault(record["script"], []).append(record["bytes"])
    return requests, {script: int(statistics.median(values)) for script, values in sizes.items()}


# --- the section ------------------------------------------------------------------------------------


def _workspace(root: Path) -> None:
    for folder, modules in SOURCES.items():
        (root / folder).mkdir(parents=True)
        for module in modules:
            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin is not None, module
            shutil.copyfile(spec.origin, root / folder / f"{module}.py")
    (root / EXTRA_FILE).write_text("Nothing here yet.\n")


async def bench_delegation(seconds: float, workspace: Path) -> list[Row]:
    """The three kinds of run, each in a new session over StreamGenerate, one of each per round in
    an order that alternates, after a warm-up run of each: the delegated one (a turn of two `task`
    calls to `explore`, each child reading its folder's two modules and grepping them, one call per
    turn, then answering; then the parent's answer), the inline one (the same six calls, one per
    turn, then the answer) and the inline one with an extra turn (a read of a one-line file before
    the answer). The server's own CPU (schedstat) and the wall time of each run, medians; the extra
    turn's cost and each child's overhead from the differences within each round."""
    root = workspace / "repo"
    _workspace(root)
    records = workspace / "requests.jsonl"
    rounds = max(2, int(seconds * 10))
    cpu_ms: dict[str, list[float]] = {kind: [] for kind in KINDS}
    wall_ms: dict[str, list[float]] = {kind: [] for kind in KINDS}
    fake = FakeServerProcess("benchmarks.delegation", "--fake-llm", str(records), cwd=ROOT)
    with fake, agent_process(root) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await initialize(stub, fake.base_url)
            for index in range(rounds + 1):
                for kind in KINDS if index % 2 == 0 else KINDS[::-1]:
                    cpu, started = cpu_ns(agent.proc.pid), time.perf_counter()
                    if errors := await run_task(stub, kind):
                        raise RuntimeError(f"the {kind} run failed: {errors}")
                    if index > 0:  # the first round warms up
                        wall_ms[kind].append((time.perf_counter() - started) * 1000)
                        cpu_ms[kind].append((cpu_ns(agent.proc.pid) - cpu) / 1e6)
    requests, sizes = _recorded(records)
    if missing := sorted({*KINDS, *SOURCES} - set(sizes)):
        raise RuntimeError(f"no final turn was played for {', '.join(missing)}")
    runs = rounds + 1  # of each kind, the warm-up's included
    delegated = requests[DELEGATED] + sum(requests[folder] for folder in SOURCES)
    rows = [
        Row(
            f"model requests per run: delegated (parent and {len(SOURCES)} children) / inline",
            f"{delegated / runs:g} / {requests[INLINE] / runs:g}",
        )
    ]
    for figure, medians in (("server CPU", cpu_ms), ("wall time", wall_ms)):
        rows += _overhead_rows(figure, medians)
    parent, inline = sizes[DELEGATED], sizes[INLINE]
    child = max(sizes[folder] for folder in SOURCES)
    return [
        *rows,
        Row("parent's request at its final turn (bytes)", f"{parent}"),
        Row("inline run's request at its final turn (bytes)", f"{inline}"),
        Row("a child's request at its final turn, the larger (bytes)", f"{child}"),
        Row("parent's final request / inline's", f"{parent / inline:.2f}", "<= 0.5"),
    ]


def _overhead_rows(figure: str, runs: dict[str, list[float]]) -> list[Row]:
    """`figure`'s medians per run; one extra turn's cost (the extra run less the inline one) and each
    child's overhead (the delegated run less the inline one, per child) as medians of those
    differences within each round, so that a change in the machine's load between rounds cancels."""
    median = {kind: statistics.median(values) for kind, values in runs.items()}
    extra = statistics.median(map(float.__sub__, runs[EXTRA], runs[INLINE]))
    per_child = statistics.median(map(float.__sub__, runs[DELEGATED], runs[INLINE])) / len(SOURCES)
    return [
        Row(f"{figure} per run: delegated, median (ms)", f"{median[DELEGATED]:.1f}"),
        Row(f"{figure} per run: inline, median (ms)", f"{median[INLINE]:.1f}"),
        Row(f"{figure} per run: inline with an extra turn, median (ms)", f"{median[EXTRA]:.1f}"),
        Row(f"{figure}: delegated / inline", f"{median[DELEGATED] / median[INLINE]:.2f}", "report"),
        Row(f"{figure}: one extra model turn (ms)", f"{extra:.1f}"),
        Row(f"{figure}: overhead per child (ms)", f"{per_child:.1f}"),
        Row(
            f"{figure}: overhead per child / one extra model turn",
            f"{per_child / extra:.2f}" if extra > 0 else "n/a (no extra turn measured)",
            "<= 1",
        ),
    ]


if __name__ == "__main__":
    arguments = argparse.ArgumentParser(description="The delegation section's scripted fake model.")
    arguments.add_argument("--fake-llm", type=Path, required=True, metavar="RECORDS")
    serve_fake(arguments.parse_args().fake_llm)
