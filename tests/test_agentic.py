"""A3S's server-side agentic loop and delegation (a3s-string-dialect.md 4.11) through the real server,
over gRPC with the later dialect's stubs and over HTTP `/rpc/<Method>` (SSE for the streaming two),
the in-process scripted model playing the parent, the children, the planner and the reviewer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import hang, text, tool_call

from .conftest import LiveServer, agent_settings, eventually, new_session, running
from .scripted_model import ScriptedProvider
from .test_http import serving, sse
from .test_subagents import Conversations, events_of, named

NOTES = "the meeting moved to Thursday\n"
TASK = "Read notes.txt and say what it holds"
PLAN = {
    "goal": "Summarise the notes",
    "complexity": "simple",
    "required_tools": ["read_file"],
    "steps": [
        {"id": "read", "description": "Read notes.txt", "tool": "read_file", "dependencies": []},
        {"id": "answer", "description": "Say what it holds", "dependencies": ["read"]},
    ],
}


@pytest.fixture
def stub(scripted_agent: LiveServer) -> later_grpc.CodeAgentServiceStub:
    return later_grpc.CodeAgentServiceStub(scripted_agent.channel)


def explore_reads_the_notes(scripted: ScriptedProvider, workspace: Path) -> None:
    (workspace / "notes.txt").write_text(NOTES)
    scripted.script(tool_call("read_file", {"path": "notes.txt"}, id="r1"), text("It says: Thursday."))


async def error_of(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def drained(stream: Any) -> list[later.AgenticGenerateEvent]:
    async with asyncio.timeout(20):
        return [event async for event in stream]


def kinds(events: list[Any]) -> list[str]:
    """The events' types, a run of `text` events as one."""
    types = [e.type if isinstance(e, later.AgenticGenerateEvent) else e["type"] for e in events]
    return [kind for n, kind in enumerate(types) if not (kind == "text" and n and types[n - 1] == "text")]


def as_json(message: Any) -> dict[str, Any]:
    """A gRPC message as the HTTP face writes it."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


# --- Delegate ----------------------------------------------------------------------------------


async def test_delegate_sends_explore_to_read_a_file_and_answers_with_its_answer(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    explore_reads_the_notes(scripted, scripted_agent.workspace)
    parent = await new_session(scripted_agent)
    reply = await stub.Delegate(later.DelegateRequest(session_id=parent, agent_name="explore", task=TASK))
    assert (reply.session_id, reply.text, reply.finish_reason) == (parent, "It says: Thursday.", "stop")
    assert reply.agent_session_id.startswith(f"{parent}.")
    first, last = reply.steps
    assert (first.step_index, [c.name for c in first.tool_calls]) == (1, ["read_file"])
    assert NOTES.strip() in first.tool_results[0].output and first.tool_results[0].success
    assert (last.step_index, last.text, list(last.tool_calls)) == (2, "It says: Thursday.", [])
    assert [(c.name, NOTES.strip() in c.result.output) for c in reply.tool_calls] == [("read_file", True)]
    assert reply.usage.total_tokens == first.usage.total_tokens + last.usage.total_tokens > 0
    # The child is a session of its own, below the parent; the parent's context got nothing.
    child = await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=reply.agent_session_id))
    assert child.session.config.name == "explore"
    assert [m["role"] for m in scripted.requests[0].messages] == ["system", "user"]
    assert scripted.requests[0].messages[1]["content"] == TASK
    assert "write_file" not in {t["function"]["name"] for t in scripted.requests[0].tools}
    history = await stub.GetMessages(later.GetMessagesRequest(session_id=parent))
    assert history.total_count == 0
    capabilities = await scripted_agent.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert "agentic" in capabilities.features


async def test_stream_delegate_tells_the_childs_steps_in_order_over_grpc_and_sse(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    explore_reads_the_notes(scripted, scripted_agent.workspace)
    parent = await new_session(scripted_agent)
    request = later.DelegateRequest(session_id=parent, agent_name="explore", task=TASK)
    events = await drained(stub.StreamDelegate(request))
    assert kinds(events) == [
        "subagent_start", "subagent_progress", "tool_call", "step_finish", "subagent_progress",
        "tool_result", "text", "step_finish", "subagent_end", "done",
    ]  # fmt: skip
    child = events[0].agent_session_id
    assert child.startswith(f"{parent}.")
    assert all(e.session_id == parent and e.agent_session_id == child for e in events)
    start, end, done = events[0], events[-2], events[-1]
    assert (start.agent_name, start.agent_task) == ("explore", "")
    call = next(e for e in events if e.type == "tool_call")
    assert (call.tool_name, json.loads(call.tool_args)) == ("read_file", {"path": "notes.txt"})
    result = next(e for e in events if e.type == "tool_result")
    assert result.tool_call_id == call.tool_call_id and NOTES.strip() in result.tool_result.output
    steps = [(e.step_index, e.step_text) for e in events if e.type == "step_finish"]
    assert steps == [(1, ""), (2, "It says: Thursday.")]
    assert (end.agent_result, end.finish_reason) == ("It says: Thursday.", "stop")
    assert (done.content, done.finish_reason, done.usage.total_tokens > 0) == (
        "It says: Thursday.",
        "stop",
        True,
    )

    # The same events over HTTP as server-sent events, in the same JSON a gRPC client would see.
    explore_reads_the_notes(scripted, scripted_agent.workspace)
    async with serving(scripted_agent) as http:
        body = {"session_id": parent, "agent_name": "explore", "task": TASK}
        async with http.client.post("/rpc/StreamDelegate", json=body) as response:
            over_http = await sse(response)
    assert over_http[-1] == ("done", {})
    replies = [data for kind, data in over_http if kind == "message"]
    assert kinds(replies) == kinds(events)
    other_child = replies[0]["agent_session_id"]
    assert other_child != child and other_child.startswith(f"{parent}.")
    by_grpc = [{**as_json(e), "agent_session_id": other_child} for e in events]
    for got, want in zip(replies, by_grpc, strict=True):
        got, want = dict(got), dict(want)
        for key in ("usage", "tool_call_id", "tool_call", "tool_result"):  # ids and counts differ per run
            got.pop(key, None), want.pop(key, None)
        assert got == want


async def test_stream_delegate_tells_a_confirmation_and_an_external_task_and_their_answers(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    """The child's write needs a confirmation and then runs on the host (an external lane): the
    stream says so as each happens, the client answers with the parent's session id."""
    scripted.script(tool_call("write_file", {"path": "c.txt", "content": "x"}), text("written"))
    parent = await new_session(scripted_agent)
    policy = pb.ConfirmationPolicy(
        enabled=True, require_confirm_tools=["write_file"], default_timeout_ms=10_000,
        timeout_action=pb.TIMEOUT_ACTION_REJECT,
    )  # fmt: skip
    await scripted_agent.stub.SetConfirmationPolicy(
        pb.SetConfirmationPolicyRequest(session_id=parent, policy=policy)
    )
    lane = pb.LaneHandlerConfig(mode=pb.TASK_HANDLER_MODE_EXTERNAL, timeout_ms=10_000)
    await scripted_agent.stub.SetLaneHandler(
        pb.SetLaneHandlerRequest(session_id=parent, lane=pb.SESSION_LANE_EXECUTE, config=lane)
    )
    request = later.DelegateRequest(session_id=parent, agent_name="general", task="Write c.txt")
    seen: list[later.AgenticGenerateEvent] = []
    async with asyncio.timeout(20):
        async for event in stub.StreamDelegate(request):
            seen.append(event)
            if event.type == "confirmation_required":
                answer = pb.ConfirmToolExecutionRequest(
                    session_id=parent, tool_id=event.confirmation_id, approved=True
                )
                assert (await scripted_agent.stub.ConfirmToolExecution(answer)).success
            elif event.type == "external_task_pending":
                done = pb.CompleteExternalTaskRequest(
                    session_id=parent,
                    task_id=event.external_task.task_id,
                    success=True,
                    result="written on the host",
                )
                assert (await scripted_agent.stub.CompleteExternalTask(done)).success
    types = [e.type for e in seen]
    order = ["confirmation_required", "confirmation_received", "external_task_pending", "done"]
    assert [t for t in types if t in order] == order, types
    assert "external_task_completed" in types, types
    child = seen[0].agent_session_id
    asked, answered, pending = (seen[types.index(t)] for t in order[:3])
    assert (asked.tool_name, json.loads(asked.tool_args)["path"], asked.timeout_ms) == (
        "write_file",
        "c.txt",
        10_000,
    )
    assert (answered.confirmation_id, answered.approved, answered.agent_session_id) == (
        asked.confirmation_id,
        True,
        child,
    )
    task = pending.external_task
    assert (task.session_id, task.command_type, task.lane) == (
        child,
        "write_file",
        later.SESSION_LANE_EXECUTE,
    )
    completed = seen[types.index("external_task_completed")].external_task
    assert (completed.task_id, completed.session_id) == (task.task_id, child)
    result = next(e for e in seen if e.type == "tool_result")
    assert result.tool_result.output == "written on the host"
    assert not (scripted_agent.workspace / "c.txt").exists()  # the host ran it, not the server
    assert (seen[-1].content, seen[-1].finish_reason) == ("written", "stop")


# --- AgenticGenerate ------------------------------------------------------------------------------


async def test_agentic_generate_stops_at_max_steps(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    (scripted_agent.workspace / "notes.txt").write_text(NOTES)
    scripted.fallback = tool_call("read_file", {"path": "notes.txt"})  # it never stops by itself
    session_id = await new_session(scripted_agent)
    request = later.AgenticGenerateRequest(
        session_id=session_id, prompt="Read it again and again", max_steps=3
    )
    reply = await stub.AgenticGenerate(request)
    assert reply.finish_reason == "max_steps"
    assert [s.step_index for s in reply.steps] == [1, 2, 3] and len(reply.tool_calls) == 3
    assert all(NOTES.strip() in c.result.output for c in reply.tool_calls)
    assert "limit (3) was reached" in reply.text
    assert len(scripted.requests) == 3 and not reply.HasField("plan")
    # over HTTP too, the same outcome
    async with serving(scripted_agent) as http:
        body = {"session_id": session_id, "prompt": "Once more", "max_steps": 1}
        async with http.client.post("/rpc/AgenticGenerate", json=body) as response:
            assert response.status == 200
            over_http = await response.json()
    assert (over_http["finish_reason"], len(over_http["steps"])) == ("max_steps", 1)
    assert "plan" not in over_http  # (an optional field left unset)


async def test_a_plan_first_and_a_reflection_after_the_run(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    (scripted_agent.workspace / "notes.txt").write_text(NOTES)
    check = {"achieved": False, "progress": 0.5, "remaining_criteria": ["the answer names the day"]}
    scripted.script(
        text(json.dumps(PLAN)),
        tool_call("read_file", {"path": "notes.txt"}),
        text("Read it."),
        text(json.dumps(check)),
    )
    session_id = await new_session(scripted_agent)
    request = later.AgenticGenerateRequest(
        session_id=session_id, prompt="Summarise notes.txt", planning=True, reflection=True
    )
    events = await drained(stub.StreamAgenticGenerate(request))
    assert kinds(events) == [
        "plan", "tool_call", "step_finish", "tool_result", "text", "step_finish", "reflection", "done",
    ]  # fmt: skip
    plan = events[0].plan
    assert (plan.goal, [s.id for s in plan.steps]) == ("Summarise the notes", ["read", "answer"])
    reflection = events[-2]
    assert (reflection.confidence, reflection.should_retry) == (0.5, True)
    assert "the answer names the day" in reflection.insight
    assert (events[-1].finish_reason, events[-1].content) == ("stop", "Read it.")
    # The model ran the plan it was given; the plan is the session's, its steps the todo list.
    prompt = scripted.requests[1].messages[-1]["content"]
    assert prompt.startswith("Summarise notes.txt") and "[read] Read notes.txt" in prompt
    todos = await stub.GetTodos(later.GetTodosRequest(session_id=session_id))
    assert [t.id for t in todos.todos] == ["read", "answer"]
    # The reviewer judged the run's outcome against the prompt.
    judged = json.dumps(scripted.requests[3].messages)
    assert "Summarise notes.txt" in judged and "Read it." in judged
    # Unary: the plan is in the reply; a strategy of PLANNED asks for one as planning does.
    scripted.script(text(json.dumps(PLAN)), text("Done."))
    planned = later.AgenticGenerateRequest(
        session_id=session_id, prompt="Again", strategy=later.AGENTIC_STRATEGY_PLANNED
    )
    reply = await stub.AgenticGenerate(planned)
    assert (reply.plan.goal, reply.text, reply.finish_reason) == ("Summarise the notes", "Done.", "stop")


async def test_a_child_the_model_starts_is_told_in_the_agentic_stream(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    (scripted_agent.workspace / "notes.txt").write_text(NOTES)
    scripted.fallback = Conversations(
        go=[tool_call("task", {"agent": "explore", "description": "read", "prompt": TASK}, id="t1"),
            text("The notes say Thursday.")],
        **{TASK: [tool_call("read_file", {"path": "notes.txt"}), text("Thursday.")]},
    )  # fmt: skip
    session_id = await new_session(scripted_agent)
    events = await drained(
        stub.StreamAgenticGenerate(later.AgenticGenerateRequest(session_id=session_id, prompt="go"))
    )
    assert kinds(events) == [
        "tool_call", "step_finish", "subagent_start", "subagent_progress", "subagent_progress", "subagent_end",
        "tool_result", "text", "step_finish", "done",
    ]  # fmt: skip
    told = [e for e in events if e.type.startswith("subagent_")]
    child = told[0].agent_session_id
    assert child == f"{session_id}.t1" and all(e.agent_session_id == child for e in told)
    assert (told[0].agent_name, told[0].agent_task, told[0].tool_call_id) == ("explore", "read", "t1")
    assert [e.tool_name for e in told[1:3]] == ["read_file", "read_file"]
    assert not any(e.HasField("agent_session_id") for e in events if not e.type.startswith("subagent_"))
    result = next(e for e in events if e.type == "tool_result")
    assert (result.tool_name, result.tool_result.output) == ("task", "Thursday.")
    assert events[-1].content == "The notes say Thursday."


async def test_cancel_during_the_stream_ends_it_cancelled(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    (scripted_agent.workspace / "notes.txt").write_text(NOTES)
    scripted.script(tool_call("read_file", {"path": "notes.txt"}), hang())
    session_id = await new_session(scripted_agent)
    stream = stub.StreamAgenticGenerate(later.AgenticGenerateRequest(session_id=session_id, prompt="Read"))
    seen: list[later.AgenticGenerateEvent] = []
    async with asyncio.timeout(20):
        async for event in stream:
            seen.append(event)
            if event.type == "tool_result":  # the second model call is under way (and hangs)
                await eventually(lambda: len(scripted.requests) == 2, "the second model call")
                assert (await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    assert kinds(seen) == ["tool_call", "step_finish", "tool_result", "done"]
    assert seen[-1].finish_reason == "cancelled"


async def test_cancel_during_an_sse_stream_ends_it_cancelled(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(hang())
    session_id = await new_session(scripted_agent)
    async with serving(scripted_agent) as http:

        async def cancel() -> None:
            await eventually(lambda: len(scripted.requests) == 1, "the model call")
            await http.client.post("/rpc/Cancel", json={"session_id": session_id})

        body = {"session_id": session_id, "prompt": "Wait"}
        async with asyncio.timeout(20), asyncio.TaskGroup() as group:
            group.create_task(cancel())
            async with http.client.post("/rpc/StreamAgenticGenerate", json=body) as response:
                events = await sse(response)
    done = [data for kind, data in events if kind == "message"][-1]
    assert (done["type"], done["finish_reason"]) == ("done", "cancelled")


async def test_stream_delegate_stops_with_cancel_and_with_its_client(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    scripted.script(hang(), hang())
    parent = await new_session(scripted_agent)
    request = later.DelegateRequest(session_id=parent, agent_name="explore", task="Wait")
    seen: list[later.AgenticGenerateEvent] = []
    async with asyncio.timeout(20):
        async for event in stub.StreamDelegate(request):
            seen.append(event)
            if event.type == "subagent_start":
                await eventually(lambda: len(scripted.requests) == 1, "the child's model call")
                assert (await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=parent))).success
    assert kinds(seen) == ["subagent_start", "done"] and seen[-1].finish_reason == "cancelled"
    # A client that goes away stops its child: the parent's log tells the child's end.
    stream = stub.StreamDelegate(request)
    async with asyncio.timeout(20):
        async for event in stream:
            if event.type == "subagent_start":
                await eventually(lambda: len(scripted.requests) == 2, "the second child's model call")
                stream.cancel()
                break
    ends = await events_of(scripted_agent, parent, lambda events: len(named(events, "subagent_end")) == 2)
    assert [e.data["finish_reason"] for e in named(ends, "subagent_end")] == ["cancelled", "cancelled"]


# --- bad input ----------------------------------------------------------------------------------


async def test_bad_requests_get_clear_errors_over_grpc_and_http(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    session_id = await new_session(scripted_agent)
    cases: list[tuple[str, Any, grpc.StatusCode, str]] = [
        ("Delegate", later.DelegateRequest(session_id="nope", agent_name="explore", task="x"),
         grpc.StatusCode.NOT_FOUND, "nope"),
        ("Delegate", later.DelegateRequest(session_id=session_id, agent_name="nobody", task="x"),
         grpc.StatusCode.NOT_FOUND, "nobody"),
        ("Delegate", later.DelegateRequest(session_id=session_id, agent_name="../../etc/passwd", task="x"),
         grpc.StatusCode.NOT_FOUND, "etc/passwd"),
        ("Delegate", later.DelegateRequest(session_id=session_id, agent_name="explore", task=" "),
         grpc.StatusCode.INVALID_ARGUMENT, "task is required"),
        ("Delegate", later.DelegateRequest(session_id=session_id, agent_name="explore", task="x", max_steps=501),
         grpc.StatusCode.INVALID_ARGUMENT, "max_steps"),
        ("AgenticGenerate", later.AgenticGenerateRequest(session_id="nope", prompt="x"),
         grpc.StatusCode.NOT_FOUND, "nope"),
        ("AgenticGenerate", later.AgenticGenerateRequest(session_id=session_id, prompt=""),
         grpc.StatusCode.INVALID_ARGUMENT, "prompt is required"),
        ("AgenticGenerate", later.AgenticGenerateRequest(session_id=session_id, prompt="x", max_steps=10**6),
         grpc.StatusCode.INVALID_ARGUMENT, "max_steps"),
    ]  # fmt: skip
    statuses = {grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.INVALID_ARGUMENT: 400}
    async with serving(scripted_agent) as http:
        for name, request, code, words in cases:
            for method in (name, f"Stream{name}"):
                call = getattr(stub, method)(request)
                error = await error_of(drained(call) if method.startswith("Stream") else call)
                assert (error.code(), words in (error.details() or "")) == (code, True), (method, error)
                body = json_format.MessageToDict(request, preserving_proto_field_name=True)
                async with http.client.post(f"/rpc/{method}", json=body) as response:
                    refused = await response.json()
                assert response.status == statuses[code], refused
                assert refused["error"]["message"] == error.details()
    assert scripted.requests == []  # nothing reached the model


async def test_allowed_tools_narrow_an_agents_tools_and_never_widen_them(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    """`explore` is read-only: naming write_file in allowed_tools does not give it write_file."""
    (scripted_agent.workspace / "notes.txt").write_text(NOTES)
    scripted.script(tool_call("write_file", {"path": "w.txt", "content": "x"}), text("could not"))
    parent = await new_session(scripted_agent)
    request = later.DelegateRequest(
        session_id=parent, agent_name="explore", task="Write w.txt", allowed_tools=["write_file", "read_file"]
    )
    reply = await stub.Delegate(request)
    offered = {t["function"]["name"] for t in scripted.requests[0].tools}
    assert offered == {"read_file"}
    (call,) = reply.tool_calls
    assert (call.name, call.result.success) == ("write_file", False) and "not available" in call.result.error
    assert not (scripted_agent.workspace / "w.txt").exists()


async def test_a_child_may_not_delegate_past_the_depth_limit(
    scripted_agent: LiveServer, scripted: ScriptedProvider, stub: later_grpc.CodeAgentServiceStub
) -> None:
    explore_reads_the_notes(scripted, scripted_agent.workspace)
    parent = await new_session(scripted_agent)
    reply = await stub.Delegate(later.DelegateRequest(session_id=parent, agent_name="explore", task=TASK))
    deeper = later.DelegateRequest(session_id=reply.agent_session_id, agent_name="explore", task=TASK)
    error = await error_of(stub.Delegate(deeper))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "A3S_SUBAGENT_DEPTH" in (error.details() or "")


async def test_without_a_model_both_faces_say_what_to_configure(workspace: Path, tmp_path: Path) -> None:
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        stub = later_grpc.CodeAgentServiceStub(live.channel)
        session_id = await new_session(live)
        for call in (
            stub.Delegate(later.DelegateRequest(session_id=session_id, agent_name="explore", task="x")),
            stub.AgenticGenerate(later.AgenticGenerateRequest(session_id=session_id, prompt="x")),
            stub.AgenticGenerate(
                later.AgenticGenerateRequest(session_id=session_id, prompt="x", planning=True)
            ),
            drained(
                stub.StreamDelegate(later.DelegateRequest(session_id=session_id, agent_name="plan", task="x"))
            ),
        ):
            error = await error_of(call)
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "A3S_LLM_MODEL" in (error.details() or ""), error.details()
        async with serving(live) as http:
            for method, body in (
                ("StreamAgenticGenerate", {"session_id": session_id, "prompt": "x"}),
                ("Delegate", {"session_id": session_id, "agent_name": "general", "task": "x"}),
            ):
                async with http.client.post(f"/rpc/{method}", json=body) as response:
                    refused = await response.json()
                assert (response.status, refused["error"]["code"]) == (409, "FAILED_PRECONDITION"), refused
                assert "A3S_LLM_MODEL" in refused["error"]["message"]
