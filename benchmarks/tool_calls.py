"""Tools through ExecuteTool against the same work done directly: `tools` (read_file, grep against
rg, find_definition), `mcp` (an MCP server's tool against its SDK client) and `sandbox` (each OS
sandbox against none)."""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.tools.process import find_binary

from .common import agent_process, calls_per_second, health, initialize, read_file_call, run_task, task_server
from .report import Row

MCP_ECHO = Path(__file__).with_name("mcp_echo.py")


def _generate_tree(root: Path, megabytes: int, needle: str) -> None:
    """Text files of pseudo-random words, ~50 KB each; the needle on one line of every 100th file."""
    rng = random.Random(7)
    words = [f"w{rng.randrange(10**6):06d}" for _ in range(5000)]
    for index in range(megabytes * 20):
        folder = root / f"d{index % 40:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = [" ".join(rng.choices(words, k=9)) for _ in range(780)]
        if index % 100 == 0:
            lines[rng.randrange(len(lines))] += f" {needle}"
        (folder / f"f{index:05d}.txt").write_text("\n".join(lines) + "\n")


def _generate_sources(root: Path, count: int, symbol: str) -> None:
    """`count` small Python modules; one defines `symbol`, a few call it."""
    for index in range(count):
        folder = root / f"pkg{index % 100:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        body = f"def helper_{index}(x):\n    return x + {index}\n\n\nclass Thing{index}:\n    pass\n"
        if index == count // 2:
            body += f"\n\ndef {symbol}(value):\n    return value * 2\n"
        elif index % 1000 == 0:
            body += f"\n\nprint({symbol}(1))\n"
        (folder / f"mod{index:05d}.py").write_text(body)


def _median_time(fn: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def bench_tools(seconds: float, workspace: Path) -> list[Row]:
    (workspace / "small.txt").write_text(("lorem ipsum dolor sit amet " * 3 + "\n") * 50)  # ~4 KB
    tree = workspace / "tree"
    _generate_tree(tree, 100, "NEEDLE_4f2a")
    sources = workspace / "src"
    _generate_sources(sources, 10_000, "target_symbol")
    with agent_process(workspace) as agent:
        agent.wait_healthy()
        health_rate = await calls_per_second(agent.address, health, seconds)
        read_rate = await calls_per_second(agent.address, read_file_call("small.txt"), seconds)
        with grpc.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)

            def tool(name: str, **arguments: object) -> pb.ToolResult:
                request = pb.ExecuteToolRequest(tool_name=name, arguments=json.dumps(arguments))
                result = stub.ExecuteTool(request, timeout=120).result
                assert result.success, result.error
                return result

            rg = find_binary("rg")
            assert rg is not None
            direct = _median_time(
                lambda: subprocess.run([rg, "-n", "NEEDLE_4f2a", str(tree)], capture_output=True, check=True)
            )
            through = _median_time(lambda: tool("grep", pattern="NEEDLE_4f2a", path="tree"))
            matches = tool("grep", pattern="NEEDLE_4f2a", path="tree").metadata["matches"]
            definition = _median_time(lambda: tool("find_definition", symbol="target_symbol", path="src"))
            found = tool("find_definition", symbol="target_symbol", path="src").output.splitlines()[0]
    size_mb = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file()) / 1e6
    return [
        Row("ExecuteTool(read_file 4 KB) calls/s", f"{read_rate:,.0f}"),
        Row("read_file calls/s / HealthCheck calls/s", f"{read_rate / health_rate:.2f}", ">= 0.7"),
        Row(f"grep over {size_mb:.0f} MB ({matches} matches): rg direct (s)", f"{direct:.3f}"),
        Row("grep through ExecuteTool (s)", f"{through:.3f}"),
        Row("grep ratio (ExecuteTool / rg)", f"{through / direct:.2f}", "<= 1.2"),
        Row(f"find_definition in 10,000 files (s) [{found.split(':')[0]}]", f"{definition:.3f}", "report"),
    ]


async def _mean_call_s(call: Callable[[], Awaitable[object]], seconds: float) -> float:
    """Mean seconds per call, one after another for `seconds`, after a warm-up call."""
    await call()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        await call()
        calls += 1
    return (time.perf_counter() - started) / calls


async def bench_mcp(seconds: float, workspace: Path) -> list[Row]:
    """One MCP tool call over stdio: through the agent (ExecuteTool of `mcp__fx__echo`, the server
    in --mcp-config, its script readable in the sandbox as an operator would allow) against the same
    server called directly with the SDK's client."""
    from mcp import Client, StdioServerParameters

    echo = [str(MCP_ECHO)]
    config = workspace.parent / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"fx": {"command": sys.executable, "args": echo}}}))
    async with Client(StdioServerParameters(command=sys.executable, args=echo), cache=None) as client:
        direct = await _mean_call_s(lambda: client.call_tool("echo", {"text": "hi"}), seconds)
    readable = {"A3S_SANDBOX_READ": str(MCP_ECHO.parent)}
    with agent_process(workspace, extra=("--mcp-config", str(config)), env=readable) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            request = pb.ExecuteToolRequest(tool_name="mcp__fx__echo", arguments='{"text": "hi"}')
            through = await _mean_call_s(lambda: stub.ExecuteTool(request, timeout=60), seconds)
    return [
        Row("MCP tool call over stdio, SDK client direct (ms)", f"{direct * 1000:.2f}"),
        Row("the same through ExecuteTool (ms)", f"{through * 1000:.2f}"),
        Row("MCP call ratio (ExecuteTool / direct)", f"{through / direct:.2f}", "<= 2"),
    ]


SANDBOXES = ("off", "bwrap", "landlock")
"""What `sandbox` compares: the unsandboxed runner (--sandbox off) and each mechanism."""
_BASH_ROUNDS, _BASH_CALLS = 3, 100


async def bench_sandbox(seconds: float, workspace: Path) -> list[Row]:
    """The sandbox's cost per call of `bash true` and per six-turn task end to end, for each
    mechanism against the unsandboxed runner, measured side by side in rounds that alternate."""
    bash_ms = _bash_true_ms_by_sandbox(workspace)
    task_ms = await _task_ms_by_sandbox(seconds, workspace)
    rows = [Row(f"ExecuteTool(bash true) median, --sandbox {m} (ms)", f"{bash_ms[m]:.2f}") for m in SANDBOXES]
    rows += [
        Row(f"six-turn task end to end median, --sandbox {m} (ms)", f"{task_ms[m]:.1f}") for m in SANDBOXES
    ]
    for mechanism in SANDBOXES[1:]:
        rows.append(
            Row(
                f"bash true ratio ({mechanism} / off)", f"{bash_ms[mechanism] / bash_ms['off']:.2f}", "<= 1.5"
            )
        )
        rows.append(
            Row(
                f"six-turn task ratio ({mechanism} / off)",
                f"{task_ms[mechanism] / task_ms['off']:.2f}",
                "<= 1.1",
            )
        )
    return rows


def _bash_true_ms_by_sandbox(workspace: Path) -> dict[str, float]:
    """The median ExecuteTool(bash "true") latency of a server under each of SANDBOXES, one server
    at a time, rounds alternating between them; each server's first ten calls warm up."""
    times: dict[str, list[float]] = {mode: [] for mode in SANDBOXES}
    for _ in range(_BASH_ROUNDS):
        for mode in times:
            with agent_process(workspace, extra=("--sandbox", mode)) as agent:
                agent.wait_healthy()
                with grpc.insecure_channel(agent.address) as channel:
                    stub = pb_grpc.CodeAgentServiceStub(channel)
                    request = pb.ExecuteToolRequest(
                        tool_name="bash", arguments=json.dumps({"command": "true"})
                    )
                    for index in range(_BASH_CALLS + 10):
                        started = time.perf_counter()
                        result = stub.ExecuteTool(request, timeout=60).result
                        if index >= 10:
                            times[mode].append(time.perf_counter() - started)
                        assert result.success and result.metadata["sandbox"] == mode, result
    return {mode: statistics.median(t) * 1000 for mode, t in times.items()}


async def _task_ms_by_sandbox(seconds: float, workspace: Path) -> dict[str, float]:
    """The median wall time of the scripted six-turn task (each in a new session) on a server under
    each of SANDBOXES: all running at once, each with its fake LLM, batches of five tasks
    alternating between them after a warm-up task each."""
    batches, batch = max(4, int(seconds * 2)), 5
    times: dict[str, list[float]] = {mode: [] for mode in SANDBOXES}
    async with contextlib.AsyncExitStack() as stack:
        stubs = []
        for mode in SANDBOXES:
            fake, agent = task_server(
                stack, workspace, f"task-{mode}", batches * batch + 1, extra=("--sandbox", mode)
            )
            agent.wait_healthy()
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(agent.address))
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await initialize(stub, fake.base_url)
            if errors := await run_task(stub):
                raise RuntimeError(f"the six-turn task failed with --sandbox {mode}: {errors}")
            stubs.append((mode, stub))
        for round_ in range(batches):
            for mode, stub in stubs[round_ % len(stubs) :] + stubs[: round_ % len(stubs)]:
                for _ in range(batch):
                    started = time.perf_counter()
                    await run_task(stub)
                    times[mode].append(time.perf_counter() - started)
    return {mode: statistics.median(t) * 1000 for mode, t in times.items()}
