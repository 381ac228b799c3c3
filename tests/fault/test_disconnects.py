"""Disconnects: clients that vanish mid-stream. A generation goes on when its client goes away (the
client may resume its stream from the last seq it saw, tests/test_resume.py); Cancel from another
call stops it: the tool's process is killed, the session is free again, and nothing leaks: the
in-process server's asyncio tasks return to their baseline, a subprocess server's child processes
to none.

Cases: StreamGenerate calls cancelled while the model's `bash sleep 30` runs (one client and many
at once); a SubscribeEvents client whose channel is closed; an HTTP server-sent-events stream
(`/sessions/{id}/generate/stream`) dropped by an aiohttp client, and a gRPC stream cancelled, against
a subprocess server.
"""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from ..conftest import WITHIN_S, LiveServer, alive, eventually, host_pid, new_session, subscribed, user
from .conftest import FakeLLMProcess, LoggedServer, child_pids

pytestmark = pytest.mark.fault

CHUNK = pb.GenerateChunk


def sleeper(marker: Path) -> str:
    """A bash command that records its pid (one line per process) and then sleeps."""
    return f"echo $$ >> {marker}; sleep 30"


_ON_THIS_MACHINE: dict[tuple[Path, int], int] = {}


def pids(marker: Path) -> list[int]:
    """The pids the commands recorded, as this machine knows them (a sandboxed command's `$$` is
    its pid in the sandbox's PID namespace: translated once, on first sight, while it runs)."""
    recorded = [int(line) for line in marker.read_text().split()] if marker.exists() else []
    return [_ON_THIS_MACHINE.setdefault((marker, pid), host_pid(pid)) for pid in recorded]


async def until_tool_call(call: grpc.aio.UnaryStreamCall) -> None:
    async for chunk in call:
        if chunk.type == CHUNK.CHUNK_TYPE_TOOL_CALL:
            return
    raise AssertionError("the stream ended before the tool call")


def server_tasks() -> int:
    """The asyncio tasks of this process but those of the fake LLM's HTTP server: it keeps a task
    per keep-alive connection, and the provider opens new connections when cancelled streams
    closed the old ones."""
    return sum(
        1
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "") != "RequestHandler.start"
    )


async def settled_tasks() -> int:
    """The number of server tasks once it stops changing (finalizers of the last run are done)."""
    count = server_tasks()
    for _ in range(20):
        await asyncio.sleep(0.1)
        count, previous = server_tasks(), count
        if count == previous:
            break
    return count


async def no_task_leak(one_round: Callable[[], Awaitable[None]], caplog: pytest.LogCaptureFixture) -> None:
    """One round first (it creates the long-lived tasks: connections, pools), then the baseline;
    after two more rounds the task count must come back to it. A task left pending on something
    only it references vanishes from the count when the garbage collector runs (asyncio keeps
    tasks weakly), so the collector runs and asyncio must not complain of a pending task destroyed."""
    gc.collect()  # garbage of earlier tests is destroyed now, not during this one
    caplog.clear()
    await one_round()
    baseline = await settled_tasks()
    for _ in range(2):
        await one_round()
    gc.collect()
    destroyed = [r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    assert not destroyed, f"{len(destroyed)} pending tasks were left behind: {destroyed[0][:500]}"
    try:
        await eventually(lambda: server_tasks() <= baseline, f"tasks back to {baseline}")
    except AssertionError as exc:
        left = "\n".join(repr(t)[:300] for t in asyncio.all_tasks())
        raise AssertionError(f"{exc}; tasks now:\n{left}") from None


# --- in-process server: asyncio tasks ---------------------------------------------------------


async def cancel_streams(agent: LiveServer, fake: FakeLLM, clients: int) -> None:
    """`clients` StreamGenerate calls, each dropped while its bash runs: the runs go on; Cancel
    stops them, and every bash must die."""
    marker = agent.workspace / f"pids-{uuid.uuid4().hex}"
    fake.script(*[tool_call("bash", {"command": sleeper(marker)}) for _ in range(clients)])
    sessions = [await new_session(agent) for _ in range(clients)]
    calls = [
        agent.stub.StreamGenerate(pb.GenerateRequest(session_id=s, messages=[user("go")])) for s in sessions
    ]
    await asyncio.gather(*(until_tool_call(c) for c in calls))
    await eventually(lambda: len(pids(marker)) == clients, "every bash recorded its pid")
    for call in calls:
        call.cancel()
    await eventually(lambda: agent.runtime.events.subscriber_count == 0, "every stream is gone")
    assert all(alive(p) for p in pids(marker)) and agent.runtime.runs.running == clients
    for session_id in sessions:
        assert (await agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    await eventually(lambda: not any(alive(p) for p in pids(marker)), "every bash is gone")
    fake.script(*[text("again") for _ in sessions])
    for session_id in sessions:  # each session is free for the next run
        reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("x")]))
        assert reply.message.content == "again"


@pytest.mark.parametrize("clients", [1, 10])
async def test_dropped_streams_runs_go_on_until_cancel_kills_their_tools_and_frees_their_sessions(
    agent: LiveServer, fake: FakeLLM, clients: int
) -> None:
    await cancel_streams(agent, fake, clients)


async def test_dropped_and_cancelled_streams_leak_no_task(
    agent: LiveServer, fake: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    await no_task_leak(lambda: cancel_streams(agent, fake, 10), caplog)


async def subscribe_and_hang_up(agent: LiveServer) -> None:
    """A subscriber on its own channel gets an event, then its channel closes under the stream.
    The previous round's subscription must be gone first (its channel closed): else `subscribed`
    would count it and the event could be published before this one is in place."""
    await eventually(
        lambda: agent.runtime.events.subscriber_count == 0, "closed channels' subscriptions gone"
    )
    channel = grpc.aio.insecure_channel(agent.address)
    events = pb_grpc.CodeAgentServiceStub(channel).SubscribeEvents(pb.SubscribeEventsRequest())
    await subscribed(agent)
    created = await new_session(agent)
    first = await asyncio.wait_for(events.read(), WITHIN_S)
    assert first.type == pb.AgentEvent.EVENT_TYPE_SESSION_CREATED and first.session_id == created
    await channel.close()


async def test_a_subscriber_whose_channel_closes_leaks_no_task(
    agent: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    await no_task_leak(lambda: subscribe_and_hang_up(agent), caplog)
    await new_session(agent)  # publishing with no subscriber left still works


# --- subprocess server: child processes -----------------------------------------------------


Running = Callable[[], Awaitable[object]]
"""Waits until the model's bash command is running."""


async def http_ready(client: aiohttp.ClientSession) -> None:
    """The HTTP face starts just after gRPC reports healthy: wait for its /healthz."""

    async def healthy() -> bool:
        try:
            async with client.get("/healthz") as response:
                return response.status == 200
        except aiohttp.ClientConnectionError:
            return False

    await eventually(healthy, "the HTTP face answers /healthz")


async def drop_sse(server: LoggedServer, session_id: str, running: Running) -> None:
    """Open the SSE stream, read until the tool call, and go away without a word once bash runs."""
    base = f"http://127.0.0.1:{server.http_port}"
    async with aiohttp.ClientSession(base) as client:
        await http_ready(client)
        response = await client.get(f"/sessions/{session_id}/generate/stream", params={"content": "go"})
        assert response.status == 200, await response.text()
        async for line in response.content:
            if b"CHUNK_TYPE_TOOL_CALL" in line:
                break
        await running()
        response.close()


async def cancel_grpc(server: LoggedServer, session_id: str, running: Running) -> None:
    """Start StreamGenerate, read until the tool call, and cancel the call once bash runs."""
    async with grpc.aio.insecure_channel(server.address) as channel:
        request = pb.GenerateRequest(session_id=session_id, messages=[user("go")])
        call = pb_grpc.CodeAgentServiceStub(channel).StreamGenerate(request)
        await until_tool_call(call)
        await running()
        call.cancel()


def bash_turns(marker: Path) -> str:
    """The fake LLM's script (for --turns-file): one bash call that records its pid and sleeps."""
    return json.dumps([{"tool_calls": [{"name": "bash", "arguments": {"command": sleeper(marker)}}]}])


@pytest.mark.parametrize("vanish", [drop_sse, cancel_grpc], ids=["http-sse", "grpc"])
async def test_a_client_vanishing_from_a_server_process_leaves_its_run_going_until_cancel(
    tmp_path: Path, vanish: Callable[[LoggedServer, str, Running], Awaitable[None]]
) -> None:
    workspace, turns = tmp_path / "workspace", tmp_path / "turns.json"
    marker = workspace / "pids"  # where a sandboxed command may write
    workspace.mkdir()
    turns.write_text(bash_turns(marker))
    with FakeLLMProcess("--turns-file", str(turns), "--text", "after") as fake:
        server = LoggedServer(workspace, tmp_path / "data", tmp_path / "server.log").start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url, api_key="k")
                await stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
                assert child_pids(server.pid) == set()
                await vanish(server, session_id, lambda: eventually(lambda: bool(pids(marker)), "bash runs"))
                await asyncio.sleep(0.3)  # what a disconnect would have stopped by now
                assert alive(pids(marker)[0]) and child_pids(server.pid)  # the run goes on
                assert (await stub.Cancel(pb.CancelRequest(session_id=session_id))).success
                await eventually(lambda: not alive(pids(marker)[0]), "bash is gone")
                await eventually(lambda: not child_pids(server.pid), "the server has no child left")
                request = pb.GenerateRequest(session_id=session_id, messages=[user("again")])
                reply = await stub.Generate(request, timeout=WITHIN_S)
                assert reply.message.content == "after"  # the session is free, the loop carries on
        finally:
            server.kill()


async def test_a_dropped_grpc_stream_is_logged_as_a_disconnect_not_a_cancel(
    agent: LiveServer, fake: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    # The run goes on after its client left; the call's log line must not say it was cancelled.
    caplog.set_level("INFO", logger="a3s_agent.rpc")
    marker = agent.workspace / "pids"
    fake.script(tool_call("bash", {"command": sleeper(marker)}))
    session_id = await new_session(agent)
    call = agent.stub.StreamGenerate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
    await until_tool_call(call)
    call.cancel()

    def stream_lines() -> list[str]:
        lines = (r.getMessage() for r in caplog.records if r.name == "a3s_agent.rpc")
        return [line for line in lines if line.startswith("rpc StreamGenerate ")]

    (line,) = await eventually(stream_lines, "the stream's log line")
    assert f"session={session_id} status=DISCONNECTED " in line
    assert agent.runtime.runs.running == 1  # the run itself goes on
    running = await eventually(lambda: pids(marker), "bash runs")
    assert (await agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    await eventually(lambda: not any(alive(p) for p in running), "the bash is gone")
