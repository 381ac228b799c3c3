"""What the benchmark families share: the processes they start (a3s-agent, its fake model, an older
commit's code), the calls they drive through them, and the six-turn task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_process import FakeServerProcess
from a3s_agent.testing.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
"""The repository: where `git archive` finds older commits and `python -m benchmarks.<module>` runs."""
CONCURRENCY = 32
"""Calls in flight at once from one client in the throughput runs."""


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


class FakeLLMProcess(FakeServerProcess):
    """The fake model (a3s_agent/testing/fake_llm.py, or `fake`, e.g. fake_anthropic) in a process
    of its own: each conversation makes `rounds` calls of `tool`, then answers."""

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


def checkout_of(commit: str, dest: Path) -> Path:
    """The package source of `commit`, unpacked into `dest` (no work tree of ours is touched)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "a3s_agent"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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


def health(stub: pb_grpc.CodeAgentServiceStub) -> Awaitable[object]:
    return stub.HealthCheck(pb.HealthCheckRequest())


async def session_pair(stub: pb_grpc.CodeAgentServiceStub) -> None:
    created = await stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(name="bench")))
    await stub.GetSession(pb.GetSessionRequest(session_id=created.session_id))


def read_file_call(path: str) -> Callable[[pb_grpc.CodeAgentServiceStub], Awaitable[object]]:
    request = pb.ExecuteToolRequest(tool_name="read_file", arguments=json.dumps({"path": path}))

    async def call(stub: pb_grpc.CodeAgentServiceStub) -> None:
        reply = await stub.ExecuteTool(request)
        assert reply.result.success, reply.result.error

    return call


async def initialize(stub: pb_grpc.CodeAgentServiceStub, base_url: str) -> None:
    llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=base_url, api_key="sk-bench")
    await stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))


async def stream_generation(stub: pb_grpc.CodeAgentServiceStub) -> int:
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


async def http_ready(client: aiohttp.ClientSession) -> None:
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


async def requests_per_second(client: aiohttp.ClientSession, path: str, seconds: float) -> float:
    """Completed GETs of `path`/s with CONCURRENCY in flight."""
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


# --- the six-turn task ------------------------------------------------------------------------------

TASK_SOURCE = "def greet(name):\n    return 'hello ' + name\n" * 20
"""The file the six-turn task works on; its last turn writes it back, so every task starts alike."""


def task_turns() -> list[dict[str, object]]:
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


async def run_task(stub: pb_grpc.CodeAgentServiceStub, prompt: str = "go") -> list[str]:
    """One task (by default the six-turn one) in a new session over StreamGenerate; returns the
    tool errors seen, its subagents' among them."""
    session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
    go = pb.GenerateRequest(
        session_id=session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content=prompt)]
    )
    errors = []
    async for chunk in stub.StreamGenerate(go):
        if chunk.type == pb.GenerateChunk.CHUNK_TYPE_TOOL_RESULT and not chunk.tool_result.success:
            errors.append(chunk.tool_result.error or chunk.tool_result.output)
        elif (
            chunk.type == pb.GenerateChunk.CHUNK_TYPE_METADATA
            and chunk.metadata.get("tool_success") == "false"
        ):
            errors.append(f"a subagent's {chunk.metadata.get('tool_name')} failed")
    return errors


async def warmed_up(
    stack: contextlib.AsyncExitStack, fake: FakeLLMProcess, agent: Process, name: str
) -> pb_grpc.CodeAgentServiceStub:
    """A client of `agent` once it is healthy, initialized with `fake` and warmed up by one task
    (connections, first-use imports); `name` says which server failed."""
    agent.wait_healthy()
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(agent.address))
    stub = pb_grpc.CodeAgentServiceStub(channel)
    await initialize(stub, fake.base_url)
    if errors := await run_task(stub):
        raise RuntimeError(f"the six-turn task failed on {name}: {errors}")
    return stub


def task_server(
    stack: contextlib.ExitStack | contextlib.AsyncExitStack,
    workspace: Path,
    name: str,
    repeats: int,
    source: Path | None = None,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    http_port: int | None = None,
) -> tuple[FakeLLMProcess, Process]:
    """A server (not yet healthy) for the six-turn task in `workspace`/`name`, with task.py written
    (`env` added to its environment; its HTTP face on `http_port`, or a free port), and its fake
    model scripted with the task `repeats` times; both stopped when `stack` closes."""
    root = workspace / name
    root.mkdir()
    (root / "task.py").write_text(TASK_SOURCE)
    script = workspace / f"task_turns_{name}.json"
    script.write_text(json.dumps(task_turns() * repeats))
    fake = stack.enter_context(FakeLLMProcess(0, turns_file=script))
    return fake, stack.enter_context(agent_process(root, http_port, source=source, extra=extra, env=env))
