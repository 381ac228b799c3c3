"""The agent loop against its baselines: `agent` (a model turn through StreamGenerate against the
same call made straight to the fake with the `openai` client, concurrency, and our providers' CPU
per streamed turn against the `openai` and `anthropic` packages'), `context` (token counting,
context usage, compaction) and `control` (events to subscribers, cancelling)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from a3s_agent.base.models import LLMConfig
from a3s_agent.llm.provider import CompletionRequest, Provider
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .common import FakeLLMProcess, agent_process, initialize, stream_generation
from .report import Row


async def _direct_turns(base_url: str, turns: int) -> float:
    """Seconds for `turns` streamed completions made straight to the fake with the openai client."""
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": "go"}]  # the clients' typed dicts
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

    from a3s_agent.llm.openai_compat import OpenAICompatibleProvider

    provider = OpenAICompatibleProvider(LLMConfig(model="fake-model", base_url=base_url, api_key="sk-bench"))
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)

    async def package() -> None:
        stream = await client.chat.completions.create(
            model="fake-model", messages=_GO, stream=True, stream_options={"include_usage": True}
        )
        async for _ in stream:
            pass

    return await _ours_and_package_cpu_ms(provider, "fake-model", package, client.close, turns)


async def _anthropic_client_cpu_ms(base_url: str, turns: int) -> tuple[float, float]:
    """The same for Anthropic's Messages API: our provider's CPU per streamed turn, then the
    `anthropic` package's (its raw event stream, as the openai package's above)."""
    import anthropic

    from a3s_agent.llm.anthropic_provider import AnthropicProvider

    llm = LLMConfig(provider="anthropic", model="claude-bench", base_url=base_url, api_key="sk-bench")
    provider = AnthropicProvider(llm)
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-bench", max_retries=0)

    async def package() -> None:
        stream = await client.messages.create(
            model="claude-bench", max_tokens=8192, messages=_GO, stream=True
        )
        async for _ in stream:
            pass

    return await _ours_and_package_cpu_ms(provider, "claude-bench", package, client.close, turns)


_GO: list[Any] = [{"role": "user", "content": "go"}]
"""The conversation of the client CPU rows (Any: each client takes its own typed dicts)."""


async def _ours_and_package_cpu_ms(
    provider: Provider,
    model: str,
    package: Callable[[], Awaitable[None]],
    close_package: Callable[[], Awaitable[None]],
    turns: int,
) -> tuple[float, float]:
    """CPU (ms) per streamed turn of our `provider`, then of a package's client (`package` streams
    one turn); both closed after."""

    async def ours() -> None:
        async for _ in provider.stream(CompletionRequest(model=model, messages=_GO)):
            pass

    try:
        return await _cpu_ms(ours, turns), await _cpu_ms(package, turns)
    finally:
        await provider.close()
        await close_package()


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
            await initialize(stub, fake.base_url)
            await stream_generation(stub)  # warm up
            runs, agent_time, turns = 5, 0.0, 0
            for _ in range(runs):
                started = time.perf_counter()
                turns += await stream_generation(stub)
                agent_time += time.perf_counter() - started
        direct_time = sum([await _direct_turns(fake.base_url, rounds + 1) for _ in range(runs)])
    per_turn_agent = agent_time / turns * 1000
    per_turn_direct = direct_time / (runs * (rounds + 1)) * 1000
    with FakeLLMProcess(2, delay_ms=200) as slow, agent_process(workspace) as agent:
        agent.wait_healthy()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            await initialize(stub, slow.base_url)
            await stream_generation(stub)  # warm up: connections to the fake, first-use costs
            started = time.perf_counter()
            await stream_generation(stub)
            one = time.perf_counter() - started
            started = time.perf_counter()
            await asyncio.gather(*(stream_generation(stub) for _ in range(100)))
            hundred = time.perf_counter() - started
    return [
        Row("model turn through StreamGenerate (ms)", f"{per_turn_agent:.2f}"),
        Row("direct openai streamed call to the fake (ms)", f"{per_turn_direct:.2f}"),
        Row("agent overhead per model turn (ms)", f"{per_turn_agent - per_turn_direct:.2f}", "report"),
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
            await initialize(stub, fake.base_url)
            usage_ms = await _usage_time(stub, 5000)
            compaction_s = await _compaction_time(stub, 500)
    return [
        Row("token counting, 1 MB of mixed code (MB/s)", f"{throughput:.1f}", "report"),
        Row("GetContextUsage, 5,000-message session (ms)", f"{usage_ms:.1f}", "report"),
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
            await initialize(stub, fake.base_url)
            await stream_generation(stub)
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
            await initialize(stub, fake.base_url)
            cancel_ms = await _cancel_latency(stub)
    return [
        Row("events/s delivered to 10 subscribers", f"{fanout:,.0f}", "report"),
        Row("time per tool call, no subscriber (ms)", f"{alone:.2f}"),
        Row("added per tool call by one subscriber (ms)", f"{watched - alone:.2f}", "report"),
        Row("Cancel to Generate returning CANCELLED during bash (ms)", f"{cancel_ms:.0f}", "report"),
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
        await stream_generation(stub)
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
