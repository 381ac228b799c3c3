"""Crash repair: a server killed (SIGKILL) while the model's tool calls run leaves the calls stored
without results. After a restart on the same data directory the next Generate must still work
against a strict provider (the fake LLM answers 400 to unanswered tool calls, as OpenAI does):
each open call gets an "interrupted" result, stored, which the model reads. What the killed call
started (bash, and a `setsid -f` escapee) is gone after the restart.

Then SIGKILL at random moments of generations that call tools, each followed by a restart and a
Generate that must succeed. And Initialize's configuration survives a restart, without its secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from a3s_agent.base.models import LLMConfig
from a3s_agent.core.loop.repair import INTERRUPTED
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import (
    FakeLLM,
    _message_problem,
    call,
    hang,
    text,
    tool_call,
    tool_calls,
    tool_loop,
)
from a3s_agent.tools import procfs
from a3s_agent.tools.containment import MARKER

from ..conftest import agent_settings, running, user
from ..security.test_containment import _processes
from ..test_harness import cancel, page_request, start
from .conftest import LoggedServer, env_number
from .test_disconnects import eventually

pytestmark = pytest.mark.fault

RPC_TIMEOUT_S = 20.0
KILL_CYCLES = int(env_number("A3S_REPAIR_CYCLES", 5))
SEED = int(env_number("A3S_REPAIR_SEED", 20240611))


def llm_env(fake: FakeLLM) -> dict[str, str]:
    """The server's own LLM settings pointing at the fake (no Initialize needed)."""
    return {"A3S_LLM_PROVIDER": "openai", "A3S_LLM_MODEL": "fake-model", "A3S_LLM_BASE_URL": fake.base_url}


def processes_with(arg: str) -> list[int]:
    """Processes (not zombies) with `arg` as one of their arguments."""
    return [pid for pid, argv in _processes() if arg.encode() in argv]


@contextmanager
def server(tmp_path: Path, name: str, env: dict[str, str] | None = None) -> Iterator[LoggedServer]:
    """A server on tmp_path's workspace and data dir, SIGKILLed when the block ends (if still up)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    process = LoggedServer(workspace, tmp_path / "data", tmp_path / f"{name}.log", env=env).start()
    try:
        yield process
    finally:
        process.kill()


def stored_tool_results(data: Path, session_id: str) -> list[tuple[str, str, dict[str, str]]]:
    """(tool_call_id, content, metadata) of the session's live tool messages, read from the file."""
    with closing(sqlite3.connect(f"file:{data / 'sessions.db'}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT content, data FROM messages WHERE session_id = ? AND role = 'tool' AND archived = 0"
            " ORDER BY seq",
            (session_id,),
        ).fetchall()
    return [(json.loads(d)["tool_call_id"], c, json.loads(d).get("metadata", {})) for c, d in rows]


UNSANDBOXED = {"A3S_SANDBOX": "off"}
"""For the tests of what a restart kills: under the sandbox a kill -9 of the server leaves nothing
running (bwrap dies with it; tests/security/test_containment.py checks that), so these run without."""


async def test_restart_answers_the_calls_a_kill_left_open_and_kills_what_they_started(tmp_path: Path) -> None:
    tag = f"{random.randrange(10**6):06d}"
    long_sleep, escapee = f"30.{tag}", f"300.{tag}"
    command = f"setsid -f sleep {escapee}; sleep {long_sleep}; echo done"
    batch = tool_calls(
        [
            call("bash", {"command": "echo first-call-ran"}, id="call_first"),
            call("bash", {"command": command}, id="call_killed"),
        ]
    )
    with FakeLLM(batch, text("I see the call was interrupted."), strict=True) as fake:
        with server(tmp_path, "before", {**llm_env(fake), **UNSANDBOXED}) as first:
            async with grpc.aio.insecure_channel(first.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
                generation = stub.Generate(
                    pb.GenerateRequest(session_id=session_id, messages=[user("run the slow command")])
                )
                await eventually(
                    lambda: bool(processes_with(long_sleep)) and bool(processes_with(escapee)), "bash runs"
                )
                first.kill()
                with pytest.raises(grpc.aio.AioRpcError):
                    await generation
        assert processes_with(long_sleep) and processes_with(escapee), (
            "the kill alone ended the tool's processes"
        )
        # Before the repair, the stored history holds the batch with one result: strict providers refuse it.
        assert [r[0] for r in stored_tool_results(tmp_path / "data", session_id)] == ["call_first"]

        with server(tmp_path, "after", llm_env(fake)) as second:
            await eventually(
                lambda: not processes_with(long_sleep) and not processes_with(escapee), "leftovers killed"
            )
            async with grpc.aio.insecure_channel(second.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                reply = await stub.Generate(
                    pb.GenerateRequest(session_id=session_id, messages=[user("what happened?")]),
                    timeout=RPC_TIMEOUT_S,
                )
            assert "Traceback" not in second.log(), second.log()[-4000:]
    assert reply.message.content == "I see the call was interrupted."
    sent = fake.requests[-1].messages
    answers = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
    assert "first-call-ran" in answers["call_first"]
    assert INTERRUPTED in answers["call_killed"]
    assert [m["role"] for m in sent[-5:]] == ["user", "assistant", "tool", "tool", "user"]
    results = stored_tool_results(tmp_path / "data", session_id)
    assert [r[0] for r in results] == ["call_first", "call_killed"]
    assert INTERRUPTED in results[1][1] and results[1][2] == {"success": "false"}


def tool_processes_of(data: Path) -> set[int]:
    """The live processes carrying the scope marker of the server that last wrote `data`'s record."""
    server = json.loads((data / "processes.json").read_text())["marker"]
    return {
        pid for pid, _ in _processes() if (procfs.environ_value(pid, MARKER) or "").startswith(f"{server}:")
    }


async def test_the_restart_counts_each_process_it_kills_once(tmp_path: Path) -> None:
    """Each process is in the server's cgroup, in its call's cgroup below it and carries the call's
    marker: the restart's log counts it once, whichever of them found it."""
    tag = f"{random.randrange(10**6):06d}"
    command = f"for i in $(seq 12); do sleep 300.{tag} & done; setsid -f sleep 301.{tag}; wait"
    with FakeLLM(tool_call("bash", {"command": command}), text("unused"), strict=True) as fake:
        with server(tmp_path, "before", {**llm_env(fake), **UNSANDBOXED}) as first:
            async with grpc.aio.insecure_channel(first.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
                generation = stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
                await eventually(
                    lambda: len(processes_with(f"300.{tag}")) == 12 and bool(processes_with(f"301.{tag}")),
                    "every sleep runs",
                )
                first.kill()
                with pytest.raises(grpc.aio.AioRpcError):
                    await generation
        left = tool_processes_of(tmp_path / "data")
        assert len(left) == 14, left  # bash, its twelve sleeps and the escapee
        with server(tmp_path, "after", llm_env(fake)) as second:
            await eventually(lambda: not tool_processes_of(tmp_path / "data") & left, "leftovers killed")
            log = second.log()
    assert f"killed {len(left)} tool process(es) left running" in log, log[-4000:]


async def test_sigkill_at_random_moments_of_tool_generations_never_blocks_the_next_one(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    loop = tool_loop(rounds=3, name="bash", arguments={"command": "sleep 0.5; echo step"}, final="Finished.")
    with FakeLLM(fallback=loop, strict=True, delay=0.05) as fake:
        with server(tmp_path, "setup", llm_env(fake)) as first:
            async with grpc.aio.insecure_channel(first.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
        for cycle in range(KILL_CYCLES):
            with server(tmp_path, f"cycle-{cycle}", llm_env(fake)) as process:
                async with grpc.aio.insecure_channel(process.address) as channel:
                    stub = pb_grpc.CodeAgentServiceStub(channel)
                    # Must succeed whatever the last kill interrupted.
                    reply = await stub.Generate(
                        pb.GenerateRequest(session_id=session_id, messages=[user(f"cycle {cycle}")]),
                        timeout=RPC_TIMEOUT_S,
                    )
                    assert reply.message.content == "Finished.", (cycle, reply)
                    generation = stub.Generate(
                        pb.GenerateRequest(session_id=session_id, messages=[user(f"kill {cycle}")])
                    )
                    await asyncio.sleep(rng.uniform(0.05, 1.2))  # somewhere in its three tool rounds
                    process.kill()
                    with pytest.raises(grpc.aio.AioRpcError):
                        await generation
                assert "Traceback" not in process.log(), process.log()[-4000:]
        with server(tmp_path, "final", llm_env(fake)) as last:
            async with grpc.aio.insecure_channel(last.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                reply = await stub.Generate(
                    pb.GenerateRequest(session_id=session_id, messages=[user("after the last kill")]),
                    timeout=RPC_TIMEOUT_S,
                )
    assert reply.message.content == "Finished."
    refused = [r for r in fake.requests if _message_problem(r.messages)]
    assert not refused, (
        f"requests the strict model refused: {[_message_problem(r.messages) for r in refused]}"
    )


LONG_LEASE = {"A3S_LEASE_TTL_S": "600"}  # a killed run's lease would hold its session ten minutes
AFTER_SEQ = "a3s-after-seq"


async def _run_a_long_command(
    stub: pb_grpc.CodeAgentServiceStub, session_id: str, marker: str
) -> tuple[grpc.aio.UnaryStreamCall, int]:
    """Start a generation whose bash call sleeps; its stream and the seq of the call's chunk, once
    the command runs."""
    stream = stub.StreamGenerate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")]), timeout=RPC_TIMEOUT_S
    )
    async for chunk in stream:
        if chunk.type == pb.GenerateChunk.CHUNK_TYPE_TOOL_CALL:
            await eventually(lambda: processes_with(marker), "the command runs")
            return stream, int(chunk.metadata["seq"])
    raise AssertionError("the stream ended without a tool call")


async def test_a_restart_ends_the_killed_run_at_once_and_its_session_generates(tmp_path: Path) -> None:
    """The next server on the data directory holds it alone, so the lease the killed run left is
    stale: its run ends as the server starts (its stream resumed gets the failure, its call an
    answer) and the session generates again, not ten minutes later when the lease expires."""
    marker = f"30.{random.randrange(10**6):06d}"
    script = [tool_call("bash", {"command": f"sleep {marker}"}), text("Finished.")]
    with FakeLLM(*script, strict=True) as fake:
        with server(tmp_path, "killed", {**llm_env(fake), **LONG_LEASE}) as first:
            async with grpc.aio.insecure_channel(first.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
                stream, seq = await _run_a_long_command(stub, session_id, marker)
                first.kill()
                with pytest.raises(grpc.aio.AioRpcError):
                    async for _ in stream:
                        pass
        with server(tmp_path, "restarted", {**llm_env(fake), **LONG_LEASE}) as second:
            async with grpc.aio.insecure_channel(second.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                resumed = stub.StreamGenerate(
                    pb.GenerateRequest(session_id=session_id),
                    metadata=((AFTER_SEQ, str(seq)),),
                    timeout=RPC_TIMEOUT_S,
                )
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    async for _ in resumed:
                        pass
                reply = await stub.Generate(
                    pb.GenerateRequest(session_id=session_id, messages=[user("again")]), timeout=RPC_TIMEOUT_S
                )
            assert "1 run(s) left by a server that ended are ended now" in second.log()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
    assert "stopped" in (ended.value.details() or "")
    assert reply.message.content == "Finished."
    assert INTERRUPTED in stored_tool_results(tmp_path / "data", session_id)[0][1]
    assert not processes_with(marker)


async def test_servers_sharing_a_data_dir_end_none_of_each_other_s_runs(tmp_path: Path) -> None:
    """A server started beside a live one on its data directory (as an editor's `acp` beside
    `serve`) does not have the directory alone: the other's running generation is not its to end.
    Nor is it for the first one restarted after a kill while the second still runs one."""
    first_sleep, second_sleep = f"2.{random.randrange(10**6):06d}", f"6.{random.randrange(10**6):06d}"
    async with contextlib.AsyncExitStack() as stack:
        env: dict[str, dict[str, str]] = {}
        for name, sleep in (("first", first_sleep), ("second", second_sleep)):
            # A model of each server's own: one shared would give its turns to whichever asks first.
            script = [tool_call("bash", {"command": f"sleep {sleep}; echo slept"}), text("Finished.")]
            env[name] = {**LONG_LEASE, **llm_env(stack.enter_context(FakeLLM(*script, strict=True)))}
        first = stack.enter_context(server(tmp_path, "first", env["first"]))
        first_stream, first_session = await _long_command_on(stack, first, first_sleep)
        second = stack.enter_context(server(tmp_path, "second", env["second"]))
        second_stream, second_session = await _long_command_on(stack, second, second_sleep)
        first_end = [chunk async for chunk in first_stream][-1]
        first.kill()
        restarted = stack.enter_context(server(tmp_path, "restarted", env["first"]))
        second_end = [chunk async for chunk in second_stream][-1]
    for process in (second, restarted):
        assert "left by a server that ended" not in process.log()
        assert "is locked): runs a crash left here end only when their leases expire" in process.log()
    assert first_end.type == second_end.type == pb.GenerateChunk.CHUNK_TYPE_DONE, (first_end, second_end)
    for session_id in (first_session, second_session):
        assert [r[1] for r in stored_tool_results(tmp_path / "data", session_id)] == ["slept\n"]


async def _long_command_on(
    stack: contextlib.AsyncExitStack, process: LoggedServer, sleep: str
) -> tuple[grpc.aio.UnaryStreamCall, str]:
    """A new session on `process` and the stream of its generation, once its bash command runs."""
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(process.address))
    stub = pb_grpc.CodeAgentServiceStub(channel)
    session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
    stream, _ = await _run_a_long_command(stub, session_id, sleep)
    return stream, session_id


@pytest.mark.parametrize("killed", ["during its command", "before its first event"])
async def test_a_harness_run_its_server_was_killed_in_is_failed_by_the_next_one(
    tmp_path: Path, killed: str
) -> None:
    """The A3S harness's view of the same: after the restart the run reads failed, its events end
    with an error, and a cancel gets the failed run's receipt (not 409 run_unavailable). Also when
    the kill came while the model had not answered yet, before the run's first event: its record
    names the generation's run from its admission."""
    marker = f"30.{random.randrange(10**6):06d}"

    async def post(process: LoggedServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with http.post(f"http://127.0.0.1:{process.http_port}{path}", json=body) as response:
            return response.status, await response.json()

    turn = tool_call("bash", {"command": f"sleep {marker}"}) if killed == "during its command" else hang()
    with FakeLLM(turn, strict=True) as fake:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=RPC_TIMEOUT_S)) as http:
            with server(tmp_path, "killed", {**llm_env(fake), **LONG_LEASE}) as first:
                assert (await post(first, "/v1/agent/commands", start("go")))[0] == 200
                if killed == "during its command":
                    await eventually(lambda: processes_with(marker), "the command runs")
                    await eventually(lambda: stored_run_state(tmp_path / "data") == "executing", "the record")
                else:
                    await eventually(lambda: len(fake.requests) == 1, "the model is asked")
                    assert stored_run_state(tmp_path / "data") == "created"
            with server(tmp_path, "restarted", {**llm_env(fake), **LONG_LEASE}) as second:
                _, events = await post(second, "/v1/agent/events:page", page_request(None, 64))
                status, receipt = await post(second, "/v1/agent/commands", cancel())
    assert events["state"] == "failed" and events["events"][-1]["event"]["type"] == "error", events
    assert (status, receipt["state"], receipt["replayed"]) == (200, "failed", True), receipt


def stored_run_state(data: Path) -> str:
    """The state the stored record of the harness run conv-42/run-42-1 says (once it executes, the
    record names its events in the log)."""
    with closing(sqlite3.connect(f"file:{data / 'sessions.db'}?mode=ro", uri=True)) as db:
        row = db.execute(
            "SELECT record FROM harness_runs WHERE session_id = 'conv-42' AND run_id = 'run-42-1'"
        ).fetchone()
    return "" if row is None else str(json.loads(row[0])["state"])


def insert_messages(
    data: Path, session_id: str, messages: Sequence[tuple[str, str, Mapping[str, object]]]
) -> None:
    """Append (role, content, data) rows to a session's live history, as a server would have."""
    with closing(sqlite3.connect(data / "sessions.db")) as db, db:
        db.executemany(
            "INSERT INTO messages (session_id, role, content, data, created_at) VALUES (?, ?, ?, ?, 0)",
            [(session_id, role, content, json.dumps(extra)) for role, content, extra in messages],
        )


async def test_a_result_stored_after_another_writers_turn_is_moved_next_to_its_call(
    tmp_path: Path, workspace: Path
) -> None:
    """What a crash leaves when ExecuteTool recorded into the session while the model's batch ran:
    the batch, the direct call's turn and result, then one of the batch's results (the other lost)."""
    batch = {
        "tool_calls": [
            {"id": "a", "name": "bash", "arguments": "{}"},
            {"id": "b", "name": "bash", "arguments": "{}"},
        ]
    }
    direct = {"tool_calls": [{"id": "x", "name": "read_file", "arguments": "{}"}]}
    async with FakeLLM(text("ok"), strict=True) as fake:
        llm = LLMConfig(model="fake-model", base_url=fake.base_url)
        settings = replace(agent_settings(workspace, tmp_path / "data"), llm=llm)
        async with running(settings) as first:
            session_id = (await first.stub.CreateSession(pb.CreateSessionRequest())).session_id
        insert_messages(
            tmp_path / "data",
            session_id,
            [
                ("user", "go", {}),
                ("assistant", "", batch),
                ("assistant", "", direct),
                ("tool", "x's result", {"tool_call_id": "x", "name": "read_file"}),
                ("tool", "a's result", {"tool_call_id": "a", "name": "bash"}),
            ],
        )
        async with running(settings) as second:
            reply = await second.stub.Generate(
                pb.GenerateRequest(session_id=session_id, messages=[user("next")])
            )
    assert reply.message.content == "ok"
    sent = [(m["role"], m.get("tool_call_id", "")) for m in fake.requests[0].messages[1:]]
    assert sent == [
        ("user", ""), ("assistant", ""), ("tool", "a"), ("tool", "b"), ("assistant", ""), ("tool", "x"), ("user", "")
    ]  # fmt: skip
    assert INTERRUPTED in fake.requests[0].messages[4]["content"]


SECRETS = ("sk-init-SECRET-123", "tok-SECRET-456", "dt-SECRET-789")


async def test_initialize_survives_a_restart_without_its_secrets(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    initialize = pb.InitializeRequest(
        workspace=str(chosen),
        config=pb.AgentConfig(
            llm=pb.LLMConfig(provider="openai", model="init-model", base_url="", api_key=SECRETS[0]),
            tools=pb.ToolsConfig(
                disabled_tools=["web_fetch"], tool_config={"depth": "3", "service_token": SECRETS[1]}
            ),
            log=pb.LogConfig(level=pb.LogConfig.LEVEL_DEBUG),
        ),
        env={"GREETING": "hello", "DEPLOY_TOKEN": SECRETS[2]},
    )
    with FakeLLM(fallback=text("from the stored endpoint"), strict=True) as fake:
        initialize.config.llm.base_url = fake.base_url
        with server(tmp_path, "initialized") as first:  # no LLM settings of its own
            async with grpc.aio.insecure_channel(first.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                await stub.Initialize(initialize, timeout=RPC_TIMEOUT_S)
                before = await stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=RPC_TIMEOUT_S)
            first.kill()
        on_disk = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
        assert b"init-model" in on_disk  # what is stored is there ...
        assert not [s for s in SECRETS if s.encode() in on_disk]  # ... but no secret

        with server(tmp_path, "restarted") as second:
            async with grpc.aio.insecure_channel(second.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=RPC_TIMEOUT_S)
                health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)
                with pytest.raises(grpc.aio.AioRpcError) as disabled:
                    await stub.ExecuteTool(
                        pb.ExecuteToolRequest(
                            tool_name="web_fetch", arguments='{"url": "http://127.0.0.1:9/"}'
                        ),
                        timeout=RPC_TIMEOUT_S,
                    )
                env = await stub.ExecuteTool(
                    pb.ExecuteToolRequest(
                        tool_name="bash",
                        arguments=json.dumps({"command": 'echo "$GREETING-${DEPLOY_TOKEN:-unset}"'}),
                    ),
                    timeout=RPC_TIMEOUT_S,
                )
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
                reply = await stub.Generate(
                    pb.GenerateRequest(session_id=session_id, messages=[user("hello")]), timeout=RPC_TIMEOUT_S
                )
            log = second.log()
    assert [t.name for t in caps.tools] == [t.name for t in before.tools]
    assert "web_fetch" not in [t.name for t in caps.tools] and "bash" in [t.name for t in caps.tools]
    assert [(m.provider, m.model) for m in caps.models] == [("openai", "init-model")]
    assert health.details["workspace"] == str(chosen.resolve())
    assert disabled.value.code() == grpc.StatusCode.NOT_FOUND
    assert env.result.output.strip() == "hello-unset"  # the secret's value was not stored
    assert reply.message.content == "from the stored endpoint"
    assert fake.requests[-1].model == "init-model"
    assert fake.requests[-1].authorization is None  # the key was not stored, and none was configured
    assert "env DEPLOY_TOKEN" in log and "tool_config service_token" in log
    assert not [s for s in SECRETS if s in log]
