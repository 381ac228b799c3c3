"""Replicas: three real `a3s-agent serve` processes on one PostgreSQL database (their own data
directories, one shared workspace), and a fake model they reach over HTTP.

Any replica serves any session: a session created on one generates on another; control sent to a
replica that does not run the generation reaches the one that does; events of a run on one are seen
by a subscriber on another, each once and in order. A replica killed (SIGKILL) mid-run loses its
lease; another takes the run over and ends it cleanly. A replica stopped (SIGSTOP) past its lease
and woken up again is fenced: its late writes are refused and it stops its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psycopg
import pytest

from a3s_agent.core.loop.repair import INTERRUPTED
from a3s_agent.core.store.events import EVENT, EventType
from a3s_agent.core.store.postgres_store import PostgresStore
from a3s_agent.core.store.protocol import LogEntry
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, Reply, _message_problem, text, tool_call

from .conftest import eventually, user
from .fault.conftest import LoggedServer
from .fault.test_crash_repair import processes_with
from .postgres import fresh_database

LEASE_TTL_S = 1.0
RPC_TIMEOUT_S = 15.0
NAMES = ("A", "B", "C")
CHUNK = pb.GenerateChunk
AFTER_SEQ = "a3s-after-seq"
BASH = re.compile(r"bash (\d+): (.*)", re.DOTALL)
DELEGATE = "delegate: "


def model(body: dict[str, Any]) -> Reply:
    """The model every replica calls: `bash N: <command>` runs the command N times through the bash
    tool, then answers `ran: <the last output>`; `delegate: <prompt>` starts a general subagent on
    the prompt, then answers `delegated: <its answer>`; anything else is answered `echo: <message>`."""
    messages = body["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    prompt = messages[last]["content"]
    outputs = [m["content"] for m in messages[last + 1 :] if m["role"] == "tool"]
    if prompt.startswith(DELEGATE):
        if outputs:
            return text(f"delegated: {outputs[-1]}")
        task = {"agent": "general", "description": "delegated", "prompt": prompt.removeprefix(DELEGATE)}
        return tool_call("task", task)
    wanted = BASH.fullmatch(prompt)
    if wanted is None:
        return text(f"echo: {prompt}")
    if len(outputs) < int(wanted[1]):
        return tool_call("bash", {"command": wanted[2]})
    return text(f"ran: {outputs[-1]}")


@dataclass
class Cluster:
    replicas: dict[str, LoggedServer]
    url: str
    fake: FakeLLM

    def ensure_up(self) -> None:
        """Start the replicas not running (again, for those a test killed: on their data directory,
        which kills what their tools left running), at once."""
        dead = [r for r in self.replicas.values() if r.proc is None or r.proc.poll() is not None]
        with ThreadPoolExecutor(len(NAMES)) as pool:
            list(pool.map(LoggedServer.start, dead))


@pytest.fixture(scope="module")
def replica_database(postgres_server: Any) -> Iterator[str]:
    with fresh_database(postgres_server, "replicas") as url:
        yield url


def replica_servers(
    workspace: Path, root: Path, url: str, names: tuple[str, ...], env: dict[str, str]
) -> dict[str, LoggedServer]:
    """Replicas (not started) of the database at `url`, by name: their data and logs under `root`."""
    return {
        name: LoggedServer(
            workspace,
            root / f"data-{name}",
            root / f"{name}.log",
            ("--store", url, "--replica-id", name),
            env,
        )
        for name in names
    }


@pytest.fixture(scope="module")
def replica_cluster(tmp_path_factory: pytest.TempPathFactory, replica_database: str) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("replicas")
    workspace = root / "workspace"
    workspace.mkdir()
    with FakeLLM(fallback=model, strict=True) as fake:
        env = {
            "A3S_LEASE_TTL_S": str(LEASE_TTL_S),
            "A3S_LLM_PROVIDER": "openai",
            "A3S_LLM_MODEL": "fake-model",
            "A3S_LLM_BASE_URL": fake.base_url,
        }
        replicas = replica_servers(workspace, root, replica_database, NAMES, env)
        cluster = Cluster(replicas, replica_database, fake)
        try:
            cluster.ensure_up()
            yield cluster
        finally:
            for replica in replicas.values():
                replica.kill()


@pytest.fixture
async def cluster(replica_cluster: Cluster) -> AsyncIterator[Cluster]:
    replica_cluster.ensure_up()
    yield replica_cluster
    for replica in replica_cluster.replicas.values():
        assert "Traceback" not in replica.log(), replica.log()[-4000:]


@contextlib.asynccontextmanager
async def stubs(cluster: Cluster) -> AsyncIterator[dict[str, pb_grpc.CodeAgentServiceStub]]:
    """A client of each replica, by name."""
    async with contextlib.AsyncExitStack() as stack:
        channels = {
            name: await stack.enter_async_context(grpc.aio.insecure_channel(replica.address))
            for name, replica in cluster.replicas.items()
        }
        yield {name: pb_grpc.CodeAgentServiceStub(channel) for name, channel in channels.items()}


@contextlib.asynccontextmanager
async def store(cluster: Cluster) -> AsyncIterator[PostgresStore]:
    """The database the replicas share, read as they read it."""
    opened = PostgresStore(cluster.url, "test-reader")
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


async def read_log(cluster: Cluster, session_id: str) -> list[LogEntry]:
    async with store(cluster) as db:
        return await db.read_log(session_id, 0, 10_000)


async def history(cluster: Cluster, session_id: str) -> list[tuple[str, str]]:
    async with store(cluster) as db:
        return [(m.role, m.content) for m in await db.load_messages(session_id)]


async def dangling_calls(cluster: Cluster, session_id: str) -> list[str]:
    """The ids of the tool calls in the stored history that have no result."""
    async with store(cluster) as db:
        messages = await db.load_messages(session_id)
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    return [c.id for m in messages for c in m.tool_calls if c.id not in answered]


def events_of(entries: list[LogEntry], type: EventType) -> list[LogEntry]:
    return [e for e in entries if e.kind == EVENT and e.body["type"] == type]


def tag() -> str:
    """Digits that mark one test's commands among every process on the machine."""
    return f"{random.randrange(10**6):06d}"


def generate(stub: pb_grpc.CodeAgentServiceStub, session_id: str, prompt: str) -> Any:
    return stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user(prompt)]), timeout=RPC_TIMEOUT_S
    )


async def tool_call_seq(stream: grpc.aio.UnaryStreamCall) -> int:
    """Read a stream up to the model's tool call; the seq of that chunk."""
    async for chunk in stream:
        if chunk.type == CHUNK.CHUNK_TYPE_TOOL_CALL:
            return int(chunk.metadata["seq"])
    raise AssertionError("the stream ended without a tool call")


async def session_on(stub: pb_grpc.CodeAgentServiceStub) -> str:
    reply = await stub.CreateSession(pb.CreateSessionRequest(), timeout=RPC_TIMEOUT_S)
    return reply.session_id


def kill_leftovers(marker: str) -> None:
    for pid in processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- any replica serves any session --------------------------------------------------------------


async def test_a_session_created_on_one_replica_generates_on_another(cluster: Cluster) -> None:
    async with stubs(cluster) as stub:
        created = await stub["A"].CreateSession(
            pb.CreateSessionRequest(
                initial_context=[user("first"), pb.Message(role=pb.Message.ROLE_ASSISTANT, content="ack")]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        session_id = created.session_id
        on_b = await generate(stub["B"], session_id, "hello from B")
        seen_on_a = await stub["A"].GetSession(pb.GetSessionRequest(session_id=session_id))
        on_a = await generate(stub["A"], session_id, "again on A")
    assert on_b.message.content == "echo: hello from B"
    assert seen_on_a.session.context_usage.message_count == 4  # B's generation, right after it
    assert on_a.message.content == "echo: again on A"
    sent_by_a = [(m["role"], m["content"]) for m in cluster.fake.requests[-1].messages[1:]]
    assert sent_by_a == [
        ("user", "first"),
        ("assistant", "ack"),
        ("user", "hello from B"),
        ("assistant", "echo: hello from B"),
        ("user", "again on A"),
    ]
    assert await history(cluster, session_id) == [*sent_by_a, ("assistant", "echo: again on A")]


# --- control reaches the replica running the generation --------------------------------------------


async def test_cancel_sent_to_another_replica_stops_the_run_and_its_command(cluster: Cluster) -> None:
    marker = f"30.{tag()}"
    async with stubs(cluster) as stub:
        session_id = await session_on(stub["B"])
        stream = stub["A"].StreamGenerate(
            pb.GenerateRequest(session_id=session_id, messages=[user(f"bash 1: sleep {marker}")]),
            timeout=RPC_TIMEOUT_S,
        )
        await tool_call_seq(stream)
        await eventually(lambda: processes_with(marker), "the command runs on A")
        cancelled = await stub["C"].Cancel(pb.CancelRequest(session_id=session_id), timeout=RPC_TIMEOUT_S)
        assert cancelled.success
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in stream:
                pass
        assert ended.value.code() == grpc.StatusCode.CANCELLED, ended.value
        await eventually(lambda: not processes_with(marker), "the command is killed")
        # Nothing runs now, on any replica.
        assert not (await stub["B"].Cancel(pb.CancelRequest(session_id=session_id))).success
        after = await generate(stub["C"], session_id, "still there?")
    assert after.message.content == "echo: still there?"  # the strict model took the history
    assert not await dangling_calls(cluster, session_id)
    warnings = events_of(await read_log(cluster, session_id), EventType.WARNING)
    assert [w.body["message"] for w in warnings] == ["generation cancelled by the client"]


async def test_pause_and_resume_sent_to_other_replicas_hold_and_release_the_run(cluster: Cluster) -> None:
    marker = f"0.{tag()}"
    async with stubs(cluster) as stub:
        session_id = await session_on(stub["A"])
        running = generate(stub["A"], session_id, f"bash 2: sleep {marker}")
        await eventually(lambda: processes_with(marker), "the first command runs on A")
        await stub["B"].Pause(pb.PauseRequest(session_id=session_id), timeout=RPC_TIMEOUT_S)
        state = (await stub["C"].GetSession(pb.GetSessionRequest(session_id=session_id))).session.state
        assert state == pb.SESSION_STATE_PAUSED
        await asyncio.sleep(1.5)  # the command ends; the paused run waits before its next step
        assert not running.done()
        assert len(events_of(await read_log(cluster, session_id), EventType.TOOL_CALLED)) == 1
        await stub["C"].Resume(pb.ResumeRequest(session_id=session_id), timeout=RPC_TIMEOUT_S)
        reply = await running
    assert reply.message.content.startswith("ran:")
    assert len(events_of(await read_log(cluster, session_id), EventType.TOOL_CALLED)) == 2


async def test_an_initialize_on_one_replica_applies_on_the_others(cluster: Cluster) -> None:
    async with stubs(cluster) as stub:
        disabled = pb.ToolsConfig(disabled_tools=["web_search"])
        await stub["A"].Initialize(pb.InitializeRequest(config=pb.AgentConfig(tools=disabled)))
        try:
            for name in ("B", "C"):
                listing = stub[name].ListTools

                async def without_web_search(listing: Any = listing) -> bool:
                    names = {t.name for t in (await listing(pb.ListToolsRequest())).tools}
                    return "web_search" not in names and "read_file" in names

                await eventually(without_web_search, f"replica {name} applies A's Initialize")
        finally:
            await stub["A"].Initialize(pb.InitializeRequest())
        for name in ("B", "C"):
            listing = stub[name].ListTools

            async def back(listing: Any = listing) -> bool:
                return "web_search" in {t.name for t in (await listing(pb.ListToolsRequest())).tools}

            await eventually(back, f"replica {name} applies the next Initialize")


async def test_confirmation_sent_to_another_replica_takes_effect(cluster: Cluster) -> None:
    marker = f"confirmed-{tag()}"
    async with stubs(cluster) as stub:
        session_id = await session_on(stub["A"])
        policy = pb.ConfirmationPolicy(
            enabled=True, require_confirm_tools=["bash"], default_timeout_ms=10_000
        )
        await stub["C"].SetConfirmationPolicy(
            pb.SetConfirmationPolicyRequest(session_id=session_id, policy=policy), timeout=RPC_TIMEOUT_S
        )
        stream = stub["A"].StreamGenerate(
            pb.GenerateRequest(session_id=session_id, messages=[user(f"bash 1: echo {marker}")]),
            timeout=RPC_TIMEOUT_S,
        )
        async for chunk in stream:
            if (
                chunk.type == CHUNK.CHUNK_TYPE_METADATA
                and chunk.metadata.get("type") == "confirmation_required"
            ):
                break
        else:
            raise AssertionError("no confirmation was asked for")
        # An id A's run does not wait for: A's answer crosses back as success=false, as A3S
        # answers it (issue 18), not as an error status.
        unknown = await stub["B"].ConfirmToolExecution(
            pb.ConfirmToolExecutionRequest(session_id=session_id, tool_id="not-waiting", approved=True),
            timeout=RPC_TIMEOUT_S,
        )
        assert not unknown.success and "'not-waiting'" in unknown.error
        await stub["B"].ConfirmToolExecution(
            pb.ConfirmToolExecutionRequest(
                session_id=session_id, tool_id=chunk.metadata["tool_id"], approved=True
            ),
            timeout=RPC_TIMEOUT_S,
        )
        rest = [c async for c in stream]
    assert rest[-1].type == CHUNK.CHUNK_TYPE_DONE
    assert "".join(c.content for c in rest if c.type == CHUNK.CHUNK_TYPE_CONTENT) == f"ran: {marker}\n"


async def test_an_external_task_completed_on_another_replica_takes_effect(cluster: Cluster) -> None:
    """Also when its result is far too big for a PostgreSQL notification (stored, and notified by
    reference)."""
    result = "deployed from B:" + " ok" * 10_000
    async with stubs(cluster) as stub:
        session_id = await session_on(stub["C"])
        config = pb.LaneHandlerConfig(mode=pb.TASK_HANDLER_MODE_EXTERNAL, timeout_ms=10_000)
        await stub["B"].SetLaneHandler(
            pb.SetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_EXECUTE, config=config),
            timeout=RPC_TIMEOUT_S,
        )
        (created,) = await read_log(cluster, session_id)
        pending = stub["B"].SubscribeEvents(
            pb.SubscribeEventsRequest(session_id=session_id, event_types=["external_task_pending"]),
            metadata=((AFTER_SEQ, str(created.seq)),),
            timeout=RPC_TIMEOUT_S,
        )
        running = generate(stub["A"], session_id, "bash 1: make deploy")
        task_id = (await pending.read()).data["task_id"]
        pending.cancel()
        listed = await stub["C"].ListPendingExternalTasks(  # the run is A's: C asks A
            pb.ListPendingExternalTasksRequest(session_id=session_id), timeout=RPC_TIMEOUT_S
        )
        assert [(t.task_id, t.command_type, t.lane) for t in listed.tasks] == [
            (task_id, "bash", pb.SESSION_LANE_EXECUTE)
        ]
        assert 0 < listed.tasks[0].remaining_ms <= 10_000
        await stub["B"].CompleteExternalTask(
            pb.CompleteExternalTaskRequest(
                session_id=session_id, task_id=task_id, success=True, result=result
            ),
            timeout=RPC_TIMEOUT_S,
        )
        reply = await running
    assert reply.message.content == f"ran: {result}"


async def test_a_harness_cancel_sent_to_another_replica_stops_the_run(cluster: Cluster) -> None:
    """The harness run runs on A; its cancel, posted to B, is carried out by A: B answers with
    the cancelled receipt, A's command is killed, and A's events end the run. A run whose replica
    died is ended by the one that takes it over, and a cancel then finds it ended."""
    marker = f"31.{tag()}"
    identity = {
        "schema": "a3s.code.agent-run-identity.v1",
        "protocol": "a3s.code.agent.v1",
        "agent_release_identity": "sha256:" + "2" * 64,
        "session_id": f"harness-replicas-{marker}",
        "run_id": "run-1",
    }
    start = {"schema": "a3s.code.agent-run-start.v1", "request_id": "req-1", "identity": identity}
    cancel = {
        "schema": "a3s.code.agent-run-cancel.v1",
        "request_id": "req-2",
        "identity": identity,
        "reason": "stop",
    }
    page_request = {"schema": "a3s.code.agent-event-page-request.v1", "identity": identity, "limit": 64}
    a, b = cluster.replicas["A"], cluster.replicas["B"]

    async def command(replica: LoggedServer, action: str, request: dict[str, Any]) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{replica.http_port}/v1/agent/commands"
        async with http.post(url, json={"action": action, "request": request}) as response:
            return response.status, await response.json()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=RPC_TIMEOUT_S)) as http:
        status, _ = await command(a, "start", {**start, "prompt": f"bash 1: sleep {marker}"})
        assert status == 200
        await eventually(lambda: processes_with(marker), "the command runs on A")
        status, receipt = await command(b, "cancel", cancel)
        assert (status, receipt["state"], receipt["replayed"]) == (200, "cancelled", False), receipt
        await eventually(lambda: not processes_with(marker), "the command is killed")
        page_url = f"http://127.0.0.1:{a.http_port}/v1/agent/events:page"

        async def ended() -> bool:
            async with http.post(page_url, json=page_request) as response:
                page = await response.json()
            return page["state"] == "cancelled" and page["events"][-1]["event"]["type"] == "error"

        await eventually(ended, "A's events end the run")
        status, again = await command(b, "cancel", {**cancel, "request_id": "req-3"})
        assert (status, again["state"], again["replayed"]) == (200, "cancelled", True)
        # A run whose replica died (SIGKILL) mid-run: another replica takes it over and ends it,
        # and a cancel then finds it ended.
        other = {**identity, "run_id": "run-2"}
        status, _ = await command(
            a, "start", {**start, "identity": other, "prompt": f"bash 1: sleep 1{marker}"}
        )
        assert status == 200
        await eventually(lambda: processes_with(f"1{marker}"), "the second command runs on A")
        a.kill()
        kill_leftovers(f"1{marker}")

        async def failed_on_b() -> bool:
            url = f"http://127.0.0.1:{b.http_port}/v1/agent/events:page"
            async with http.post(url, json={**page_request, "identity": other}) as response:
                return bool((await response.json())["state"] == "failed")

        await eventually(failed_on_b, "the run ended by the replica that took it over")
        status, late = await command(b, "cancel", {**cancel, "identity": other, "request_id": "req-4"})
    assert (status, late["state"], late["replayed"]) == (200, "failed", True), late


async def test_settings_changed_on_two_replicas_at_once_all_stay(cluster: Cluster) -> None:
    """Rules added to one session on A and on B at the same time: each replica's change is made
    from the header the other left (a change from a header another replica changed meanwhile is
    made again from theirs), so every rule stays, and C reads them all."""
    rules = [f"Bash(echo {i}:*)" for i in range(24)]
    async with stubs(cluster) as stub:
        session_id = await session_on(stub["A"])
        await asyncio.gather(
            *[
                stub["AB"[i % 2]].AddPermissionRule(
                    pb.AddPermissionRuleRequest(session_id=session_id, rule_type="deny", rule=rule),
                    timeout=RPC_TIMEOUT_S,
                )
                for i, rule in enumerate(rules)
            ]
        )
        policy = await stub["C"].GetPermissionPolicy(
            pb.GetPermissionPolicyRequest(session_id=session_id), timeout=RPC_TIMEOUT_S
        )
    assert sorted(r.rule for r in policy.policy.deny) == sorted(rules)


# --- events of a run on one replica, on another ----------------------------------------------------


async def test_a_subscriber_on_one_replica_sees_every_event_of_a_run_on_another(cluster: Cluster) -> None:
    async with stubs(cluster) as stub:
        session_id = await session_on(stub["A"])
        (created,) = await read_log(cluster, session_id)
        assert created.body["type"] == EventType.SESSION_CREATED
        events = stub["B"].SubscribeEvents(
            pb.SubscribeEventsRequest(session_id=session_id),
            metadata=((AFTER_SEQ, str(created.seq)),),
            timeout=RPC_TIMEOUT_S,
        )
        stream = stub["A"].StreamGenerate(
            pb.GenerateRequest(session_id=session_id, messages=[user("bash 3: echo step")]),
            timeout=RPC_TIMEOUT_S,
        )
        chunks = [int(c.metadata["seq"]) async for c in stream]
        received: list[pb.AgentEvent] = []
        async for event in events:
            received.append(event)
            if event.type == pb.AgentEvent.EVENT_TYPE_GENERATION_COMPLETED:
                break
        events.cancel()
    seqs = [int(e.data["seq"]) for e in received]
    logged = [e for e in await read_log(cluster, session_id) if e.seq > created.seq]
    assert [(s, e.type) for s, e in zip(seqs, received, strict=True)] == [
        (e.seq, e.body["type"]) for e in logged if e.kind == EVENT
    ]
    # The run's chunks (streamed on A) and its events (seen on B) make the whole log after the
    # session's creation: nothing missed, nothing twice.
    assert sorted(seqs + chunks) == list(range(created.seq + 1, logged[-1].seq + 1))
    assert [e.type for e in received].count(pb.AgentEvent.EVENT_TYPE_TOOL_COMPLETED) == 3


# --- a replica that stops ----------------------------------------------------------------------------


async def test_a_killed_owner_s_run_is_taken_over_and_no_acknowledged_write_is_lost(cluster: Cluster) -> None:
    marker = f"30.{tag()}"
    killed = cluster.replicas["A"]
    try:
        async with stubs(cluster) as stub:
            session_id = await session_on(stub["B"])
            acknowledged = await generate(stub["A"], session_id, "remember this")
            tool = await stub["A"].ExecuteTool(
                pb.ExecuteToolRequest(
                    session_id=session_id, tool_name="bash", arguments='{"command": "echo kept"}'
                ),
                timeout=RPC_TIMEOUT_S,
            )
            stream = stub["A"].StreamGenerate(
                pb.GenerateRequest(session_id=session_id, messages=[user(f"bash 1: sleep {marker}")]),
                timeout=RPC_TIMEOUT_S,
            )
            seen = [await tool_call_seq(stream)]
            await eventually(lambda: processes_with(marker), "the command runs on A")
            killed.kill()
            with pytest.raises(grpc.aio.AioRpcError):
                async for chunk in stream:
                    seen.append(int(chunk.metadata["seq"]))
            # The caller resumes on a survivor from the last chunk it saw: what the killed replica
            # committed after it, then the takeover's error; no hang.
            resumed = stub["B"].StreamGenerate(
                pb.GenerateRequest(session_id=session_id),
                metadata=((AFTER_SEQ, str(seen[-1])),),
                timeout=RPC_TIMEOUT_S,
            )
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async for chunk in resumed:
                    seen.append(int(chunk.metadata["seq"]))
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
            assert "the replica running it (A) stopped" in (ended.value.details() or "")
            after = await generate(stub["C"], session_id, "carry on")
    finally:
        kill_leftovers(marker)
    assert acknowledged.message.content == "echo: remember this" and tool.result.success
    assert after.message.content == "echo: carry on"
    stored = await history(cluster, session_id)
    assert stored[:2] == [("user", "remember this"), ("assistant", "echo: remember this")]
    assert stored[3] == ("tool", "kept\n")  # the ExecuteTool call's result, after its call
    assert stored[4] == ("user", f"bash 1: sleep {marker}")
    assert stored[5][0] == "assistant" and stored[6][0] == "tool" and INTERRUPTED in stored[6][1]
    assert stored[-2:] == [("user", "carry on"), ("assistant", "echo: carry on")]
    assert not await dangling_calls(cluster, session_id)
    logged = await read_log(cluster, session_id)
    run = next(e.body["run"] for e in logged if e.seq == seen[0])
    run_chunks = [e.seq for e in logged if e.kind != EVENT and e.body["run"] == run]
    assert seen == run_chunks[:-1], "each chunk of the run once, but the failure the error ended"
    errors = events_of(logged, EventType.ERROR)
    assert len(errors) == 1 and "the replica running it (A) stopped" in errors[0].body["message"]
    refused = [r for r in cluster.fake.requests if _message_problem(r.messages)]
    assert not refused, [_message_problem(r.messages) for r in refused]


@pytest.mark.parametrize("command_ends", ["while it sleeps", "after it woke up"])
async def test_a_replica_woken_after_losing_its_lease_is_fenced_and_stops_its_run(
    cluster: Cluster, command_ends: str
) -> None:
    """SIGSTOP the owner past its lease; once another replica took the run over, SIGCONT it. Its
    command's result (when it ended meanwhile) or the answers its stopped run gives the open call
    (when it ends after the wake-up, once the replica found its lease gone) are refused."""
    marker = tag()
    sleep = f"{2 if command_ends == 'while it sleeps' else 30}.{marker}"
    prompt = f"bash 1: sleep {sleep}; echo late-{marker}"
    stale = cluster.replicas["A"]
    try:
        async with stubs(cluster) as stub:
            session_id = await session_on(stub["A"])
            stream = stub["A"].StreamGenerate(
                pb.GenerateRequest(session_id=session_id, messages=[user(prompt)]), timeout=RPC_TIMEOUT_S
            )
            await tool_call_seq(stream)
            await eventually(lambda: processes_with(sleep), "the command runs on A")
            os.kill(stale.pid, signal.SIGSTOP)
            try:

                async def taken_over() -> bool:
                    return bool(events_of(await read_log(cluster, session_id), EventType.ERROR))

                await eventually(taken_over, "another replica takes the run over")
                if command_ends == "while it sleeps":
                    await eventually(lambda: not processes_with(sleep), "the command ends while A sleeps")
                at_takeover = await read_log(cluster, session_id)
                history_at_takeover = await history(cluster, session_id)
            finally:
                os.kill(stale.pid, signal.SIGCONT)
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async for _ in stream:
                    pass
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
            await eventually(lambda: not processes_with(sleep), "A stopped the run's command")
            # A's run is over: the session's generation lock is free on A again.
            after = await generate(stub["A"], session_id, "after the wake-up")
    finally:
        kill_leftovers(sleep)
    assert after.message.content == "echo: after the wake-up"
    assert INTERRUPTED in history_at_takeover[-1][1]
    stored = await history(cluster, session_id)
    assert stored == [
        *history_at_takeover,
        ("user", "after the wake-up"),
        ("assistant", "echo: after the wake-up"),
    ]
    later = [e for e in await read_log(cluster, session_id) if e.seq > at_takeover[-1].seq]
    run = at_takeover[-1].body["data"]["run_id"]
    assert not [e for e in later if e.body.get("run") == run], "an entry of the fenced run landed"
    assert f"the generation of session {session_id} stopped: " in stale.log()


async def test_a_fenced_parent_stops_its_child_and_neither_writes_after_the_takeover(
    cluster: Cluster,
) -> None:
    """A subagent runs on its parent's replica: SIGSTOP that replica past its leases, and another
    takes both runs over; once woken, it stops the child's command, and nothing either run still
    had to say lands in the parent's log or the child's."""
    sleep = f"30.{tag()}"
    stale = cluster.replicas["A"]
    try:
        async with stubs(cluster) as stub:
            session_id = await session_on(stub["A"])
            stream = stub["A"].StreamGenerate(
                pb.GenerateRequest(
                    session_id=session_id, messages=[user(f"delegate: bash 1: sleep {sleep}")]
                ),
                timeout=RPC_TIMEOUT_S,
            )
            await tool_call_seq(stream)
            await eventually(lambda: processes_with(sleep), "the child's command runs on A")
            started = [
                e for e in await read_log(cluster, session_id) if e.body.get("message") == "subagent_start"
            ]
            child = started[0].body["data"]["child_session_id"]
            os.kill(stale.pid, signal.SIGSTOP)
            try:

                async def taken_over() -> bool:
                    logs = [await read_log(cluster, s) for s in (session_id, child)]
                    return all(events_of(log, EventType.ERROR) for log in logs)

                await eventually(taken_over, "another replica takes both runs over")
                at_takeover = {s: await read_log(cluster, s) for s in (session_id, child)}
            finally:
                os.kill(stale.pid, signal.SIGCONT)
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async for _ in stream:
                    pass
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
            await eventually(lambda: not processes_with(sleep), "A stopped the child's command")
            assert not (await stub["A"].Cancel(pb.CancelRequest(session_id=child))).success  # nothing runs
            landed = {s: await read_log(cluster, s) for s in (session_id, child)}
            after = await generate(stub["B"], session_id, "after the wake-up")
            child_after = await generate(stub["C"], child, "and you?")
    finally:
        kill_leftovers(sleep)
    for session, entries in at_takeover.items():
        assert landed[session] == entries, f"{session}: an entry of a fenced run landed after the takeover"
        assert not await dangling_calls(cluster, session)
    assert after.message.content == "echo: after the wake-up"
    assert child_after.message.content == "echo: and you?"


# --- a stuck database ------------------------------------------------------------------------------


async def test_a_call_stuck_behind_a_database_lock_fails_unavailable_once_the_bound_passes(
    postgres_server: Any, tmp_path: Path
) -> None:
    """The operator bounds statements in the store URL (`options=-c statement_timeout=...`): a
    CreateSession stuck behind another client's lock ends UNAVAILABLE, naming why, instead of
    hanging; once the lock is gone the server serves again."""
    with fresh_database(postgres_server, "bounds") as url:
        bounded = f"{url}{'&' if '?' in url else '?'}options=-c%20statement_timeout%3D500"
        server = LoggedServer(
            tmp_path, tmp_path / "data", tmp_path / "server.log", ("--store", bounded, "--replica-id", "A")
        ).start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                async with await psycopg.AsyncConnection.connect(url) as intruder:
                    await intruder.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
                    with pytest.raises(grpc.aio.AioRpcError) as stuck:
                        await stub.CreateSession(pb.CreateSessionRequest(), timeout=RPC_TIMEOUT_S)
                    await intruder.rollback()
                assert stuck.value.code() == grpc.StatusCode.UNAVAILABLE, stuck.value
                assert "the PostgreSQL store (--store) did not answer in time" in (
                    stuck.value.details() or ""
                )
                assert await session_on(stub)
        finally:
            server.kill()
        assert "Traceback" not in server.log(), server.log()[-4000:]
