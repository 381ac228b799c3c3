#!/usr/bin/env python3
"""Benchmarks of a3s-agent, reported as ratios against baselines measured in the same run.

Usage: python tools/bench.py [--seconds S] [--only NAME ...]

Each section starts what it measures as real processes on 127.0.0.1 and prints
rows of (metric, value, target). Nothing here is a test: figures go to the README.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from a3s_agent.base.models import SessionConfig  # noqa: E402
from a3s_agent.core.events import EVENT, EventBus, EventType, Filter, event_entry  # noqa: E402
from a3s_agent.core.session import Session  # noqa: E402
from a3s_agent.core.sqlite_store import SqliteStore  # noqa: E402
from a3s_agent.proto import code_agent_pb2 as pb  # noqa: E402
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc  # noqa: E402
from a3s_agent.testing.fake_process import FakeServerProcess  # noqa: E402
from a3s_agent.testing.flood import FLOOD, SERVER_NOFILE, Flood, open_files, raise_own_open_files_limit  # noqa: E402
from a3s_agent.testing.ports import free_port  # noqa: E402
from a3s_agent.testing.stored_sessions import write_sessions  # noqa: E402
from a3s_agent.tools.atomic import write_atomically  # noqa: E402
from a3s_agent.tools.process import find_binary  # noqa: E402

CONCURRENCY = 32


@dataclass
class Row:
    metric: str
    value: str
    target: str = ""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Process:
    """A server subprocess on a free port, stopped on exit."""

    def __init__(self, argv: list[str], port: int, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def wait_healthy(self, timeout_s: float = 20) -> float:
        """Seconds from process start until HealthCheck answers HEALTHY."""
        deadline = time.monotonic() + timeout_s
        # Without these, the channel waits a second after the first refused connection before
        # trying again, and that wait would be counted as start-up time.
        fast_retry = [("grpc.initial_reconnect_backoff_ms", 10), ("grpc.min_reconnect_backoff_ms", 10),
                      ("grpc.max_reconnect_backoff_ms", 20)]  # fmt: skip
        with grpc.insecure_channel(self.address, options=fast_retry) as channel:
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


def agent_process(
    workspace: Path,
    http_port: int | None = None,
    source: Path | None = None,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> Process:
    """`a3s-agent serve` on free ports, its data beside the workspace (`extra` may give another
    --data-dir); `source` runs another checkout's code (e.g. an older commit); `env` adds variables;
    `prefix` is a command that execs the server (e.g. prlimit)."""
    port = free_port()
    http_port = http_port or free_port()
    argv = [*prefix, sys.executable, "-m", "a3s_agent", "serve", "--listen", f"127.0.0.1:{port}",
            "--workspace", str(workspace), "--log-level", "WARNING", "--max-sessions", "10000000",
            "--http-listen", f"127.0.0.1:{http_port}", "--data-dir", f"{workspace}.data", *extra]  # fmt: skip
    python_path = {"PYTHONPATH": str(source)} if source is not None else {}
    return Process(argv, port, workspace, {**os.environ, **python_path, **(env or {})})


def bare_process(workspace: Path) -> Process:
    port = free_port()
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


async def _attacker(ports: list[int]) -> None:
    """`--attacker PORT...`: FLOOD silent connections per port, reopened as the server closes them,
    in a process of its own (so that its work does not slow the measuring client). Prints
    `connected` once every one got through (or after 60 s); SIGUSR1 stops the reconnecting (the
    connections held stay open), SIGTERM ends it."""
    raise_own_open_files_limit(len(ports) * FLOOD + 256)
    loop = asyncio.get_running_loop()
    stop_reconnecting, end = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, stop_reconnecting.set)
    loop.add_signal_handler(signal.SIGTERM, end.set)
    flood = Flood(ports)
    try:
        with contextlib.suppress(TimeoutError):  # a server out of files accepts no more
            await asyncio.wait_for(flood.until_all_connected(), 60)
        print("connected", flush=True)
        await stop_reconnecting.wait()
        await flood.stop_reconnecting()
        await end.wait()
    finally:
        await flood.close()


class _AttackerProcess:
    """tools/bench.py --attacker on `ports`, started at enter, ended at exit."""

    def __init__(self, ports: list[int]) -> None:
        argv = [sys.executable, __file__, "--attacker", *map(str, ports)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)

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


def _read_file_call(path: str) -> Callable[[pb_grpc.CodeAgentServiceStub], Awaitable[object]]:
    request = pb.ExecuteToolRequest(tool_name="read_file", arguments=json.dumps({"path": path}))

    async def call(stub: pb_grpc.CodeAgentServiceStub) -> None:
        reply = await stub.ExecuteTool(request)
        assert reply.result.success, reply.result.error

    return call


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
            pairs[level] = await calls_per_second(agent.address, _session_pair, seconds)
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
        health_rate = await calls_per_second(agent.address, _health, seconds)
        read_rate = await calls_per_second(agent.address, _read_file_call("small.txt"), seconds)
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
        Row(f"find_definition in 10,000 files (s) [{found.split(':')[0]}]", f"{definition:.3f}", "< 1"),
    ]


class FakeLLMProcess(FakeServerProcess):
    """a3s_agent/testing/fake_llm.py (or `fake`, e.g. fake_anthropic) as a subprocess: each
    conversation makes `rounds` read_file calls, then answers."""

    def __init__(
        self,
        rounds: int,
        delay_ms: float = 0,
        tool: str = "read_file",
        arguments: str = '{"path": "small.txt"}',
        answer: str = "Done.",
        fake: str = "fake_llm",
        turns_file: Path | None = None,
    ) -> None:
        super().__init__(
            f"a3s_agent.testing.{fake}", "--port", "0", "--tool-rounds", str(rounds), "--tool-name", tool,
            "--tool-args", arguments, "--text", answer, *(["--delay-ms", str(delay_ms)] if delay_ms else []),
            *(["--turns-file", str(turns_file)] if turns_file else []),
        )  # fmt: skip


async def _initialize(stub: pb_grpc.CodeAgentServiceStub, base_url: str) -> None:
    llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=base_url, api_key="sk-bench")
    await stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))


async def _stream_generation(stub: pb_grpc.CodeAgentServiceStub) -> int:
    """One StreamGenerate on a new session; returns the number of model turns."""
    created = await stub.CreateSession(pb.CreateSessionRequest())
    request = pb.GenerateRequest(
        session_id=created.session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content="go")]
    )
    turns = 0
    async for chunk in stub.StreamGenerate(request):
        if chunk.type == pb.GenerateChunk.CHUNK_TYPE_METADATA:
            turns += 1
    return turns


async def _direct_turns(base_url: str, turns: int) -> float:
    """Seconds for `turns` streamed completions made straight to the fake with the openai client."""
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0) as client:
        messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
        started = time.perf_counter()
        for _ in range(turns):
            stream = await client.chat.completions.create(
                model="fake-model", messages=messages, stream=True, stream_options={"include_usage": True}
            )
            async for chunk in stream:
                for choice in chunk.choices:
                    for call in choice.delta.tool_calls or []:
                        if call.id:
                            messages.append(
                                {
                                    "role": "assistant",
                                    "content": None,
                                    "tool_calls": [
                                        {
                                            "id": call.id,
                                            "type": "function",
                                            "function": {
                                                "name": "read_file",
                                                "arguments": '{"path": "small.txt"}',
                                            },
                                        }
                                    ],
                                }
                            )
                            messages.append({"role": "tool", "tool_call_id": call.id, "content": "lorem"})
        return time.perf_counter() - started


async def _client_cpu_ms(base_url: str, turns: int) -> tuple[float, float]:
    """Process CPU (ms) per streamed model turn, the same turns from the same fake: our provider's,
    then the `openai` package's. The fake runs in its own process, so only the client is counted."""
    import openai

    from a3s_agent.base.models import LLMConfig
    from a3s_agent.llm.openai_compat import OpenAICompatibleProvider
    from a3s_agent.llm.provider import CompletionRequest

    messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    provider = OpenAICompatibleProvider(LLMConfig(model="fake-model", base_url=base_url, api_key="sk-bench"))
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)

    async def ours() -> None:
        async for _ in provider.stream(CompletionRequest(model="fake-model", messages=messages)):
            pass

    async def package() -> None:
        stream = await client.chat.completions.create(
            model="fake-model", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        async for _ in stream:
            pass

    try:
        return await _cpu_ms(ours, turns), await _cpu_ms(package, turns)
    finally:
        await provider.close()
        await client.close()


async def _anthropic_client_cpu_ms(base_url: str, turns: int) -> tuple[float, float]:
    """The same for Anthropic's Messages API: our provider's CPU per streamed turn, then the
    `anthropic` package's (its raw event stream, as the openai package's above)."""
    import anthropic

    from a3s_agent.base.models import LLMConfig
    from a3s_agent.llm.anthropic_provider import AnthropicProvider
    from a3s_agent.llm.provider import CompletionRequest

    messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    llm = LLMConfig(provider="anthropic", model="claude-bench", base_url=base_url, api_key="sk-bench")
    provider = AnthropicProvider(llm)
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-bench", max_retries=0)

    async def ours() -> None:
        async for _ in provider.stream(CompletionRequest(model="claude-bench", messages=messages)):
            pass

    async def package() -> None:
        stream = await client.messages.create(
            model="claude-bench", max_tokens=8192, messages=messages, stream=True
        )
        async for _ in stream:
            pass

    try:
        return await _cpu_ms(ours, turns), await _cpu_ms(package, turns)
    finally:
        await provider.close()
        await client.close()


async def _cpu_ms(turn: Callable[[], Awaitable[None]], turns: int) -> float:
    """Process CPU (ms) per call of `turn`, after a warm-up (connections, first-use imports)."""
    for _ in range(20):
        await turn()
    started = time.process_time()
    for _ in range(turns):
        await turn()
    return (time.process_time() - started) / turns * 1000


async def _cpu_rows(turns: int) -> list[Row]:
    rows = []
    answer = "The quick brown fox jumps over the lazy dog. " * 45  # about 2 KB, 8 characters a chunk
    for what, rounds, text in (("a tool call", 1, "Done."), ("a 2 KB answer", 0, answer)):
        with FakeLLMProcess(rounds, answer=text) as fake:
            ours, package = await _client_cpu_ms(fake.base_url, turns)
        with FakeLLMProcess(rounds, answer=text, fake="fake_anthropic") as fake:
            ours_a, package_a = await _anthropic_client_cpu_ms(fake.base_url, turns)
        rows += [
            Row(f"client CPU per streamed turn, {what}: ours (ms)", f"{ours:.3f}"),
            Row(f"client CPU per streamed turn, {what}: openai package (ms)", f"{package:.3f}"),
            Row(f"client CPU ratio, {what} (ours / openai package)", f"{ours / package:.2f}", "<= 0.2"),
            Row(f"client CPU per streamed turn, {what}, anthropic: ours (ms)", f"{ours_a:.3f}"),
            Row(
                f"client CPU per streamed turn, {what}, anthropic: anthropic package (ms)", f"{package_a:.3f}"
            ),
            Row(
                f"client CPU ratio, {what}, anthropic (ours / anthropic package)",
                f"{ours_a / package_a:.2f}",
                "<= 0.2",
            ),
        ]
    return rows


async def bench_agent(seconds: float, workspace: Path) -> list[Row]:
    (workspace / "small.txt").write_text("lorem ipsum\n" * 300)
    rounds = 19  # 20 model turns per generation
    with FakeLLMProcess(rounds) as fake, agent_process(workspace) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
            await _stream_generation(stub)  # warm up
            runs, agent_time, turns = 5, 0.0, 0
            for _ in range(runs):
                started = time.perf_counter()
                turns += await _stream_generation(stub)
                agent_time += time.perf_counter() - started
        direct_time = sum([await _direct_turns(fake.base_url, rounds + 1) for _ in range(runs)])
    per_turn_agent = agent_time / turns * 1000
    per_turn_direct = direct_time / (runs * (rounds + 1)) * 1000
    with FakeLLMProcess(2, delay_ms=200) as slow, agent_process(workspace) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, slow.base_url)
            await _stream_generation(stub)  # warm up: connections to the fake, first-use costs
            started = time.perf_counter()
            await _stream_generation(stub)
            one = time.perf_counter() - started
            started = time.perf_counter()
            await asyncio.gather(*(_stream_generation(stub) for _ in range(100)))
            hundred = time.perf_counter() - started
    return [
        Row("model turn through StreamGenerate (ms)", f"{per_turn_agent:.2f}"),
        Row("direct openai streamed call to the fake (ms)", f"{per_turn_direct:.2f}"),
        Row("agent overhead per model turn (ms)", f"{per_turn_agent - per_turn_direct:.2f}", "<= 5"),
        Row("turn time ratio (agent / direct)", f"{per_turn_agent / per_turn_direct:.2f}", "report"),
        Row("one 3-turn generation, 200 ms per reply (s)", f"{one:.2f}"),
        Row("100 concurrent 3-turn generations (s)", f"{hundred:.2f}"),
        Row("concurrency ratio (100 concurrent / one)", f"{hundred / one:.2f}", "<= 2.0"),
        *await _cpu_rows(max(200, int(seconds * 100))),
    ]


def _mixed_code(size: int) -> str:
    """About `size` characters of mixed source: Python, JavaScript, Go and prose comments."""
    rng = random.Random(11)
    pieces = [
        "def handler_{n}(request, *args, **kwargs):\n    return {{'status': {n}, 'items': [x * 2 for x in args]}}\n",
        "export async function load{n}(url) {{ const r = await fetch(url + '/{n}'); return r.json(); }}\n",
        "func Process{n}(ctx context.Context, in []byte) (int, error) {{ return len(in) + {n}, nil }}\n",
        "// TODO({n}): handle the empty case before release; see issue #{n} for the discussion.\n",
    ]
    out, length = [], 0
    while length < size:
        piece = rng.choice(pieces).format(n=rng.randrange(100_000))
        out.append(piece)
        length += len(piece)
    return "".join(out)[:size]


async def bench_context(seconds: float, workspace: Path) -> list[Row]:
    from a3s_agent.llm.tokens import TokenCounter

    counter = TokenCounter("gpt-4o")
    text = _mixed_code(1_000_000)
    counter.count_text("warm up")
    started = time.perf_counter()
    counter.count_text(text)
    throughput = len(text.encode()) / 1e6 / (time.perf_counter() - started)
    with FakeLLMProcess(0) as fake, agent_process(workspace) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
            usage_ms = await _usage_time(stub, 5000)
            compaction_s = await _compaction_time(stub, 500)
    return [
        Row("token counting, 1 MB of mixed code (MB/s)", f"{throughput:.1f}", ">= 10"),
        Row("GetContextUsage, 5,000-message session (ms)", f"{usage_ms:.1f}", "< 20"),
        Row("CompactContext, 500-message session, instant LLM (s)", f"{compaction_s:.3f}", "report"),
    ]


def _conversation(count: int) -> list[pb.Message]:
    roles = (pb.Message.ROLE_USER, pb.Message.ROLE_ASSISTANT)
    return [pb.Message(role=roles[i % 2], content=_mixed_code(400)) for i in range(count)]


async def _usage_time(stub: pb_grpc.CodeAgentServiceStub, count: int) -> float:
    created = await stub.CreateSession(pb.CreateSessionRequest(initial_context=_conversation(count)))
    request = pb.GetContextUsageRequest(session_id=created.session_id)
    await stub.GetContextUsage(request)  # the first call loads and counts; later ones are cached
    started = time.perf_counter()
    for _ in range(20):
        await stub.GetContextUsage(request)
    return (time.perf_counter() - started) / 20 * 1000


async def _compaction_time(stub: pb_grpc.CodeAgentServiceStub, count: int) -> float:
    # A 32k window: the conversation (about 50k tokens) is over the compaction target, so it compacts.
    config = pb.SessionConfig(max_context_length=32_000)
    created = await stub.CreateSession(
        pb.CreateSessionRequest(config=config, initial_context=_conversation(count))
    )
    started = time.perf_counter()
    reply = await stub.CompactContext(pb.CompactContextRequest(session_id=created.session_id))
    assert reply.after.message_count < reply.before.message_count
    return time.perf_counter() - started


async def bench_control(seconds: float, workspace: Path) -> list[Row]:
    (workspace / "small.txt").write_text("lorem ipsum\n" * 300)
    rounds = 30
    with FakeLLMProcess(rounds) as fake, agent_process(workspace) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
            await _stream_generation(stub)
            alone = await _per_tool_call_ms(stub, rounds, subscribers=0)
            watched = await _per_tool_call_ms(stub, rounds, subscribers=1)
            fanout = await _fanout_rate(stub, 10)
    with (
        FakeLLMProcess(1, tool="bash", arguments='{"command": "sleep 30"}') as fake,
        agent_process(workspace) as agent,
    ):
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
            cancel_ms = await _cancel_latency(stub)
    return [
        Row("events/s delivered to 10 subscribers", f"{fanout:,.0f}", "report"),
        Row("time per tool call, no subscriber (ms)", f"{alone:.2f}"),
        Row("added per tool call by one subscriber (ms)", f"{watched - alone:.2f}", "<= 1"),
        Row("Cancel to Generate returning CANCELLED during bash (ms)", f"{cancel_ms:.0f}", "< 200"),
    ]


async def _with_subscribers(
    stub: pb_grpc.CodeAgentServiceStub, subscribers: int, runs: int
) -> tuple[float, int]:
    """Seconds for `runs` generations while `subscribers` read every event, and events delivered."""
    delivered = [0]

    async def read(stream: grpc.aio.UnaryStreamCall) -> None:
        async for _ in stream:
            delivered[0] += 1

    streams = [stub.SubscribeEvents(pb.SubscribeEventsRequest()) for _ in range(subscribers)]
    readers = [asyncio.ensure_future(read(s)) for s in streams]
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    for _ in range(runs):
        await _stream_generation(stub)
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0.2)  # let the last events arrive
    for stream in streams:
        stream.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    return elapsed, delivered[0]


async def _per_tool_call_ms(stub: pb_grpc.CodeAgentServiceStub, rounds: int, subscribers: int) -> float:
    elapsed, _ = await _with_subscribers(stub, subscribers, 5)
    return elapsed / (5 * rounds) * 1000


async def _fanout_rate(stub: pb_grpc.CodeAgentServiceStub, subscribers: int) -> float:
    elapsed, delivered = await _with_subscribers(stub, subscribers, 5)
    return delivered / elapsed


async def _cancel_latency(stub: pb_grpc.CodeAgentServiceStub) -> float:
    """The fake's model asks for `sleep 30` first; Cancel while it runs."""
    times = []
    for _ in range(5):
        sid = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
        message = pb.Message(role=pb.Message.ROLE_USER, content="sleep")
        generation = asyncio.ensure_future(
            stub.Generate(pb.GenerateRequest(session_id=sid, messages=[message]))
        )
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        await stub.Cancel(pb.CancelRequest(session_id=sid))
        try:
            await generation
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.CANCELLED, err
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


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
            await _http_ready(client)
            async with client.post("/v1/spaces", json={"policy": "permissive"}) as reply:
                space = (await reply.json())["spaceId"]
            started = time.perf_counter()
            async with client.post(f"/v1/spaces/{space}/runs", json=operations) as reply:
                events = (await reply.json())["events"]
            run_rate = count / (time.perf_counter() - started)
            assert all(e["success"] for e in events), events[:3]
            healthz = await _requests_per_second(client, "/healthz", seconds)
    return [
        Row("createFile ops/s via /v1/spaces runs (1,000 in one run)", f"{run_rate:,.0f}"),
        Row("plain Python write_text loop (files/s)", f"{plain_rate:,.0f}"),
        Row("Agent Spaces ratio (runs / plain loop)", f"{run_rate / plain_rate:.2f}", ">= 0.3"),
        Row("GET /healthz requests/s", f"{healthz:,.0f}", "report"),
    ]


SECURITY_BASELINE = "378f305"
"""The last commit before the security issue's checks: measured beside today's code in one run."""


def _checkout_of(commit: str, dest: Path) -> Path:
    """The package source of `commit`, unpacked into `dest` (no work tree of ours is touched)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "a3s_agent"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


async def _security_rates(workspace: Path, seconds: float, source: Path | None) -> tuple[float, float, float]:
    http_port = free_port()
    with agent_process(workspace, http_port, source) as agent:
        agent.wait_healthy()
        health = await calls_per_second(agent.address, _health, seconds)
        reads = await calls_per_second(agent.address, _read_file_call("small.txt"), seconds)
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{http_port}") as client:
            await _http_ready(client)
            healthz = await _requests_per_second(client, "/healthz", seconds)
    return health, reads, healthz


async def bench_security(seconds: float, workspace: Path) -> list[Row]:
    """The cost of the security checks: the same calls against the code before them and today's,
    alternating (two rounds each, medians), so machine load affects both alike."""
    (workspace / "small.txt").write_text(("lorem ipsum dolor sit amet " * 3 + "\n") * 50)  # ~4 KB
    with tempfile.TemporaryDirectory() as old:
        before_source = _checkout_of(SECURITY_BASELINE, Path(old))
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


async def _http_ready(client: aiohttp.ClientSession) -> None:
    """The HTTP face starts right after gRPC reports SERVING: wait for it."""
    for _ in range(200):
        try:
            async with client.get("/healthz") as reply:
                if reply.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the HTTP face never came up")


async def _requests_per_second(client: aiohttp.ClientSession, path: str, seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            async with client.get(path) as reply:
                await reply.read()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return done / (time.perf_counter() - started)


CLIENT_OPTIONS = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
MESSAGE_BYTES = 1_000_000  # the big request is made of messages of this size


FLOOD_BASELINE = "341aeed"
"""The last commit without the gRPC connection cap, handshake timeout and open-files budget."""


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
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as old:
        before_source = _checkout_of(FLOOD_BASELINE, Path(old))
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
                        "< 100",
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
        Row(f"ListSessions with {label} (ms, median of 5)", f"{sorted(times)[2] * 1000:.1f}", "< 100"),
    ]


async def bench_sizes(seconds: float, workspace: Path) -> list[Row]:
    """Big requests and big stores (`seconds` is unused: these are single big operations)."""
    return [
        *await health_during_big_requests(workspace, 50),
        *await list_sessions_after_restart(workspace, 1000, 10_000),
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
    in --mcp-config) against the same server called directly with the SDK's client."""
    from mcp import Client, StdioServerParameters

    fixture = [str(ROOT / "tests" / "mcp_fixture.py"), "stdio"]
    config = workspace.parent / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"fx": {"command": sys.executable, "args": fixture}}}))
    async with Client(StdioServerParameters(command=sys.executable, args=fixture), cache=None) as client:
        direct = await _mean_call_s(lambda: client.call_tool("echo", {"text": "hi"}), seconds)
    with agent_process(workspace, extra=("--mcp-config", str(config))) as agent:
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


class _AcpEditor:
    """The editor's end of the ACP benchmark: counts the session updates it is sent."""

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
    from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
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
                editor, sys.executable, "-m", "a3s_agent", "acp", cwd=workspace,
                env={**env, "A3S_LLM_BASE_URL": fake.base_url}, transport_kwargs={"stderr": subprocess.DEVNULL},
            ) as (conn, _),
        ):  # fmt: skip
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
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


# --- replicas: PostgreSQL, several replicas, the durable event log ----------------------------------


class Postgres:
    """A PostgreSQL server from pgserver (the test extra) in `root`; `database` makes a new one."""

    def __init__(self, root: Path) -> None:
        import pgserver

        self.server = pgserver.get_server(root, cleanup_mode="stop")
        self.made = 0

    def database(self) -> str:
        import psycopg

        self.made += 1
        name = f"bench_{self.made}"
        with psycopg.connect(self.server.get_uri(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return str(self.server.get_uri(name))

    def __enter__(self) -> Postgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.cleanup()


def replica_process(workspace: Path, url: str, name: str) -> Process:
    """`a3s-agent serve` on PostgreSQL (`url`) as replica `name`, its data directory its own."""
    return agent_process(
        workspace, extra=("--store", url, "--replica-id", name, "--data-dir", f"{workspace}.{name}")
    )


async def _generation_s(stub: pb_grpc.CodeAgentServiceStub, runs: int) -> float:
    """Mean seconds of one StreamGenerate on a new session (after a warm-up)."""
    await _stream_generation(stub)
    started = time.perf_counter()
    for _ in range(runs):
        await _stream_generation(stub)
    return (time.perf_counter() - started) / runs


async def _store_rates(seconds: float, workspace: Path, url: str) -> tuple[float, float]:
    """CreateSession+GetSession pairs/s, and seconds per 3-turn generation, of one server."""
    extra = ("--store", url) if url else ()
    with FakeLLMProcess(2) as fake, agent_process(workspace, extra=extra) as agent:
        agent.wait_healthy()
        pairs = await calls_per_second(agent.address, _session_pair, seconds)
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
            generation = await _generation_s(stub, max(10, int(seconds * 10)))
    return pairs, generation


async def _generations_per_second(addresses: list[str], base_url: str, seconds: float) -> float:
    """Short generations/s of 100 concurrent sessions spread over the servers at `addresses`."""
    async with contextlib.AsyncExitStack() as stack:
        channels = [await stack.enter_async_context(grpc.aio.insecure_channel(a)) for a in addresses]
        stubs = [pb_grpc.CodeAgentServiceStub(c) for c in channels]
        for stub in stubs:
            await _initialize(stub, base_url)
        sessions = [(await stubs[i % len(stubs)].CreateSession(pb.CreateSessionRequest())).session_id
                    for i in range(100)]  # fmt: skip
        done = 0
        deadline = 0.0

        async def worker(index: int) -> None:
            nonlocal done
            stub, session_id = stubs[index % len(stubs)], sessions[index]
            message = pb.Message(role=pb.Message.ROLE_USER, content="go")
            while time.perf_counter() < deadline:
                await stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[message]))
                done += 1

        deadline = time.perf_counter() + 1.0  # warm up
        await asyncio.gather(*(worker(i) for i in range(100)))
        done = 0
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(worker(i) for i in range(100)))
        return done / (time.perf_counter() - started)


async def _spread_rates(seconds: float, workspace: Path, postgres: Postgres) -> tuple[float, float]:
    """Generations/s of 100 concurrent sessions on one replica, then on two."""
    rates = []
    for count in (1, 2):
        url = postgres.database()
        with contextlib.ExitStack() as stack:
            fake = stack.enter_context(FakeLLMProcess(0))
            replicas = [stack.enter_context(replica_process(workspace, url, f"r{i}")) for i in range(count)]
            for replica in replicas:
                replica.wait_healthy()
            rates.append(await _generations_per_second([r.address for r in replicas], fake.base_url, seconds))
    return rates[0], rates[1]


async def _events_per_second(bus: EventBus, durable: bool, count: int) -> float:
    """Events/s from publishing to a subscriber's reading them: through the store's log (its group
    commits), or handed straight to the fan-out as the in-memory bus before the log did."""
    subscription = await bus.subscribe(Filter("bench", EVENT))

    async def publish() -> None:
        for i in range(1, count + 1):
            if durable:
                bus.publish(EventType.INFO, "bench", f"event {i}")
            else:
                entry = event_entry(EventType.INFO, "bench", f"event {i}")
                entry.seq = entry.id = i
                bus.deliver([entry])
            if i % 100 == 0:
                await asyncio.sleep(0)  # let the subscriber read, as the agent's awaits do

    started = time.perf_counter()
    publishing = asyncio.ensure_future(publish())
    read = 0
    async for _ in subscription:
        read += 1
        if read == count:
            break
    await publishing
    return count / (time.perf_counter() - started)


async def _log_rates(workspace: Path, url: str, count: int) -> tuple[float, float, float]:
    """Events/s (in process): fan-out only, through the SQLite log, through the PostgreSQL log."""
    from a3s_agent.core.postgres_store import PostgresStore

    rates = []
    for store in (
        SqliteStore(workspace / "memory.db"),
        SqliteStore(workspace / "events.db"),
        PostgresStore(url, "bench"),
    ):
        await store.open()
        try:
            durable = bool(rates)
            if durable:
                await store.create_session(Session("bench", SessionConfig()), [])
            rates.append(await _events_per_second(EventBus(store), durable, count))
        finally:
            await store.close()
    return rates[0], rates[1], rates[2]


async def _first_chunk_ms(call: grpc.aio.UnaryStreamCall) -> tuple[float, pb.GenerateChunk]:
    started = time.perf_counter()
    async for chunk in call:
        elapsed = (time.perf_counter() - started) * 1000
        async for _ in call:  # read it to its end
            pass
        return elapsed, chunk
    raise RuntimeError("the stream ended without a chunk")


async def _resume_ms(seconds: float, workspace: Path, url: str) -> tuple[float, float]:
    """Median ms to the first chunk: of a new StreamGenerate on replica A (instant model), and of
    a StreamGenerate resumed on replica B from that generation's first chunk (a3s-after-seq)."""
    with (
        FakeLLMProcess(2) as fake,
        replica_process(workspace, url, "a") as first,
        replica_process(workspace, url, "b") as second,
    ):
        first.wait_healthy()
        second.wait_healthy()
        async with (
            grpc.aio.insecure_channel(first.address) as one,
            grpc.aio.insecure_channel(second.address) as other,
        ):
            a, b = pb_grpc.CodeAgentServiceStub(one), pb_grpc.CodeAgentServiceStub(other)
            for stub in (a, b):
                await _initialize(stub, fake.base_url)
            new, resumed = [], []
            for _ in range(max(20, int(seconds * 10))):
                session_id = (await a.CreateSession(pb.CreateSessionRequest())).session_id
                go = pb.GenerateRequest(
                    session_id=session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content="go")]
                )
                elapsed, chunk = await _first_chunk_ms(a.StreamGenerate(go))
                new.append(elapsed)
                after = (("a3s-after-seq", chunk.metadata["seq"]),)
                elapsed, _ = await _first_chunk_ms(
                    b.StreamGenerate(pb.GenerateRequest(session_id=session_id), metadata=after)
                )
                resumed.append(elapsed)
    return statistics.median(new[1:]), statistics.median(resumed[1:])


async def bench_replicas(seconds: float, workspace: Path) -> list[Row]:
    try:
        import pgserver  # noqa: F401
    except ImportError:
        return [Row("replicas", "skipped: pgserver (the test extra) is not installed")]
    (workspace / "small.txt").write_text("lorem ipsum\n" * 300)
    with Postgres(workspace.parent / "postgres") as postgres:
        sqlite_pairs, sqlite_generation = await _store_rates(seconds, workspace, "")
        pg_pairs, pg_generation = await _store_rates(seconds, workspace, postgres.database())
        one, two = await _spread_rates(seconds, workspace, postgres)
        memory, sqlite_log, pg_log = await _log_rates(workspace, postgres.database(), 20_000)
        new_ms, resume_ms = await _resume_ms(seconds, workspace, postgres.database())
    return [
        Row("CreateSession+GetSession pairs/s: SQLite", f"{sqlite_pairs:,.0f}"),
        Row("CreateSession+GetSession pairs/s: PostgreSQL", f"{pg_pairs:,.0f}"),
        Row("pairs/s ratio (PostgreSQL / SQLite)", f"{pg_pairs / sqlite_pairs:.2f}", "report"),
        Row("3-turn generation, instant model (ms): SQLite", f"{sqlite_generation * 1000:.1f}"),
        Row("3-turn generation, instant model (ms): PostgreSQL", f"{pg_generation * 1000:.1f}"),
        Row(
            "generation time ratio (PostgreSQL / SQLite)",
            f"{pg_generation / sqlite_generation:.2f}",
            "report",
        ),
        Row("100 concurrent sessions, generations/s: 1 replica", f"{one:,.0f}"),
        Row("100 concurrent sessions, generations/s: 2 replicas", f"{two:,.0f}"),
        Row("throughput ratio (2 replicas / 1)", f"{two / one:.2f}", ">= 1.6"),
        Row("events/s: in-memory fan-out only", f"{memory:,.0f}"),
        Row("events/s: through the SQLite log", f"{sqlite_log:,.0f}"),
        Row("events/s: through the PostgreSQL log", f"{pg_log:,.0f}"),
        Row("events/s ratio (SQLite log / fan-out only)", f"{sqlite_log / memory:.2f}", "report"),
        Row("events/s ratio (PostgreSQL log / fan-out only)", f"{pg_log / memory:.2f}", "report"),
        Row("first chunk of a new StreamGenerate (ms)", f"{new_ms:.1f}"),
        Row("first chunk of a StreamGenerate resumed on another replica (ms)", f"{resume_ms:.1f}"),
        Row("resume latency ratio (resumed / new)", f"{resume_ms / new_ms:.2f}", "<= 1"),
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
        health_rate = await calls_per_second(agent.address, _health, seconds)
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


TASK_SOURCE = "def greet(name):\n    return 'hello ' + name\n" * 20
"""The file the six-turn task works on; its last turn writes it back, so every task starts alike."""


def _task_turns() -> list[dict[str, object]]:
    """The scripted six-turn task: read_file, grep, edit_file, bash, write_file, then the answer."""
    calls = [
        ("read_file", {"path": "task.py"}),
        ("grep", {"pattern": "def greet", "path": "."}),
        (
            "edit_file",
            {"path": "task.py", "old_string": "'hello '", "new_string": "'hi '", "replace_all": True},
        ),
        ("bash", {"command": "head -c 64 task.py"}),
        ("write_file", {"path": "task.py", "content": TASK_SOURCE}),
    ]
    turns: list[dict[str, object]] = [{"tool_calls": [{"name": n, "arguments": a}]} for n, a in calls]
    return [*turns, {"content": "Renamed the greeting and restored the file."}]


async def _task(stub: pb_grpc.CodeAgentServiceStub) -> list[str]:
    """One six-turn task in a new session over StreamGenerate; returns the tool errors seen."""
    session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
    go = pb.GenerateRequest(
        session_id=session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content="go")]
    )
    return [
        chunk.tool_result.error or chunk.tool_result.output
        async for chunk in stub.StreamGenerate(go)
        if chunk.type == pb.GenerateChunk.CHUNK_TYPE_TOOL_RESULT and not chunk.tool_result.success
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
    """The median wall time of the scripted six-turn task (`_task_turns`, each in a new session) on a
    server under each of SANDBOXES: all running at once, each with its fake LLM, batches of five
    tasks alternating between them after a warm-up task each."""
    batches, batch = max(4, int(seconds * 2)), 5
    times: dict[str, list[float]] = {mode: [] for mode in SANDBOXES}
    async with contextlib.AsyncExitStack() as stack:
        stubs = []
        for mode in SANDBOXES:
            root = workspace / f"task-{mode}"
            root.mkdir()
            (root / "task.py").write_text(TASK_SOURCE)
            script = workspace / f"task_turns_{mode}.json"
            script.write_text(json.dumps(_task_turns() * (batches * batch + 1)))
            fake = stack.enter_context(FakeLLMProcess(0, turns_file=script))
            agent = stack.enter_context(agent_process(root, extra=("--sandbox", mode)))
            agent.wait_healthy()
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(agent.address))
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
            if errors := await _task(stub):
                raise RuntimeError(f"the six-turn task failed with --sandbox {mode}: {errors}")
            stubs.append((mode, stub))
        for round_ in range(batches):
            for mode, stub in stubs[round_ % len(stubs) :] + stubs[: round_ % len(stubs)]:
                for _ in range(batch):
                    started = time.perf_counter()
                    await _task(stub)
                    times[mode].append(time.perf_counter() - started)
    return {mode: statistics.median(t) * 1000 for mode, t in times.items()}


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
        import psutil
    except ImportError:
        return [Row("server CPU per six-turn task", "skipped: psutil is not installed")]
    batches, batch = max(6, int(seconds * 4)), 10
    per_task: dict[str, list[float]] = {"today": [], CPU_BASELINE: []}
    switches: dict[str, list[float]] = {"today": [], CPU_BASELINE: []}
    wake_us = await _wake_cpu_us()
    async with contextlib.AsyncExitStack() as stack:
        old = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        servers = []
        for name, source in (("today", None), (CPU_BASELINE, _checkout_of(CPU_BASELINE, old))):
            root = workspace / name
            root.mkdir()
            (root / "task.py").write_text(TASK_SOURCE)
            script = workspace / f"task_turns_{name}.json"
            script.write_text(json.dumps(_task_turns() * (batches * batch + 1)))
            fake = stack.enter_context(FakeLLMProcess(0, turns_file=script))
            agent = stack.enter_context(agent_process(root, source=source))
            servers.append((name, fake, agent))
        channels = []
        for name, fake, agent in servers:
            agent.wait_healthy()
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(agent.address))
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await _initialize(stub, fake.base_url)
            if errors := await _task(stub):  # warm-up: connections, first-use imports
                raise RuntimeError(f"the six-turn task failed on {name}: {errors}")
            channels.append((name, stub, psutil.Process(agent.proc.pid)))
        for round_ in range(batches):
            for name, stub, server in channels if round_ % 2 == 0 else channels[::-1]:
                before, switched = server.cpu_times(), _switches(server.pid)
                for _ in range(batch):
                    await _task(stub)
                after = server.cpu_times()
                switches[name].append((_switches(server.pid) - switched) / batch)
                spent = (after.user + after.system - before.user - before.system) * 1000
                per_task[name].append(spent / batch)
    today, base = statistics.median(per_task["today"]), statistics.median(per_task[CPU_BASELINE])
    return [
        Row(
            f"server CPU per six-turn task, median of {batches} batches of {batch} (ms)",
            f"{today:.1f}",
            "<= 15",
        ),
        Row("server CPU per six-turn task, lowest / highest batch (ms)", _spread(per_task["today"])),
        Row(f"server CPU per six-turn task on {CPU_BASELINE}, alternating (ms)", f"{base:.1f}"),
        Row(
            f"server CPU per six-turn task on {CPU_BASELINE}, lowest / highest (ms)",
            _spread(per_task[CPU_BASELINE]),
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


def _cpu_ns(pid: int) -> int:
    """The CPU the process's threads have run so far, in ns (schedstat: finer than the 10 ms ticks
    of cpu_times, which a per-turn figure needs)."""
    return _per_thread(pid, "schedstat", lambda text: int(text.split()[0]))


async def bench_turn_cpu(seconds: float, workspace: Path) -> list[Row]:
    """Where the six-turn task's CPU goes: the server's own CPU per task of one tool five times and
    then the answer, for each tool of the task, in batches of ten tasks (each in a new session)
    alternating between the kinds after a warm-up round; medians. A tool's turn is its task less
    the answer alone, over five."""
    if sys.platform != "linux":
        return [Row("server CPU per tool turn", "skipped: needs Linux's /proc/<pid>/schedstat")]
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
            await _initialize(stub, fake.base_url)
            for index, kind in enumerate(order):
                before = _cpu_ns(agent.proc.pid)
                for _ in range(batch):
                    if errors := await _task(stub):
                        raise RuntimeError(f"a {kind} task failed: {errors}")
                if index >= len(kinds):  # the first round warms up
                    per_task[kind].append((_cpu_ns(agent.proc.pid) - before) / batch / 1e6)
    answer = statistics.median(per_task["the answer alone"])
    rows = [Row("server CPU per task: the answer alone, in a new session (ms)", f"{answer:.1f}")]
    for kind in kinds[1:]:
        task = statistics.median(per_task[kind])
        rows.append(
            Row(f"server CPU per {kind} turn (its task {task:.1f} ms) (ms)", f"{(task - answer) / 5:.2f}")
        )
    return rows


def _spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {max(values):.1f}"


# --- first: the first calls after start (issue 19, the warm-up) ---------------------------

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
        rss = _rss_mb(agent.proc.pid)
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
        sources = {"before": _checkout_of(WARM_BASELINE, Path(old)), "today": None}
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
        Row(f"first: CreateSession {later} (ms), today", f"{warm_t[2]:.1f}", "<= 20"),
        Row(f"first: Generate {later} (ms), before", f"{warm_b[3]:.1f}"),
        Row(f"first: Generate {later} (ms), today", f"{warm_t[3]:.1f}"),
        Row("first: first Generate / a later one, before", f"{warm_b[3] / warm_b[4]:.2f}"),
        Row("first: first Generate / a later one, today", f"{warm_t[3] / warm_t[4]:.2f}", "<= 1.5"),
        Row(f"first: idle RSS {later} (MB), before", f"{warm_b[1]:.0f}"),
        Row(f"first: idle RSS {later} (MB), today (tokenizer loaded)", f"{warm_t[1]:.0f}", "report"),
    ]


SECTIONS: dict[str, Callable[[float, Path], Awaitable[list[Row]]]] = {
    "foundation": bench_foundation,
    "tools": bench_tools,
    "agent": bench_agent,
    "context": bench_context,
    "control": bench_control,
    "http": bench_http,
    "security": bench_security,
    "sizes": bench_sizes,
    "flood": bench_flood,
    "durability": bench_durability,
    "mcp": bench_mcp,
    "acp": bench_acp,
    "replicas": bench_replicas,
    "dialect": bench_dialect,
    "sandbox": bench_sandbox,
    "task_cpu": bench_task_cpu,
    "turn_cpu": bench_turn_cpu,
    "first": bench_first,
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
            print(f"[{name} done]", file=sys.stderr, flush=True)
    print(
        f"a3s-agent benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, python {sys.version.split()[0]}"
    )
    _print(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        help=f"sections to run: {', '.join(SECTIONS)} (with --peer: its phases)",
    )
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--attacker", type=int, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--peer", choices=["opencode"], help="compare with a peer (tools/peer_opencode.py)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each side with --peer")
    args = parser.parse_args()
    if args.bare_server:
        asyncio.run(_bare_server(args.bare_server))
    elif args.attacker:
        asyncio.run(_attacker(args.attacker))
    elif args.peer:
        from peer_opencode import bench_main

        bench_main(args.runs, args.only)
    else:
        asyncio.run(main(args.seconds, args.only))
