"""The `a2a` section: what the A2A face costs. The six-turn task end to end over A2A (the a2a SDK's
client, SendStreamingMessage in a new context each time) against the same task over HTTP REST
(`POST /sessions`, then `POST /sessions/{id}/generate/stream` read to its end), on one server,
batches alternating; medians. The workspace is not a git work tree, so no change set is taken:
the rows compare the faces."""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from pathlib import Path

import aiohttp
import grpc
import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.helpers.proto_helpers import new_text_message
from a2a.types.a2a_pb2 import Role, SendMessageRequest, TaskState

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.ports import free_port

from .common import http_ready, initialize, task_server
from .report import Row

BATCH = 5
"""Tasks per batch."""


async def bench_a2a(seconds: float, workspace: Path) -> list[Row]:
    batches = max(4, int(seconds * 2))
    per_task: dict[str, list[float]] = {"a2a": [], "rest": []}
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"
    async with contextlib.AsyncExitStack() as stack:
        fake, agent = task_server(
            stack, workspace, "a2a", 2 * batches * BATCH + 2, extra=("--a2a",), http_port=http_port
        )
        agent.wait_healthy()
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(agent.address))
        await initialize(pb_grpc.CodeAgentServiceStub(channel), fake.base_url)
        rest = await stack.enter_async_context(aiohttp.ClientSession(base_url=base))
        await http_ready(rest)
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
        a2a = await ClientFactory(ClientConfig(httpx_client=http)).create_from_url(base)
        stack.push_async_callback(a2a.close)
        runs = {"a2a": lambda: _over_a2a(a2a), "rest": lambda: _over_rest(rest)}
        for run in runs.values():
            await run()  # warm-up
        for round_ in range(batches):
            for name in ("a2a", "rest") if round_ % 2 == 0 else ("rest", "a2a"):
                started = time.perf_counter()
                for _ in range(BATCH):
                    await runs[name]()
                per_task[name].append((time.perf_counter() - started) * 1000 / BATCH)
    over_a2a, over_rest = statistics.median(per_task["a2a"]), statistics.median(per_task["rest"])
    return [
        Row("six-turn task over A2A, streamed (ms, median of batches)", f"{over_a2a:.1f}", "report"),
        Row("six-turn task over HTTP REST, streamed (ms)", f"{over_rest:.1f}", "report"),
        Row("six-turn task, A2A / HTTP REST", f"{over_a2a / over_rest:.2f}x", "<= 1.1x"),
    ]


async def _over_a2a(client: Client) -> None:
    message = new_text_message("go", context_id=f"bench-{uuid.uuid4().hex}", role=Role.ROLE_USER)
    states = [
        response.status_update.status.state
        async for response in client.send_message(SendMessageRequest(message=message))
        if response.HasField("status_update")
    ]
    if states[-1:] != [TaskState.TASK_STATE_COMPLETED]:
        raise RuntimeError(f"the six-turn task over A2A ended {states[-1:]}")


async def _over_rest(client: aiohttp.ClientSession) -> None:
    async with client.post("/sessions", json={}) as reply:
        created = await reply.json()
    session_id = created.get("session_id") or created.get("session", {}).get("session_id")
    if not session_id:
        raise RuntimeError(f"POST /sessions answered {created}")
    body = {"messages": [{"role": "ROLE_USER", "content": "go"}]}
    async with client.post(f"/sessions/{session_id}/generate/stream", json=body) as reply:
        text = await reply.text()
    if "event: done" not in text:
        raise RuntimeError(f"the six-turn task over REST did not end: {text[-300:]}")
