"""The control plane through the real server and the in-process scripted model: events, cancel,
pause/resume, confirmation, permissions, lanes and external tasks, client tools, ask_user."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from pydantic import BaseModel

from a3s_agent.base.models import Message
from a3s_agent.config import SandboxSettings
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import Reply, call, text, tool_call, tool_calls
from a3s_agent.tools.builtin import builtin_tools
from a3s_agent.tools.registry import PATH, ToolContext, ToolRegistry, tool

from .conftest import (
    LiveServer,
    agent_settings,
    alive,
    eventually,
    host_pid,
    initialize,
    new_session,
    running,
    subscribed,
    user,
)
from .scripted_model import ScriptedProvider, after

CHUNK = pb.GenerateChunk


def generate(server: LiveServer, session_id: str, content: str = "go") -> asyncio.Task[pb.GenerateResponse]:
    return asyncio.ensure_future(
        server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user(content)]))
    )


# --- events ---------------------------------------------------------------------------------


async def test_a_subscriber_sees_the_exact_sequence_of_a_multi_tool_run(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(
        tool_calls(
            [call("write_file", {"path": "a.txt", "content": "x"}), call("read_file", {"path": "a.txt"})]
        ),
        text("done"),
    )
    session_id = await new_session(scripted_agent)
    stream = scripted_agent.stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=session_id))
    await subscribed(scripted_agent)
    await generate(scripted_agent, session_id)
    events = []
    async for event in stream:
        events.append(event)
        if event.type == pb.AgentEvent.EVENT_TYPE_GENERATION_COMPLETED:
            break
    stream.cancel()
    # The checkpoint of the turn is taken while the model is called: logged before the write runs.
    (checkpoint,) = [i for i, e in enumerate(events) if e.message == "checkpoint_created"]
    assert checkpoint < [pb.AgentEvent.EventType.Name(e.type) for e in events].index(
        "EVENT_TYPE_TOOL_COMPLETED"
    )
    del events[checkpoint]
    names = [pb.AgentEvent.EventType.Name(e.type).removeprefix("EVENT_TYPE_") for e in events]
    assert names == [
        "GENERATION_STARTED",
        "TOOL_CALLED", "TOOL_COMPLETED",
        "TOOL_CALLED", "TOOL_COMPLETED",
        "GENERATION_COMPLETED",
    ]  # fmt: skip
    assert all(e.session_id == session_id and e.message for e in events)
    # The timestamp is Unix seconds as A3S means it (it was milliseconds before issue 18); the
    # milliseconds the log keeps are in data["timestamp_ms"].
    now = time.time()
    assert all(
        now - 60 < e.timestamp <= now and int(e.data["timestamp_ms"]) // 1000 == e.timestamp for e in events
    )
    assert [int(e.data["timestamp_ms"]) for e in events] == sorted(
        int(e.data["timestamp_ms"]) for e in events
    )
    called = events[1]
    assert (
        called.data["tool_name"] == "write_file" and json.loads(called.data["arguments"])["path"] == "a.txt"
    )
    assert events[2].data["success"] == "true" and float(events[2].data["duration_ms"]) >= 0
    assert events[-1].data["finish_reason"] == "stop" and events[-1].data["turns"] == "2"


async def test_event_type_filters_take_both_name_forms_and_refuse_unknown_ones(live: LiveServer) -> None:
    stream = live.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(event_types=["EVENT_TYPE_SESSION_DESTROYED", "session_created"])
    )
    await subscribed(live)
    session_id = await new_session(live)
    await live.stub.DestroySession(pb.DestroySessionRequest(session_id=session_id))
    first, second = await stream.read(), await stream.read()
    stream.cancel()
    assert (first.type, second.type) == (
        pb.AgentEvent.EVENT_TYPE_SESSION_CREATED,
        pb.AgentEvent.EVENT_TYPE_SESSION_DESTROYED,
    )
    bad = live.stub.SubscribeEvents(pb.SubscribeEventsRequest(event_types=["tool_exploded"]))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await bad.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tool_exploded" in err.value.details()


async def test_a_subscription_to_one_session_ends_when_the_session_is_destroyed(live: LiveServer) -> None:
    """Nothing can follow a destroyed session's last event: the stream ends (OK) instead of hanging,
    also when its filter leaves SESSION_DESTROYED out (the TypeScript SDK's examples wait for it)."""
    session_id = await new_session(live)
    everything = live.stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=session_id))
    filtered = live.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id, event_types=["tool_called"])
    )
    await subscribed(live, 2)
    await live.stub.DestroySession(pb.DestroySessionRequest(session_id=session_id))
    got = await asyncio.wait_for(_all(everything), 10)
    assert [e.type for e in got] == [pb.AgentEvent.EVENT_TYPE_SESSION_DESTROYED]
    assert await asyncio.wait_for(_all(filtered), 10) == []
    assert await everything.code() == grpc.StatusCode.OK


async def _all(stream: grpc.aio.UnaryStreamCall) -> list[pb.AgentEvent]:
    return [event async for event in stream]


async def test_the_bus_counts_the_subscriptions_a_client_holds(live: LiveServer) -> None:
    assert live.runtime.events.subscriber_count == 0
    stream = live.stub.SubscribeEvents(pb.SubscribeEventsRequest())
    await subscribed(live)  # what tests wait on instead of sleeping
    assert live.runtime.events.subscriber_count == 1
    stream.cancel()
    await eventually(lambda: live.runtime.events.subscriber_count == 0, "the subscription closed")


async def test_a_session_s_events_reach_its_own_subscribers_and_those_of_every_session(
    live: LiveServer,
) -> None:
    destroyed = pb.AgentEvent.EVENT_TYPE_SESSION_DESTROYED
    a, b = await new_session(live), await new_session(live)
    of_a = live.stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=a))
    of_b = live.stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=b))
    of_all = live.stub.SubscribeEvents(pb.SubscribeEventsRequest())
    await subscribed(live, 3)
    for session_id, own in ((a, of_a), (b, of_b)):
        await live.stub.DestroySession(pb.DestroySessionRequest(session_id=session_id))
        assert [(e.type, e.session_id) for e in await asyncio.wait_for(_all(own), 10)] == [
            (destroyed, session_id)
        ]
        seen = await asyncio.wait_for(of_all.read(), 10)
        assert (seen.type, seen.session_id) == (destroyed, session_id)
    await eventually(lambda: live.runtime.events.subscriber_count == 1, "the ended streams unsubscribed")
    of_all.cancel()
    await eventually(lambda: live.runtime.events.subscriber_count == 0, "the subscription closed")


async def test_event_streams_end_cleanly_on_shutdown(live: LiveServer) -> None:
    stream = live.stub.SubscribeEvents(pb.SubscribeEventsRequest())
    await subscribed(live)
    await live.server.stop(5)
    assert [e async for e in stream] == []
    assert await stream.code() == grpc.StatusCode.OK


# --- cancel, pause, resume -------------------------------------------------------------------


async def test_cancel_during_a_long_bash_call_stops_it_and_its_process(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    marker = scripted_agent.workspace / "pid"
    scripted.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 60"}), text("never reached"))
    session_id = await new_session(scripted_agent)
    running_generation = generate(scripted_agent, session_id)
    await eventually(lambda: marker.exists() and marker.read_text().strip() != "")
    pid = host_pid(int(marker.read_text()))
    started = asyncio.get_running_loop().time()
    reply = await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id))
    assert reply.success
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running_generation
    assert err.value.code() == grpc.StatusCode.CANCELLED
    assert asyncio.get_running_loop().time() - started < 2
    await eventually(lambda: not alive(pid))
    history = await scripted_agent.runtime.sessions.history(session_id)
    assert "cancelled" in history[-1].content
    assert history[-2].role == "tool" and "cancelled" in history[-2].content  # the call got its answer
    assert len(scripted.requests) == 1
    # Nothing runs now: Cancel says so without an error.
    assert not (await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    # The session goes on: the history is one a strict provider accepts.
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("again")])
    )
    assert reply.message.content == "never reached"


async def test_cancel_during_a_streaming_reply_ends_the_stream_with_cancelled(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(Reply(content="word " * 200, chunk_delay=0.02))
    session_id = await new_session(scripted_agent)
    stream = scripted_agent.stub.StreamGenerate(
        pb.GenerateRequest(session_id=session_id, messages=[user("talk")])
    )
    first = await stream.read()
    assert first.type == CHUNK.CHUNK_TYPE_CONTENT
    assert (await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while True:
            chunk = await stream.read()
            assert chunk is not grpc.aio.EOF and chunk.type == CHUNK.CHUNK_TYPE_CONTENT
    assert err.value.code() == grpc.StatusCode.CANCELLED


async def test_cancelling_one_tool_call_lets_the_run_continue(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(tool_call("bash", {"command": "sleep 60"}, id="call_slow"), text("carried on"))
    session_id = await new_session(scripted_agent)
    running_generation = generate(scripted_agent, session_id)
    await eventually(lambda: "call_slow" in scripted_agent.runtime.control.of(session_id).tool_tasks)
    reply = await scripted_agent.stub.Cancel(
        pb.CancelRequest(session_id=session_id, operation_id="call_slow")
    )
    assert reply.success
    result = await running_generation
    assert result.message.content == "carried on"
    assert result.tool_calls[0].result.error == "cancelled by the client"


async def test_pause_stops_at_the_next_step_and_resume_continues(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    answer = asyncio.Event()
    scripted.script(
        after(answer, tool_call("write_file", {"path": "after-resume.txt", "content": "ok"})),
        text("finished"),
    )
    session_id = await new_session(scripted_agent)
    running_generation = generate(scripted_agent, session_id)
    await eventually(lambda: scripted.requests, "the model call")
    assert (await scripted_agent.stub.Pause(pb.PauseRequest(session_id=session_id))).success
    session = (await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.state == pb.SESSION_STATE_PAUSED
    answer.set()  # the model answers while paused; the tool call waits at the step boundary

    async def call_stored() -> bool:
        history = await scripted_agent.runtime.sessions.history(session_id)
        return any(message.tool_calls for message in history)

    await eventually(call_stored, "the model's tool call in the history")
    assert not (scripted_agent.workspace / "after-resume.txt").exists()
    assert not running_generation.done()
    other = await new_session(scripted_agent)
    await scripted_agent.stub.Pause(pb.PauseRequest(session_id=other))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await scripted_agent.stub.Generate(pb.GenerateRequest(session_id=other, messages=[user("x")]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "paused" in err.value.details()
    assert (await scripted_agent.stub.Resume(pb.ResumeRequest(session_id=session_id))).success
    reply = await running_generation
    assert reply.message.content == "finished"
    assert (scripted_agent.workspace / "after-resume.txt").read_text() == "ok"
    session = (await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.state == pb.SESSION_STATE_ACTIVE


async def test_cancelling_a_paused_run_leaves_the_session_ready_for_the_next(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    answer = asyncio.Event()
    scripted.script(
        after(answer, tool_call("write_file", {"path": "never.txt", "content": "x"})), text("next")
    )
    session_id = await new_session(scripted_agent)
    running_generation = generate(scripted_agent, session_id)
    await eventually(lambda: scripted.requests, "the model call")
    await scripted_agent.stub.Pause(pb.PauseRequest(session_id=session_id))
    answer.set()
    assert (await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    with pytest.raises(grpc.aio.AioRpcError) as stopped:
        await running_generation
    assert stopped.value.code() == grpc.StatusCode.CANCELLED
    session = (await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.state == pb.SESSION_STATE_ACTIVE  # the pause ended with the run it held
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go on")])
    )
    assert reply.message.content == "next" and not (scripted_agent.workspace / "never.txt").exists()


async def test_context_injected_while_running_reaches_the_next_model_call(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    answer = asyncio.Event()
    scripted.script(after(answer, tool_call("list_files", {})), text("noted"))
    session_id = await new_session(scripted_agent)
    running_generation = generate(scripted_agent, session_id)
    await eventually(lambda: scripted.requests, "the first model call")
    injected = Message(role="user", content="[context] the deadline moved to Friday")
    assert scripted_agent.runtime.control.inject(session_id, [injected])
    answer.set()
    await running_generation
    second_call = scripted.requests[1].messages
    assert second_call[-1]["content"] == "[context] the deadline moved to Friday"
    assert not scripted_agent.runtime.control.inject(session_id, [injected])  # nothing runs now


# --- human confirmation ----------------------------------------------------------------------


async def _confirming_session(server: LiveServer, timeout_ms: int = 5000, auto_approve: bool = False) -> str:
    session_id = await new_session(server)
    policy = pb.ConfirmationPolicy(
        enabled=True,
        require_confirm_tools=["write_file"],
        default_timeout_ms=timeout_ms,
        timeout_action=pb.TIMEOUT_ACTION_AUTO_APPROVE if auto_approve else pb.TIMEOUT_ACTION_REJECT,
    )
    reply = await server.stub.SetConfirmationPolicy(
        pb.SetConfirmationPolicyRequest(session_id=session_id, policy=policy)
    )
    assert reply.success and reply.policy.default_timeout_ms == timeout_ms
    return session_id


async def _confirmation_chunk(stream: grpc.aio.UnaryStreamCall) -> pb.GenerateChunk:
    async for chunk in stream:
        if chunk.type == CHUNK.CHUNK_TYPE_METADATA and chunk.metadata.get("type") == "confirmation_required":
            return chunk
    raise AssertionError("no confirmation request")


@pytest.mark.parametrize("approved", [True, False])
async def test_confirmation_approve_and_reject(
    scripted_agent: LiveServer, scripted: ScriptedProvider, approved: bool
) -> None:
    scripted.script(tool_call("write_file", {"path": "c.txt", "content": "x"}), text("ok"))
    session_id = await _confirming_session(scripted_agent)
    stream = scripted_agent.stub.StreamGenerate(
        pb.GenerateRequest(session_id=session_id, messages=[user("write")])
    )
    chunk = await _confirmation_chunk(stream)
    assert chunk.metadata["tool_name"] == "write_file"
    assert not (scripted_agent.workspace / "c.txt").exists()
    await scripted_agent.stub.ConfirmToolExecution(
        pb.ConfirmToolExecutionRequest(
            session_id=session_id, tool_id=chunk.metadata["tool_id"], approved=approved, reason="not today"
        )
    )
    results = [c async for c in stream if c.type == CHUNK.CHUNK_TYPE_TOOL_RESULT]
    assert (scripted_agent.workspace / "c.txt").exists() is approved
    if not approved:
        assert results[0].tool_result.error == "rejected by user: not today"
        assert "rejected by user" in scripted.requests[1].messages[-1]["content"]
    # A3S answers an unknown confirmation in the reply, not with an error status (NOT_FOUND before
    # issue 18); the call already answered is unknown now too.
    for tool_id in ("nope", chunk.metadata["tool_id"]):
        unknown = await scripted_agent.stub.ConfirmToolExecution(
            pb.ConfirmToolExecutionRequest(session_id=session_id, tool_id=tool_id, approved=True)
        )
        assert not unknown.success and repr(tool_id) in unknown.error and "confirmation" in unknown.error


@pytest.mark.parametrize("auto_approve", [False, True])
async def test_confirmation_timeout_applies_the_timeout_action(
    scripted_agent: LiveServer, scripted: ScriptedProvider, auto_approve: bool
) -> None:
    scripted.script(tool_call("write_file", {"path": "t.txt", "content": "x"}), text("ok"))
    session_id = await _confirming_session(scripted_agent, timeout_ms=200, auto_approve=auto_approve)
    events = scripted_agent.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id, event_types=["confirmation_timeout"])
    )
    await subscribed(scripted_agent)
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("write")])
    )
    timeout_event = await events.read()
    events.cancel()
    assert timeout_event.data["action"] == ("approved" if auto_approve else "rejected")
    assert (scripted_agent.workspace / "t.txt").exists() is auto_approve
    assert reply.tool_calls[0].result.success is auto_approve


# --- permissions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "command"),
    [
        ("Bash(rm:*)", "rm -rf build"),
        # What the program runs is seen through wrappers, paths and quotes.
        ("Bash(rm:*)", "env rm -rf build"),
        ("Bash(rm:*)", "timeout 5 nice rm -rf build"),
        ("Bash(rm:*)", "bash -c 'cd . && rm -rf build'"),
        ("Bash(rm:*)", "find . -maxdepth 1 -name build -exec rm -rf {} +"),
        ("Bash(rm:*)", "echo build | xargs /bin/rm -rf"),
        ("Bash(rm:*)", "'r''m' -rf build"),
        # A long command's rules are matched off the event loop, just as well.
        ("Bash(rm:*)", "echo padding; " * 600 + "env rm -rf build"),
        # Flags are the rule's however they are spelt.
        ("Bash(rm -rf:*)", "rm -fr build"),
        ("Bash(rm -rf:*)", "rm -r -f build"),
        ("Bash(rm -rf:*)", "sudo rm --recursive --force build"),
        # The rule's words are found past the options before them.
        ("Bash(rm build:*)", "rm -f -r build"),
        ("Bash(git rm:*)", "git -c core.quotepath=off --no-pager rm -r build"),
    ],
    ids=[
        "plain", "env", "timeout-nice", "bash-c", "find-exec", "xargs-path", "quoted", "long",
        "flags-reordered", "flags-apart", "flags-long", "words-after-flags", "git-options",
    ],
)  # fmt: skip
async def test_deny_rules_stop_a_call_and_tell_the_model(
    scripted_agent: LiveServer, scripted: ScriptedProvider, rule: str, command: str
) -> None:
    scripted.script(tool_call("bash", {"command": command}), text("understood"))
    session_id = await new_session(scripted_agent)
    policy = pb.PermissionPolicy(enabled=True, deny=[pb.PermissionRule(rule=rule)])
    await scripted_agent.stub.SetPermissionPolicy(
        pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy)
    )
    (scripted_agent.workspace / "build").mkdir()
    denied = scripted_agent.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id, event_types=["permission_denied"])
    )
    await subscribed(scripted_agent)
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("clean")])
    )
    assert (scripted_agent.workspace / "build").exists()
    assert reply.tool_calls[0].result.error == f"denied by policy: {rule}"
    event = await asyncio.wait_for(denied.read(), 10)
    denied.cancel()
    assert event.data["tool_name"] == "bash"


async def test_a_rule_added_during_a_run_governs_its_next_calls(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    """An operator who denies something while the agent works stops it now, not at the next run."""
    answer = asyncio.Event()
    scripted.script(
        tool_call("list_files", {}),
        after(answer, tool_call("write_file", {"path": "late.txt", "content": "x"})),
        text("understood"),
    )
    session_id = await new_session(scripted_agent)
    running_generation = generate(scripted_agent, session_id)
    await eventually(lambda: len(scripted.requests) >= 2, "the model's second turn")
    await scripted_agent.stub.AddPermissionRule(
        pb.AddPermissionRuleRequest(session_id=session_id, rule_type="deny", rule="Write")
    )
    answer.set()
    reply = await running_generation
    assert reply.tool_calls[-1].result.error == "denied by policy: Write"
    assert not (scripted_agent.workspace / "late.txt").exists()


async def test_ask_rules_without_confirmation_fall_back_to_the_timeout_action(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(tool_call("write_file", {"path": "w.txt", "content": "x"}), text("ok"))
    session_id = await new_session(scripted_agent)
    policy = pb.PermissionPolicy(enabled=True, ask=[pb.PermissionRule(rule="Write")])
    await scripted_agent.stub.SetPermissionPolicy(
        pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy)
    )
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("write")])
    )
    assert not (scripted_agent.workspace / "w.txt").exists()
    assert reply.tool_calls[0].result.error.startswith("rejected by user")


class ShelveArgs(BaseModel):
    path: str


async def test_a_new_tool_is_checked_on_the_path_it_declares(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> None:
    """A tool is its definition plus one registration: declaring its path argument is all it takes
    for path rules to govern it, relative to the workspace and normalised, as the file tools are."""
    shelved: list[str] = []

    @tool("shelve", family="file", lane="execute", rule_subject=PATH)
    async def shelve(args: ShelveArgs, ctx: ToolContext) -> str:
        """Put a file on the shelf."""
        shelved.append(args.path)
        return "shelved"

    registry = ToolRegistry([*builtin_tools(), shelve])
    settings = agent_settings(workspace, tmp_path / "data")
    async with running(settings, connect=scripted.connect, registry=registry) as server:
        await initialize(server)
        session_id = await new_session(server)
        policy = pb.PermissionPolicy(enabled=True, deny=[pb.PermissionRule(rule="shelve(secret/**)")])
        await server.stub.SetPermissionPolicy(
            pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy)
        )
        scripted.script(
            tool_call("shelve", {"path": "notes/../secret/key.pem"}),
            tool_call("shelve", {"path": "notes/todo.txt"}),
            text("done"),
        )
        reply = await server.stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("shelve")])
        )
        assert [call.result.error for call in reply.tool_calls] == ["denied by policy: shelve(secret/**)", ""]
        assert shelved == ["notes/todo.txt"]
        checked = await server.stub.CheckPermission(
            pb.CheckPermissionRequest(
                session_id=session_id,
                tool_name="Shelve",
                arguments=json.dumps({"path": f"{workspace}/secret/a"}),
            )
        )
        assert checked.decision == pb.PERMISSION_DECISION_DENY


async def test_permission_policy_rpcs(live: LiveServer) -> None:
    session_id = await new_session(live)
    policy = pb.PermissionPolicy(
        enabled=True,
        allow=[pb.PermissionRule(rule="Bash(cargo:*)")],
        deny=[pb.PermissionRule(rule="Read(secrets/**)")],
        default_decision=pb.PERMISSION_DECISION_ASK,
    )
    reply = await live.stub.SetPermissionPolicy(
        pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy)
    )
    assert reply.policy == policy
    await live.stub.AddPermissionRule(
        pb.AddPermissionRuleRequest(session_id=session_id, rule_type="deny", rule="Bash(cargo publish:*)")
    )
    got = (await live.stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id=session_id))).policy
    assert [r.rule for r in got.deny] == ["Read(secrets/**)", "Bash(cargo publish:*)"]

    async def check(tool: str, arguments: dict[str, object]) -> pb.CheckPermissionResponse:
        return await live.stub.CheckPermission(
            pb.CheckPermissionRequest(session_id=session_id, tool_name=tool, arguments=json.dumps(arguments))
        )

    allowed = await check("bash", {"command": "cargo test"})
    assert allowed.decision == pb.PERMISSION_DECISION_ALLOW and list(allowed.matching_rules) == [
        "Bash(cargo:*)"
    ]
    denied = await check("bash", {"command": "cargo publish --dry-run"})
    assert denied.decision == pb.PERMISSION_DECISION_DENY
    for wrapped in (
        "env CARGO_TERM_COLOR=never cargo publish",
        "cargo test; " * 500 + "sudo cargo publish",
        "cargo +nightly --locked publish",
        "cargo -Z unstable-options publish",
    ):
        assert (await check("bash", {"command": wrapped})).decision == pb.PERMISSION_DECISION_DENY
    assert (await check("read_file", {"path": "secrets/key.pem"})).decision == pb.PERMISSION_DECISION_DENY
    asked = await check("write_file", {"path": "x"})
    assert asked.decision == pb.PERMISSION_DECISION_ASK and list(asked.matching_rules) == []
    for rule_type, rule in (("deny", "Bash("), ("sometimes", "Bash")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await live.stub.AddPermissionRule(
                pb.AddPermissionRuleRequest(session_id=session_id, rule_type=rule_type, rule=rule)
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_allow_rule_for_a_program_does_not_cover_where_it_writes(
    workspace: Path, scripted: ScriptedProvider, tmp_path: Path
) -> None:
    """`Bash(echo:*)` runs echo, but a redirection or tee writing a file asks again (here: the
    timeout action rejects at once) unless a rule covers writing there; outside the workspace only
    a rule with an absolute path does (and the operator's sandbox must let commands write there)."""
    outside, elsewhere = tmp_path / "pwned", tmp_path / "allowed"
    elsewhere.mkdir()
    settings = replace(
        agent_settings(workspace, tmp_path / "data"), sandbox=SandboxSettings(write=(elsewhere,))
    )
    async with running(settings, connect=scripted.connect) as scripted_agent:
        await initialize(scripted_agent)
        attacks = [
            f"echo pwned > {outside}",
            f"echo pwned >> {outside}",
            f"echo pwned &> {outside}",
            f"echo pwned | tee -a {outside}",
            f"nohup echo pwned 2>&1 >| {outside}",
            "echo pwned > notes.txt",
            f"echo pwned > {scripted_agent.workspace}/../pwned",
        ]
        allowed = [
            "echo ok",
            "echo ok >/dev/null 2>&1",
            "echo ok > out/a.txt",
            f"echo ok | tee {elsewhere}/b.txt",
        ]
        commands = attacks + allowed
        scripted.script(tool_calls([("bash", {"command": c}) for c in commands]), text("done"))
        session_id = await new_session(scripted_agent)
        rules = ["Bash(echo:*)", "Bash(tee:*)", "Write", f"Write({elsewhere}/**)"]
        policy = pb.PermissionPolicy(
            enabled=True,
            allow=[pb.PermissionRule(rule=r) for r in rules[:2]],
            default_decision=pb.PERMISSION_DECISION_ASK,
        )
        await scripted_agent.stub.SetPermissionPolicy(
            pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy)
        )
        (scripted_agent.workspace / "out").mkdir()
        first = await scripted_agent.stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("go")])
        )
        results = [call.result for call in first.tool_calls]
        assert results[0].error.startswith("rejected by user"), results[0]
        assert not outside.exists() and not (scripted_agent.workspace / "notes.txt").exists()
        assert "ok" in results[len(attacks)].output and results[len(attacks) + 1].success  # echo itself runs
        assert [r.error.startswith("rejected by user") for r in results] == [True] * len(attacks) + [
            False
        ] * 2 + [True] * 2

        # A pattern-less Write covers the workspace, an absolute pattern the place it names.
        for rule in rules[2:]:
            await scripted_agent.stub.AddPermissionRule(
                pb.AddPermissionRuleRequest(session_id=session_id, rule_type="allow", rule=rule)
            )
        scripted.script(tool_calls([("bash", {"command": c}) for c in commands]), text("done"))
        second = await scripted_agent.stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("again")])
        )
        results = [call.result for call in second.tool_calls]
        assert [r.success for r in results] == [False] * 5 + [True] + [False] + [True] * 4
        assert not outside.exists() and not (tmp_path / "pwned").exists()
        assert (scripted_agent.workspace / "out" / "a.txt").read_text() == "ok\n"
        assert (elsewhere / "b.txt").read_text() == "ok\n"
        checked = await scripted_agent.stub.CheckPermission(
            pb.CheckPermissionRequest(
                session_id=session_id, tool_name="bash", arguments=json.dumps({"command": "echo x > out/y"})
            )
        )
        assert checked.decision == pb.PERMISSION_DECISION_ALLOW
        assert list(checked.matching_rules) == ["Bash(echo:*)", "Write"]


# --- lanes, external tasks, client tools, ask_user ------------------------------------------------


async def _pending_task(server: LiveServer, session_id: str) -> pb.ExternalTask:
    tasks: list[pb.ExternalTask] = []

    async def has_task() -> bool:
        reply = await server.stub.ListPendingExternalTasks(
            pb.ListPendingExternalTasksRequest(session_id=session_id)
        )
        tasks[:] = reply.tasks
        return bool(tasks)

    await eventually(has_task)
    return tasks[0]


async def test_an_external_lane_hands_calls_to_the_host(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(tool_call("bash", {"command": "make deploy"}), text("deployed"))
    session_id = await new_session(scripted_agent)
    config = pb.LaneHandlerConfig(mode=pb.TASK_HANDLER_MODE_EXTERNAL, timeout_ms=5000)
    await scripted_agent.stub.SetLaneHandler(
        pb.SetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_EXECUTE, config=config)
    )
    got = await scripted_agent.stub.GetLaneHandler(
        pb.GetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_EXECUTE)
    )
    assert got.config == config
    running_generation = generate(scripted_agent, session_id)
    task = await _pending_task(scripted_agent, session_id)
    assert task.command_type == "bash" and json.loads(task.payload) == {"command": "make deploy"}
    assert task.lane == pb.SESSION_LANE_EXECUTE and 0 < task.remaining_ms <= 5000
    await scripted_agent.stub.CompleteExternalTask(
        pb.CompleteExternalTaskRequest(
            session_id=session_id, task_id=task.task_id, success=True, result="deployed v2"
        )
    )
    reply = await running_generation
    assert reply.tool_calls[0].result.output == "deployed v2"
    assert scripted.requests[1].messages[-1]["content"] == "deployed v2"
    # A3S answers an unknown task in the reply, not with an error status (NOT_FOUND before issue
    # 18): the task completed already is unknown now, and the tool call's result stays the first.
    again = await scripted_agent.stub.CompleteExternalTask(
        pb.CompleteExternalTaskRequest(session_id=session_id, task_id=task.task_id, result="again")
    )
    assert not again.success and f"no pending external task {task.task_id!r}" in again.error


async def test_an_external_task_times_out(scripted_agent: LiveServer, scripted: ScriptedProvider) -> None:
    scripted.script(tool_call("bash", {"command": "true"}), text("ok"))
    session_id = await new_session(scripted_agent)
    config = pb.LaneHandlerConfig(mode=pb.TASK_HANDLER_MODE_EXTERNAL, timeout_ms=200)
    await scripted_agent.stub.SetLaneHandler(
        pb.SetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_EXECUTE, config=config)
    )
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("x")])
    )
    assert "did not complete bash within 200 ms" in reply.tool_calls[0].result.error


async def test_a_registered_client_tool_is_called_by_the_model_and_answered_by_the_host(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(tool_call("lookup_ticket", {"ticket": "OPS-7"}), text("the ticket is closed"))
    session_id = await new_session(scripted_agent)
    schema = {"type": "object", "properties": {"ticket": {"type": "string"}}, "required": ["ticket"]}
    await scripted_agent.stub.RegisterTool(
        pb.RegisterToolRequest(
            session_id=session_id,
            tool=pb.Tool(
                name="lookup_ticket", description="Look a ticket up.", parameters_schema=json.dumps(schema)
            ),
        )
    )
    running_generation = generate(scripted_agent, session_id)
    task = await _pending_task(scripted_agent, session_id)
    assert task.command_type == "lookup_ticket"
    await scripted_agent.stub.CompleteExternalTask(
        pb.CompleteExternalTaskRequest(
            session_id=session_id, task_id=task.task_id, success=True, result="closed"
        )
    )
    reply = await running_generation
    assert reply.tool_calls[0].result.output == "closed"
    offered = {t["function"]["name"]: t["function"] for t in scripted.requests[0].tools}
    assert offered["lookup_ticket"]["parameters"] == schema
    for bad in (
        pb.Tool(name="bash", parameters_schema="{}"),
        pb.Tool(name="x", parameters_schema='{"type": "nonsense"}'),
        pb.Tool(name="has space"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await scripted_agent.stub.RegisterTool(pb.RegisterToolRequest(session_id=session_id, tool=bad))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_ask_user_is_answered_by_the_host(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(
        tool_call("ask_user", {"question": "Ship it?", "options": ["yes", "no"]}), text("shipping")
    )
    session_id = await new_session(scripted_agent)
    running_generation = generate(scripted_agent, session_id)
    task = await _pending_task(scripted_agent, session_id)
    assert task.command_type == "ask_user" and json.loads(task.payload)["question"] == "Ship it?"
    await scripted_agent.stub.CompleteExternalTask(
        pb.CompleteExternalTaskRequest(
            session_id=session_id, task_id=task.task_id, success=True, result="yes"
        )
    )
    reply = await running_generation
    assert reply.tool_calls[0].result.output == "yes"


async def test_policies_and_lane_handlers_survive_a_restart(workspace: Path, tmp_path: Path) -> None:
    settings = agent_settings(workspace, tmp_path / "data")
    permission = pb.PermissionPolicy(enabled=True, deny=[pb.PermissionRule(rule="Edit")])
    confirmation = pb.ConfirmationPolicy(
        enabled=True, auto_approve_tools=["read_file"], default_timeout_ms=1234
    )
    lane = pb.LaneHandlerConfig(mode=pb.TASK_HANDLER_MODE_HYBRID, timeout_ms=999)
    async with running(settings) as first:
        session_id = await new_session(first)
        await first.stub.SetPermissionPolicy(
            pb.SetPermissionPolicyRequest(session_id=session_id, policy=permission)
        )
        await first.stub.SetConfirmationPolicy(
            pb.SetConfirmationPolicyRequest(session_id=session_id, policy=confirmation)
        )
        await first.stub.SetLaneHandler(
            pb.SetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_QUERY, config=lane)
        )
    async with running(settings) as second:
        got_permission = await second.stub.GetPermissionPolicy(
            pb.GetPermissionPolicyRequest(session_id=session_id)
        )
        got_confirmation = await second.stub.GetConfirmationPolicy(
            pb.GetConfirmationPolicyRequest(session_id=session_id)
        )
        got_lane = await second.stub.GetLaneHandler(
            pb.GetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_QUERY)
        )
    assert got_permission.policy.deny[0].rule == "Edit"
    assert got_confirmation.policy.auto_approve_tools == ["read_file"]
    assert got_confirmation.policy.default_timeout_ms == 1234
    assert got_lane.config == lane


async def test_unknown_sessions_are_not_found_for_control_rpcs(live: LiveServer) -> None:
    for call_ in (
        live.stub.Cancel(pb.CancelRequest(session_id="ghost")),
        live.stub.Pause(pb.PauseRequest(session_id="ghost")),
        live.stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id="ghost")),
        live.stub.ListPendingExternalTasks(pb.ListPendingExternalTasksRequest(session_id="ghost")),
        # An unknown id is answered in the reply (success=false), an unknown session is not.
        live.stub.ConfirmToolExecution(pb.ConfirmToolExecutionRequest(session_id="ghost", tool_id="t")),
        live.stub.CompleteExternalTask(pb.CompleteExternalTaskRequest(session_id="ghost", task_id="t")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call_
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
