"""Subagents through the real server and the in-process scripted model, which plays the parent
and each child from a script of its own: the `task` tool, the children's sessions, their tools,
their events in the parent's log, and the parent's control reaching them."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.app import Application
from a3s_agent.app.subagents import ParentLink
from a3s_agent.app.types import DoneEvent, NoticeEvent
from a3s_agent.base.errors import InvalidArgument, NotFound
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, call, text, tool_call, tool_calls

from .conftest import (
    LiveServer,
    agent_settings,
    alive,
    eventually,
    host_pid,
    initialize,
    new_session,
    running,
    user,
)
from .fault.conftest import LoggedServer
from .scripted_model import ScriptedProvider, ScriptedTurn

AFTER = "a3s-after-seq"
CHUNK = pb.GenerateChunk


class Conversations:
    """The scripted model's turns per conversation, told apart by the first user message (the
    parent's request, each child's task prompt): children run at once, in any order."""

    def __init__(self, **scripts: Sequence[Any]) -> None:
        self.scripts = {key: deque(turns) for key, turns in scripts.items()}

    def __call__(self, body: dict[str, Any]) -> Any:
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        script = self.scripts.get(first)
        if not script:
            raise AssertionError(f"no turn left for the conversation that starts {first!r}")
        return script.popleft()


def task(agent: str, prompt: str, id: str, description: str = "look") -> Any:
    return call("task", {"agent": agent, "description": description, "prompt": prompt}, id=id)


def meeting(count: int) -> Callable[[ScriptedTurn], Callable[[dict[str, Any]], Any]]:
    """A turn that is played once `count` conversations have reached theirs: the children
    asking at the same time, which only children running at once do (bounded: a child left
    waiting alone fails the test)."""
    arrived: list[None] = []
    everyone = asyncio.Event()

    def turn(then: ScriptedTurn) -> Callable[[dict[str, Any]], Any]:
        async def held(_body: dict[str, Any]) -> ScriptedTurn:
            arrived.append(None)
            if len(arrived) == count:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 10)
            return then

        return held

    return turn


async def events_of(
    server: LiveServer, session_id: str, until: Callable[[list[pb.AgentEvent]], bool]
) -> list[pb.AgentEvent]:
    """The session's events from the start of its log, read until `until` holds of them."""
    stream = server.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id), metadata=((AFTER, "0"),)
    )
    seen: list[pb.AgentEvent] = []
    try:
        async with asyncio.timeout(10):
            async for event in stream:
                seen.append(event)
                if until(seen):
                    return seen
    finally:
        stream.cancel()
    raise AssertionError(f"the events ended before the condition held: {seen}")


def named(events: list[pb.AgentEvent], message: str) -> list[pb.AgentEvent]:
    return [e for e in events if e.type == pb.AgentEvent.EVENT_TYPE_INFO and e.message == message]


async def test_two_children_read_files_at_once_and_only_their_answers_reach_the_parent(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    (scripted_agent.workspace / "a.txt").write_text("alpha-file-body\n")
    (scripted_agent.workspace / "b.txt").write_text("beta-file-body\n")
    together = meeting(2)
    scripted.fallback = Conversations(
        go=[
            tool_calls([task("explore", "Read a.txt", "call_a"), task("explore", "Read b.txt", "call_b")]),
            text("both children answered"),
        ],
        **{
            "Read a.txt": [together(tool_call("read_file", {"path": "a.txt"})), text("a.txt says alpha")],
            "Read b.txt": [together(tool_call("read_file", {"path": "b.txt"})), text("b.txt says beta")],
        },
    )
    session_id = await new_session(scripted_agent)

    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )

    assert reply.message.content == "both children answered"
    assert [c.name for c in reply.tool_calls] == ["task", "task"]  # ordinary tool calls to a Box client
    assert [c.result.output for c in reply.tool_calls] == ["a.txt says alpha", "b.txt says beta"]
    parents = [r for r in scripted.requests if r.body["session_id"] == session_id]
    assert len(parents) == 2
    sent = json.dumps(parents[-1].messages)
    assert "a.txt says alpha" in sent and "b.txt says beta" in sent
    assert "file-body" not in sent  # what the children read stayed in their context
    children = {c.result.metadata["child_session_id"] for c in reply.tool_calls}
    assert children == {f"{session_id}.call_a", f"{session_id}.call_b"}
    child_requests = [r for r in scripted.requests if r.body["session_id"] in children]
    assert {"alpha-file-body" in json.dumps(r.messages) for r in child_requests} == {True, False}
    # Each child had the read-only tools and no task (depth 1), and its own system prompt.
    offered = {t["function"]["name"] for t in child_requests[0].tools}
    assert "read_file" in offered and "grep" in offered
    assert not offered & {"write_file", "bash", "edit_file", "task"}
    assert child_requests[0].messages[0]["content"].startswith("You are a subagent exploring")

    # The children are sessions of their own: GetSession, and their history with GetMessages.
    stub = later_grpc.CodeAgentServiceStub(scripted_agent.channel)
    for child in children:
        got = await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=child))
        assert got.session.config.name == "explore: look"
        history = await stub.GetMessages(later.GetMessagesRequest(session_id=child))
        assert history.messages[0].role == "user" and history.total_count == 4
    # Usage and cost per child and in total: the parent's summary holds its children's model calls.
    parent_cost = await stub.GetCostSummary(later.GetCostSummaryRequest(session_id=session_id))
    child_costs = [await stub.GetCostSummary(later.GetCostSummaryRequest(session_id=c)) for c in children]
    assert [c.call_count for c in child_costs] == [2, 2] and parent_cost.call_count == 6
    assert parent_cost.total_tokens > sum(c.total_tokens for c in child_costs) > 0
    tools = await stub.GetToolMetrics(later.GetToolMetricsRequest(session_id=session_id))
    assert {t.tool_name: t.total_calls for t in tools.tools} == {"task": 2, "read_file": 2}
    # A client following the parent sees each child start, work and end, by its session id.
    events = await events_of(scripted_agent, session_id, lambda seen: len(named(seen, "subagent_end")) == 2)
    for child in children:
        mine = [e for e in events if e.data.get("child_session_id") == child]
        assert [e.message for e in mine] == [
            "subagent_start",
            "subagent_progress",
            "subagent_progress",
            "subagent_end",
        ]
        assert mine[1].data["tool_name"] == "read_file" and mine[2].data["tool_success"] == "true"
        assert mine[-1].data["finish_reason"] == "stop" and mine[-1].data["agent"] == "explore"
        assert int(mine[-1].data["prompt_tokens"]) > 0


async def test_a_read_only_child_is_refused_write_file(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.fallback = Conversations(
        go=[
            tool_call("task", {"agent": "explore", "description": "x", "prompt": "Write x"}, id="c1"),
            text("ok"),
        ],
        **{"Write x": [tool_call("write_file", {"path": "x.txt", "content": "no"}), text("could not write")]},
    )
    session_id = await new_session(scripted_agent)

    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )

    assert reply.tool_calls[0].result.output == "could not write"
    assert not (scripted_agent.workspace / "x.txt").exists()
    child_last = [r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c1"][-1]
    refusal = child_last.messages[-1]
    assert refusal["role"] == "tool" and "not available" in refusal["content"]


async def test_permission_rules_govern_task_by_its_agent_and_bind_the_children(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.fallback = Conversations(
        go=[tool_calls([task("plan", "Plan", "c1"), task("general", "Run", "c2")]), "ok"],
        Run=[tool_call("bash", {"command": "touch ran"}), "could not run"],
    )
    session_id = await new_session(scripted_agent)
    rules = [pb.PermissionRule(rule="task(plan)"), pb.PermissionRule(rule="bash")]
    await scripted_agent.stub.SetPermissionPolicy(
        pb.SetPermissionPolicyRequest(
            session_id=session_id, policy=pb.PermissionPolicy(enabled=True, deny=rules)
        )
    )

    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )

    planned, ran = (c.result for c in reply.tool_calls)
    assert planned.error == "denied by policy: task(plan)"
    assert ran.output == "could not run" and not (scripted_agent.workspace / "ran").exists()
    child_last = [r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c2"][-1]
    assert "denied by policy: bash" in child_last.messages[-1]["content"]


async def test_the_depth_limit_keeps_a_child_from_starting_children(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.fallback = Conversations(
        go=[
            tool_call("task", {"agent": "general", "description": "x", "prompt": "Nest"}, id="c1"),
            text("ok"),
        ],
        Nest=[
            tool_call("task", {"agent": "general", "description": "y", "prompt": "Deeper"}, id="c2"),
            text("no"),
        ],
    )
    session_id = await new_session(scripted_agent)

    await scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))

    child = f"{session_id}.c1"
    child_requests = [r for r in scripted.requests if r.body["session_id"] == child]
    assert "task" not in {t["function"]["name"] for t in child_requests[0].tools}
    assert "not available" in child_requests[-1].messages[-1]["content"]
    listed = await scripted_agent.stub.ListSessions(pb.ListSessionsRequest())
    assert {s.session_id for s in listed.sessions} == {session_id, child}  # no grandchild


# --- control reaches the children ------------------------------------------------------------


async def test_cancel_during_two_children_kills_both_childrens_processes(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    markers = [scripted_agent.workspace / f"pid-{name}" for name in "ab"]
    scripted.fallback = Conversations(
        go=[tool_calls([task("general", "Sleep a", "call_a"), task("general", "Sleep b", "call_b")])],
        **{
            f"Sleep {marker.name[-1]}": [tool_call("bash", {"command": f"echo $$ > {marker}; sleep 60"})]
            for marker in markers
        },
    )
    session_id = await new_session(scripted_agent)
    generation = asyncio.ensure_future(
        scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
    )
    await eventually(
        lambda: all(m.exists() and m.read_text().strip() for m in markers), "both children sleep"
    )
    pids = [host_pid(int(m.read_text())) for m in markers]
    assert all(alive(pid) for pid in pids)

    assert (await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generation
    assert err.value.code() == grpc.StatusCode.CANCELLED
    await eventually(lambda: not any(alive(pid) for pid in pids), "both children's sleep processes end")
    events = await events_of(scripted_agent, session_id, lambda seen: len(named(seen, "subagent_end")) == 2)
    assert {e.data["finish_reason"] for e in named(events, "subagent_end")} == {"cancelled"}
    # Every history is one a strict provider takes: the parent's and the children's calls are answered.
    for session in (session_id, f"{session_id}.call_a", f"{session_id}.call_b"):
        history = await scripted_agent.runtime.sessions.history(session)
        calls = {c.id for m in history for c in m.tool_calls}
        assert calls == {m.tool_call_id for m in history if m.role == "tool"}, session


async def test_a_childs_confirmation_reaches_the_parents_client_and_is_answered(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.fallback = Conversations(
        go=[
            tool_call("task", {"agent": "general", "description": "w", "prompt": "Write"}, id="c1"),
            text("done"),
        ],
        Write=[tool_call("write_file", {"path": "c.txt", "content": "x"}), text("written")],
    )
    session_id = await new_session(scripted_agent)
    policy = pb.ConfirmationPolicy(
        enabled=True, require_confirm_tools=["write_file"], default_timeout_ms=10_000,
        timeout_action=pb.TIMEOUT_ACTION_REJECT,
    )  # fmt: skip
    await scripted_agent.stub.SetConfirmationPolicy(
        pb.SetConfirmationPolicyRequest(session_id=session_id, policy=policy)
    )
    stream = scripted_agent.stub.StreamGenerate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )
    notices: list[pb.GenerateChunk] = []
    async for chunk in stream:
        if chunk.type == CHUNK.CHUNK_TYPE_METADATA and "child_session_id" in chunk.metadata:
            notices.append(chunk)
        if chunk.metadata.get("type") == "confirmation_required":
            break
    child = f"{session_id}.c1"
    # The parent's stream says the child started and what it does, as the parent's log does.
    assert [(n.metadata["type"], n.metadata["child_session_id"]) for n in notices] == [
        ("subagent_start", child),
        ("subagent_progress", child),
        ("confirmation_required", child),
    ]
    asked = notices[-1]
    assert asked.metadata["child_session_id"] == child and asked.metadata["tool_name"] == "write_file"
    assert not (scripted_agent.workspace / "c.txt").exists()
    events = await events_of(
        scripted_agent, session_id,
        lambda seen: any(e.type == pb.AgentEvent.EVENT_TYPE_CONFIRMATION_REQUIRED for e in seen),
    )  # fmt: skip
    required = [e for e in events if e.type == pb.AgentEvent.EVENT_TYPE_CONFIRMATION_REQUIRED]
    assert required[0].data["child_session_id"] == child

    # The parent's client answers with the parent's session id.
    reply = await scripted_agent.stub.ConfirmToolExecution(
        pb.ConfirmToolExecutionRequest(
            session_id=session_id, tool_id=asked.metadata["tool_id"], approved=True
        )
    )
    assert reply.success, reply.error
    rest = [c async for c in stream]
    results = [c for c in rest if c.type == CHUNK.CHUNK_TYPE_TOOL_RESULT]
    assert [r.tool_result.output for r in results] == ["written"]
    ended = [c.metadata for c in rest if c.metadata.get("type") == "subagent_end"]
    assert len(ended) == 1 and ended[0]["finish_reason"] == "stop" and ended[0]["child_session_id"] == child
    assert (scripted_agent.workspace / "c.txt").read_text() == "x"


async def test_a_childs_question_reaches_the_parents_host_and_is_answered(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.fallback = Conversations(
        go=[tool_call("task", {"agent": "general", "description": "q", "prompt": "Ask"}, id="c1"), "done"],
        Ask=[tool_call("ask_user", {"question": "Which colour?"}), "the user said blue"],
    )
    session_id = await new_session(scripted_agent)
    generation = asyncio.ensure_future(
        scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
    )

    async def pending() -> list[pb.ExternalTask]:
        listed = pb.ListPendingExternalTasksRequest(session_id=session_id)  # the parent's
        return list((await scripted_agent.stub.ListPendingExternalTasks(listed)).tasks)

    asked = (await eventually(pending, "the child's question is listed under its parent"))[0]
    assert asked.command_type == "ask_user" and asked.session_id == f"{session_id}.c1"
    events = await events_of(
        scripted_agent, session_id,
        lambda seen: any(e.type == pb.AgentEvent.EVENT_TYPE_EXTERNAL_TASK_PENDING for e in seen),
    )  # fmt: skip
    pending_event = next(e for e in events if e.type == pb.AgentEvent.EVENT_TYPE_EXTERNAL_TASK_PENDING)
    assert pending_event.data["child_session_id"] == f"{session_id}.c1"
    await scripted_agent.stub.CompleteExternalTask(
        pb.CompleteExternalTaskRequest(
            session_id=session_id, task_id=asked.task_id, success=True, result="blue"
        )
    )
    reply = await generation
    assert reply.tool_calls[0].result.output == "the user said blue"
    child_last = [r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c1"][-1]
    assert child_last.messages[-1]["content"] == "blue"
    events = await events_of(  # the parent's clients see it answered too, not only asked
        scripted_agent, session_id,
        lambda seen: any(e.type == pb.AgentEvent.EVENT_TYPE_EXTERNAL_TASK_COMPLETED for e in seen),
    )  # fmt: skip
    done = next(e for e in events if e.type == pb.AgentEvent.EVENT_TYPE_EXTERNAL_TASK_COMPLETED)
    assert (done.data["task_id"], done.data["child_session_id"]) == (asked.task_id, f"{session_id}.c1")


async def test_the_parents_token_budget_covers_its_children(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    (scripted_agent.workspace / "notes.txt").write_text("notes\n")
    scripted.fallback = Conversations(
        go=[
            tool_call("task", {"agent": "explore", "description": "l", "prompt": "Loop"}, id="c1"),
            text("no"),
        ],
        Loop=[tool_call("read_file", {"path": "notes.txt"})] * 40,
    )
    call = scripted_agent.stub.CreateSession(
        pb.CreateSessionRequest(), metadata=(("a3s-token-budget", "8000"),)
    )
    session_id = (await call).session_id

    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )

    child = f"{session_id}.c1"
    child_calls = sum(r.body["session_id"] == child for r in scripted.requests)
    assert child_calls < 40  # stopped by the parent's budget before its script ran out
    assert "token budget of 8000 tokens is spent" in reply.tool_calls[0].result.output
    assert reply.finish_reason == pb.FINISH_REASON_LENGTH  # and the parent asks its model nothing more
    assert sum(r.body["session_id"] == session_id for r in scripted.requests) == 1

    async def total(session: str) -> int:
        got = scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session))
        await got
        return int(dict(await got.trailing_metadata())["a3s-total-tokens"])

    # The parent's total holds the child's: its own model call alone is far from the budget.
    parent, own_child = await total(session_id), await total(child)
    assert parent >= 8000 and parent - own_child < 8000 // 2


# --- agent files -----------------------------------------------------------------------------


REVIEWER = """---
name: reviewer
description: Reviews a change for bugs.
tools: read_file, bash
model: small-model
---
You review changes.
"""


@pytest.fixture
async def with_agent_files(workspace: Path, tmp_path: Path, scripted: ScriptedProvider) -> Any:
    """A server with an operator agents directory holding `reviewer`, and a workspace whose
    `.a3s/agents` holds a broken file, a `general` of its own and a `sneaky` one asking for bash."""
    operator = tmp_path / "agents"
    operator.mkdir()
    (operator / "reviewer.md").write_text(REVIEWER)
    own = workspace / ".a3s" / "agents"
    own.mkdir(parents=True)
    (own / "broken.md").write_text("---\nname: broken\ndescription: Breaks.\nmax-steps: lots\n---\nPrompt.\n")
    (own / "general.md").write_text("---\nname: general\ndescription: Mine.\n---\nREPO GENERAL PROMPT\n")
    (own / "sneaky.md").write_text(
        "---\nname: sneaky\ndescription: Runs commands.\ntools: [bash, read_file]\nmodel: pricey\n---\nRun.\n"
    )
    settings = replace(agent_settings(workspace, tmp_path / "data"), agent_dirs=[operator])
    async with running(settings, connect=scripted.connect) as server:
        await initialize(server)
        yield server


def offered(scripted: ScriptedProvider, session_id: str) -> set[str]:
    return {
        t["function"]["name"]
        for t in next(r for r in scripted.requests if r.body["session_id"] == session_id).tools
    }


async def test_agent_files_the_model_sees_and_a_broken_one_reported_clearly(
    with_agent_files: LiveServer, scripted: ScriptedProvider, caplog: pytest.LogCaptureFixture
) -> None:
    scripted.fallback = Conversations(
        go=[
            tool_calls([task("broken", "Try", "c1"), task("nobody", "Try", "c2")]),
            tool_calls([task("reviewer", "Review", "c3"), task("sneaky", "Sneak", "c4"), task("general", "Gen", "c5")]),
            text("done"),
        ],
        Review=["reviewed"], Sneak=["sneaked"], Gen=["generated"],
    )  # fmt: skip
    session_id = await new_session(with_agent_files)

    reply = await with_agent_files.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )

    description = next(t for t in scripted.requests[0].tools if t["function"]["name"] == "task")["function"][
        "description"
    ]
    assert "- reviewer: Reviews a change for bugs." in description and "- sneaky:" in description
    assert "broken" not in description
    broken, nobody = (c.result for c in reply.tool_calls[:2])
    assert not broken.success
    assert (
        "broken.md" in broken.error
        and "max-steps" in broken.error
        and "agent 'broken' cannot be used" in broken.error
    )
    assert not nobody.success and "no agent named 'nobody'" in nobody.error and "reviewer" in nobody.error
    assert [c.result.output for c in reply.tool_calls[2:]] == ["reviewed", "sneaked", "generated"]
    # The operator's agent: the tools it names of the parent's, its model.
    assert offered(scripted, f"{session_id}.c3") == {"read_file", "bash"}
    assert (
        next(r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c3").model
        == "small-model"
    )
    # The repository's: only the read-only ones of its tools, the session's model, never in place of a built-in.
    assert offered(scripted, f"{session_id}.c4") == {"read_file"}
    assert (
        next(r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c4").model == "fake-model"
    )
    general = next(r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c5")
    assert "REPO GENERAL PROMPT" not in general.messages[0]["content"]
    assert "bash" in offered(scripted, f"{session_id}.c5")
    # The operator reads it in the log; a face listing the agents gets it too.
    logged = [r.getMessage() for r in caplog.records if "agent file left out" in r.getMessage()]
    assert len(logged) == 1 and "broken.md: max-steps" in logged[0]  # once, not at every generation
    listing = await Application(with_agent_files.runtime).subagents.agents(session_id)
    assert [a.name for a in listing.agents] == ["explore", "plan", "general", "reviewer", "sneaky"]
    assert [a.source for a in listing.shadowed] == [
        str(with_agent_files.workspace / ".a3s/agents/general.md")
    ]
    assert "max-steps" in listing.problems["broken"]


# --- a crash during a child ------------------------------------------------------------------


async def test_kill_9_during_a_child_then_both_generate_again_on_a_strict_provider(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    marker = workspace / "child-runs"
    router = Conversations(
        go=[
            tool_call("task", {"agent": "general", "description": "s", "prompt": "Slow"}, id="c1"),
            "parent goes on",
        ],
        Slow=[tool_call("bash", {"command": f"touch {marker}; sleep 30"}), "child goes on"],
    )
    with FakeLLM(fallback=router, strict=True) as fake:
        env = {"A3S_LLM_PROVIDER": "openai", "A3S_LLM_MODEL": "fake-model", "A3S_LLM_BASE_URL": fake.base_url}
        first = LoggedServer(workspace, tmp_path / "data", tmp_path / "first.log", env=env).start()
        try:
            async with grpc.aio.insecure_channel(first.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
                generation = stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
                await eventually(marker.exists, "the child's command runs")
                first.kill()
                with pytest.raises(grpc.aio.AioRpcError):
                    await generation
        finally:
            first.kill()
        second = LoggedServer(workspace, tmp_path / "data", tmp_path / "second.log", env=env).start()
        try:
            async with grpc.aio.insecure_channel(second.address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                child = f"{session_id}.c1"
                parent_reply = await stub.Generate(
                    pb.GenerateRequest(session_id=session_id, messages=[user("what happened?")]), timeout=20
                )
                child_reply = await stub.Generate(
                    pb.GenerateRequest(session_id=child, messages=[user("and you?")]), timeout=20
                )
        finally:
            second.kill()
    assert "Traceback" not in second.log(), second.log()[-4000:]
    assert parent_reply.message.content == "parent goes on"
    assert child_reply.message.content == "child goes on"
    assert not fake.errors
    answered = [m for m in fake.requests[-2].messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answered] == ["c1"] and "interrupted" in answered[0]["content"]


# --- the application layer the later faces build on ------------------------------------------


async def test_delegate_runs_a_named_agent_on_a_task_as_a_child_of_a_session(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    (scripted_agent.workspace / "a.txt").write_text("alpha\n")
    scripted.fallback = Conversations(Survey=[tool_call("read_file", {"path": "a.txt"}), "a.txt holds alpha"])
    session_id = await new_session(scripted_agent)
    app = Application(scripted_agent.runtime)

    seen = [item async for item in app.subagents.delegate(session_id, "explore", "Survey", max_steps=5)]

    child = seen[0].session_id
    assert {item.session_id for item in seen} == {child} and child.startswith(f"{session_id}.delegate_")
    notices = [item.event.data["type"] for item in seen if isinstance(item.event, NoticeEvent)]
    assert notices == ["subagent_start", "subagent_progress", "subagent_progress", "subagent_end"]
    assert (
        isinstance(seen[-1].event, DoneEvent)
        and seen[-1].event.generation.message.content == "a.txt holds alpha"
    )
    assert [c.id for c in app.subagents.children(session_id)] == [child]
    logged = await scripted_agent.runtime.store.read_log(child, 0, 1000)  # its chunks, for followers
    assert [e.body["chunk"] for e in logged if e.kind == "chunk"][-1]["done"]["finish_reason"] == "stop"
    assert scripted_agent.runtime.sessions.get(child).parent == ParentLink(
        session_id, child.split(".")[-1], "explore"
    )
    listing = await app.subagents.agents(session_id)
    assert [a.name for a in listing.agents] == ["explore", "plan", "general"] and not listing.problems
    with pytest.raises(NotFound, match="no agent named 'nobody'"):
        [item async for item in app.subagents.delegate(session_id, "nobody", "x")]
    with pytest.raises(InvalidArgument, match="task is required"):
        [item async for item in app.subagents.delegate(session_id, "explore", " ")]
    with pytest.raises(NotFound):
        [item async for item in app.subagents.delegate("no-such-session", "explore", "x")]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("postgres_url")) if request.param == "postgresql" else ""


async def test_a_childs_link_to_its_parent_is_stored_and_the_parent_takes_its_children_along(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider, store_url: str
) -> None:
    scripted.fallback = Conversations(
        go=[tool_call("task", {"agent": "plan", "description": "p", "prompt": "Plan"}, id="c1"), "planned"],
        Plan=["1. do it"],
    )
    settings = replace(agent_settings(workspace, tmp_path / "data"), store=store_url)
    async with running(settings, connect=scripted.connect) as first:
        await initialize(first)
        session_id = await new_session(first)
        await first.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
    child = f"{session_id}.c1"
    async with running(settings, connect=scripted.connect) as second:
        assert second.runtime.sessions.get(child).parent == ParentLink(session_id, "c1", "plan")
        assert second.runtime.sessions.get(session_id).parent is None
        assert [c.id for c in Application(second.runtime).subagents.children(session_id)] == [child]
        got = await second.stub.GetSession(pb.GetSessionRequest(session_id=child))
        assert got.session.config.name == "plan: p"

        await second.stub.DestroySession(pb.DestroySessionRequest(session_id=session_id))

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await second.stub.GetSession(pb.GetSessionRequest(session_id=child))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert not (await second.stub.ListSessions(pb.ListSessionsRequest())).sessions


async def test_children_beyond_the_cap_wait_for_one_to_end(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> None:
    scripted.fallback = Conversations(
        go=[tool_calls([task("explore", "One", "c1"), task("explore", "Two", "c2")]), "done"],
        One=[tool_call("list_files", {}), "one"],
        Two=[tool_call("list_files", {}), "two"],
    )
    settings = replace(agent_settings(workspace, tmp_path / "data"), max_subagents=1)
    async with running(settings, connect=scripted.connect) as server:
        await initialize(server)
        session_id = await new_session(server)
        reply = await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
    assert [c.result.output for c in reply.tool_calls] == ["one", "two"]
    order = [
        r.body["session_id"].rsplit(".", 1)[-1] for r in scripted.requests if "." in r.body["session_id"]
    ]
    assert order == ["c1", "c1", "c2", "c2"]  # one child at a time: the second started once the first ended


async def test_pause_holds_the_children_and_cancelling_one_child_lets_the_parent_go_on(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    marker = scripted_agent.workspace / "slow-runs"
    release = asyncio.Event()

    async def held(_body: dict[str, Any]) -> Any:
        await release.wait()
        return tool_call("list_files", {})

    scripted.fallback = Conversations(
        go=[tool_calls([task("general", "Slow", "c1"), task("general", "Held", "c2")]), "went on"],
        Slow=[tool_call("bash", {"command": f"touch {marker}; sleep 60"})],
        Held=[held, "held one done"],
    )
    session_id = await new_session(scripted_agent)
    generation = asyncio.ensure_future(
        scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
    )
    await eventually(marker.exists, "the first child's command runs")
    held_child = f"{session_id}.c2"
    await eventually(lambda: any(r.body["session_id"] == held_child for r in scripted.requests), "c2 asks")

    await scripted_agent.stub.Pause(pb.PauseRequest(session_id=session_id))
    got = await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=held_child))
    assert got.session.state == pb.SESSION_STATE_PAUSED
    release.set()  # its model answers a tool call; the paused child stops before running it
    await eventually(lambda: scripted.finished >= 3, "c2's turn ends")
    calls = [r for r in scripted.requests if r.body["session_id"] == held_child]
    assert len(calls) == 1
    await scripted_agent.stub.Resume(pb.ResumeRequest(session_id=session_id))
    await eventually(
        lambda: len([r for r in scripted.requests if r.body["session_id"] == held_child]) == 2, "c2 goes on"
    )

    cancelled = await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id, operation_id="c1"))
    assert cancelled.success
    reply = await generation
    assert reply.message.content == "went on"
    assert [c.result.output or c.result.error for c in reply.tool_calls] == [
        "cancelled by the client",
        "held one done",
    ]


async def test_trusted_workspace_agents_get_what_they_name_and_many_agents_fit_the_schema_budget(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> None:
    own = workspace / ".a3s" / "agents"
    own.mkdir(parents=True)
    (own / "sneaky.md").write_text(
        "---\nname: sneaky\ndescription: Runs.\ntools: [bash, read_file]\nmodel: pricey\n---\nRun.\n"
    )
    operator = tmp_path / "agents"
    operator.mkdir()
    for number in range(100):
        (operator / f"agent{number:02d}.md").write_text(
            f"---\nname: agent{number:02d}\ndescription: {'A long description. ' * 20}\n---\nPrompt.\n"
        )
    scripted.fallback = Conversations(
        go=[tool_call("task", {"agent": "sneaky", "description": "s", "prompt": "S"}, id="c1"), "ok"],
        S=["done"],
    )
    settings = replace(
        agent_settings(workspace, tmp_path / "data"), agent_dirs=[operator], trust_workspace_agents=True
    )
    async with running(settings, connect=scripted.connect) as server:
        await initialize(server)
        session_id = await new_session(server)
        await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))

    assert offered(scripted, f"{session_id}.c1") == {"read_file", "bash"}
    assert next(r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c1").model == "pricey"
    sent = scripted.requests[0].tools
    task_schema = next(t for t in sent if t["function"]["name"] == "task")
    assert len(json.dumps(task_schema, separators=(",", ":"))) < 3200  # however many agents there are
    description = task_schema["function"]["description"]
    assert "- agent00: A long description." in description  # described, then named, then counted
    assert (
        "agent20" in description and "more (a task naming an unknown agent is told them all)" in description
    )
    assert len(json.dumps(sent, separators=(",", ":"))) <= 16_384  # tests/test_tool_schemas.py's budget


async def test_a_deeper_limit_lets_children_start_children_of_their_own(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> None:
    scripted.fallback = Conversations(
        go=[tool_call("task", {"agent": "general", "description": "a", "prompt": "Nest"}, id="c1"), "top"],
        Nest=[
            tool_call("task", {"agent": "explore", "description": "b", "prompt": "Deeper"}, id="c2"),
            "middle",
        ],
        Deeper=["bottom"],
    )
    settings = replace(agent_settings(workspace, tmp_path / "data"), subagent_depth=2)
    async with running(settings, connect=scripted.connect) as server:
        await initialize(server)
        session_id = await new_session(server)
        reply = await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
        grandchild = f"{session_id}.c1.c2"
        assert server.runtime.sessions.get(grandchild).parent == ParentLink(
            f"{session_id}.c1", "c2", "explore"
        )
    assert reply.tool_calls[0].result.output == "middle"
    assert "task" in offered(scripted, f"{session_id}.c1")
    assert "task" not in offered(scripted, grandchild)  # the limit is reached there
    middle = [r for r in scripted.requests if r.body["session_id"] == f"{session_id}.c1"][-1]
    assert middle.messages[-1]["content"] == "bottom"
