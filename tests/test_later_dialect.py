"""Both A3S gRPC dialects on one port (a3s-string-dialect.md section 2): the later (string) dialect
through a real server and our own later-dialect client (code_agent_later_pb2_grpc), every shared RPC;
how each request's dialect is told from its bytes (the spec's examples, unit tests of dialect.py);
mixed, undecidable, forced and hostile requests; SessionConfig #7-10 and event type 20."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc
import pytest
from google.protobuf import descriptor_pb2

from a3s_agent import cli
from a3s_agent.app import Application
from a3s_agent.base.models import LLMConfig
from a3s_agent.config import ConfigError, Settings, settings_from
from a3s_agent.core.skills.catalog import EXAMPLE_SKILLS_DIR
from a3s_agent.faces.grpc import dialect, later_convert
from a3s_agent.faces.grpc.dialect import BOX, LATER
from a3s_agent.faces.later_service import SERVED_METHODS
from a3s_agent.proto import code_agent_later_pb2 as lp
from a3s_agent.proto import code_agent_later_pb2_grpc as lp_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import LiveServer, agent_settings, running, subscribed, user
from .scripted_model import ScriptedProvider

SERVICE = "/a3s.code.agent.v1.CodeAgentService/"
SCHEMA = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
SKILL = "---\nname: notes\ndescription: Take notes.\n---\nWrite notes.\n"
NODE_AGENT = ("grpc.primary_user_agent", "grpc-node-js/1.9")


def channel_to(address: str, *options: tuple[str, object]) -> grpc.aio.Channel:
    """A channel on a connection of its own (grpc shares one between channels of equal options)."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1), *options])


def fake_settings(workspace: Path, data: Path, base_url: str = "", mode: str = "auto") -> Settings:
    """The server's own model is the fake one: a later Initialize has no config to name it."""
    settings = agent_settings(workspace, data)
    settings.llm = LLMConfig(provider="openai", model="fake-model", base_url=base_url)
    settings.a3s_dialect = mode
    return settings


@dataclass
class Later:
    server: LiveServer
    stub: lp_grpc.CodeAgentServiceStub
    stub_channel: grpc.aio.Channel


@asynccontextmanager
async def later_client(server: LiveServer, *options: tuple[str, object]) -> AsyncIterator[Later]:
    async with channel_to(server.address, *options) as channel:
        yield Later(server, lp_grpc.CodeAgentServiceStub(channel), channel)


@pytest.fixture
async def later(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[Later]:
    """A server whose model is the fake LLM, and a later-dialect client on a connection of its own."""
    settings = fake_settings(workspace, tmp_path / "data", fake.base_url)
    settings.skill_dirs = [EXAMPLE_SKILLS_DIR]
    async with running(settings) as server, later_client(server) as client:
        yield client


def raw_call(server: LiveServer, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
    """`method` taking and answering bytes: what any client may put on the wire."""
    return server.channel.unary_unary(SERVICE + method)


async def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), err.value.details() or ""


# --- every shared RPC through the later client ----------------------------------------------


async def test_every_shared_rpc_answers_the_later_client(later: Later, fake: FakeLLM) -> None:
    stub, called = later.stub, set()

    def did(name: str) -> None:
        called.add(name)

    assert (await stub.HealthCheck(lp.HealthCheckRequest())).status == lp.HealthCheckResponse.STATUS_HEALTHY
    did("HealthCheck")
    assert (await stub.GetCapabilities(lp.GetCapabilitiesRequest())).info.name
    did("GetCapabilities")
    assert (await stub.Initialize(lp.InitializeRequest(env={"CI": "1"}))).success
    did("Initialize")

    call = stub.CreateSession(
        lp.CreateSessionRequest(
            config=lp.SessionConfig(name="later", auto_compact_threshold=0.7),
            initial_context=[
                lp.Message(role="SYSTEM", content="Be brief."),
                lp.Message(role="User", content="hello"),
                lp.Message(role="ROLE_ASSISTANT", content="hi"),
            ],
        )
    )
    created = await call
    did("CreateSession")
    session_id = created.session_id
    assert created.session.config.auto_compact_threshold == pytest.approx(0.7)
    assert dict(await call.trailing_metadata())["a3s-compact-threshold"] == "0.7"
    usage = await stub.GetContextUsage(lp.GetContextUsageRequest(session_id=session_id))
    assert usage.usage.message_count == 3
    did("GetContextUsage")

    events = stub.SubscribeEvents(lp.SubscribeEventsRequest(session_id=session_id))
    await subscribed(later.server)
    did("SubscribeEvents")
    fake.script(tool_call("bash", {"command": "echo CI=$CI"}), text("done"))
    reply = await stub.Generate(
        lp.GenerateRequest(
            session_id=session_id,
            messages=[lp.Message(role="user", content="run it", metadata={"name": "alice"})],
        )
    )
    did("Generate")
    assert reply.message.role == "assistant" and reply.message.content == "done"
    assert reply.finish_reason == "stop"
    assert "CI=1" in reply.tool_calls[0].result.output  # Initialize's env reached the tool
    assert "CI=1" in fake.requests[1].messages[-1]["content"]
    history = await Application(later.server.runtime).sessions.history(session_id)
    asked = next(m for m in history if m.content == "run it")
    assert asked.role == "user" and asked.metadata == {"name": "alice"}  # Message #3 is our metadata
    assert (await events.read()).type == lp.AgentEvent.EVENT_TYPE_GENERATION_STARTED
    events.cancel()

    (later.server.workspace / "a.txt").write_text("alpha\n")
    fake.script(tool_call("read_file", {"path": "a.txt"}), text("alpha it is"))
    chunks = [c async for c in stub.StreamGenerate(
        lp.GenerateRequest(session_id=session_id, messages=[lp.Message(role="user", content="read a.txt")])
    )]  # fmt: skip
    did("StreamGenerate")
    types = [c.type for c in chunks]
    assert {"tool_call", "tool_result", "content", "done"} <= set(types) <= {
        "tool_call", "tool_result", "content", "metadata", "done"
    }  # fmt: skip
    assert types[-1] == "done" and chunks[-1].finish_reason == "stop"
    assert chunks[-1].content == "alpha it is"
    assert all(c.finish_reason == "" for c in chunks[:-1])

    fake.script(text('{"name": "Ada"}'), text('{"name": "Bo"}'))
    structured = lp.GenerateStructuredRequest(
        session_id=session_id, messages=[lp.Message(role="user", content="Ada")], schema=SCHEMA
    )
    assert (await stub.GenerateStructured(structured)).data == '{"name": "Ada"}'
    did("GenerateStructured")
    parts = [c async for c in stub.StreamGenerateStructured(structured)]
    did("StreamGenerateStructured")
    # One chunk with the whole data, as A3S Code sends: the TypeScript SDK joins every chunk's data.
    assert [(p.done, p.data) for p in parts] == [(True, '{"name": "Bo"}')]

    loaded = await stub.LoadSkill(lp.LoadSkillRequest(session_id=session_id, skill_name="word-count"))
    assert loaded.success and list(loaded.tool_names) == ["count_lines"]
    did("LoadSkill")
    skills = {s.name: s for s in (await stub.ListSkills(lp.ListSkillsRequest(session_id=session_id))).skills}
    assert list(skills["word-count"].tools) == ["count_lines"]  # the Box/TS Skill shape
    assert skills["word-count"].metadata["loaded"] == "true"
    did("ListSkills")
    unloaded = await stub.UnloadSkill(lp.UnloadSkillRequest(session_id=session_id, skill_name="word-count"))
    assert unloaded.success and list(unloaded.removed_tools) == ["count_lines"]
    did("UnloadSkill")

    assert (await stub.CompactContext(lp.CompactContextRequest(session_id=session_id))).success
    did("CompactContext")
    assert (await stub.ClearContext(lp.ClearContextRequest(session_id=session_id))).success
    did("ClearContext")
    await stub.Cancel(lp.CancelRequest(session_id=session_id))
    did("Cancel")
    assert (await stub.Pause(lp.PauseRequest(session_id=session_id))).success
    did("Pause")
    assert (await stub.Resume(lp.ResumeRequest(session_id=session_id))).success
    did("Resume")
    confirm = await stub.ConfirmToolExecution(
        lp.ConfirmToolExecutionRequest(session_id=session_id, tool_id="nope", approved=True)
    )
    assert not confirm.success and confirm.error
    did("ConfirmToolExecution")
    policy = lp.ConfirmationPolicy(enabled=True, require_confirm_tools=["bash"], default_timeout_ms=5000)
    set_policy = await stub.SetConfirmationPolicy(
        lp.SetConfirmationPolicyRequest(session_id=session_id, policy=policy)
    )
    assert set_policy.success and list(set_policy.policy.require_confirm_tools) == ["bash"]
    did("SetConfirmationPolicy")
    got_policy = await stub.GetConfirmationPolicy(lp.GetConfirmationPolicyRequest(session_id=session_id))
    assert got_policy.policy.enabled
    did("GetConfirmationPolicy")
    handler = lp.LaneHandlerConfig(mode=lp.TASK_HANDLER_MODE_EXTERNAL, timeout_ms=1000)
    lane = lp.SESSION_LANE_EXECUTE
    set_lane = await stub.SetLaneHandler(
        lp.SetLaneHandlerRequest(session_id=session_id, lane=lane, config=handler)
    )
    assert set_lane.success and set_lane.config.mode == lp.TASK_HANDLER_MODE_EXTERNAL
    did("SetLaneHandler")
    got_lane = await stub.GetLaneHandler(lp.GetLaneHandlerRequest(session_id=session_id, lane=lane))
    assert got_lane.config.timeout_ms == 1000
    did("GetLaneHandler")
    completed = await stub.CompleteExternalTask(
        lp.CompleteExternalTaskRequest(session_id=session_id, task_id="nope", success=True)
    )
    assert not completed.success and completed.error
    did("CompleteExternalTask")
    pending = await stub.ListPendingExternalTasks(lp.ListPendingExternalTasksRequest(session_id=session_id))
    assert list(pending.tasks) == []
    did("ListPendingExternalTasks")
    permissions = lp.PermissionPolicy(deny=[lp.PermissionRule(rule="Bash(rm:*)")], enabled=True)
    assert (
        await stub.SetPermissionPolicy(
            lp.SetPermissionPolicyRequest(session_id=session_id, policy=permissions)
        )
    ).success
    did("SetPermissionPolicy")
    assert (await stub.AddPermissionRule(
        lp.AddPermissionRuleRequest(session_id=session_id, rule_type="deny", rule="Write(*.lock)")
    )).success  # fmt: skip
    did("AddPermissionRule")
    got = await stub.GetPermissionPolicy(lp.GetPermissionPolicyRequest(session_id=session_id))
    assert [r.rule for r in got.policy.deny] == ["Bash(rm:*)", "Write(*.lock)"]
    did("GetPermissionPolicy")
    verdict = await stub.CheckPermission(
        lp.CheckPermissionRequest(
            session_id=session_id, tool_name="bash", arguments='{"command": "rm -rf x"}'
        )
    )
    assert verdict.decision == lp.PERMISSION_DECISION_DENY
    did("CheckPermission")

    got_session = await stub.GetSession(lp.GetSessionRequest(session_id=session_id))
    assert got_session.session.config.auto_compact_threshold == pytest.approx(0.7)
    did("GetSession")
    configured = await stub.ConfigureSession(
        lp.ConfigureSessionRequest(session_id=session_id, config=lp.SessionConfig(auto_compact_threshold=0.9))
    )
    assert configured.session.config.auto_compact_threshold == pytest.approx(0.9)
    did("ConfigureSession")
    listed = await stub.ListSessions(lp.ListSessionsRequest())
    assert [s.config.auto_compact_threshold for s in listed.sessions] == [pytest.approx(0.9)]
    did("ListSessions")
    assert (await stub.DestroySession(lp.DestroySessionRequest(session_id=session_id))).success
    did("DestroySession")
    assert (await stub.Shutdown(lp.ShutdownRequest())).success
    did("Shutdown")
    assert later.server.runtime.shutdown_requested.is_set()

    shared = {m.name for m in lp.DESCRIPTOR.services_by_name["CodeAgentService"].methods} - set(
        SERVED_METHODS
    )
    assert len(shared) == 34 and called == shared


async def test_a_generation_stopped_by_its_tool_calls_says_tool_calls(later: Later, fake: FakeLLM) -> None:
    fake.fallback = tool_call("list_files", {})
    session_id = (await later.stub.CreateSession(lp.CreateSessionRequest())).session_id
    reply = await later.stub.Generate(
        lp.GenerateRequest(session_id=session_id, messages=[lp.Message(role="user", content="loop")])
    )
    assert reply.finish_reason == "tool_calls" and reply.message.role == "assistant"
    assert "max_tool_calls limit" in reply.message.content


async def test_role_strings_unknown_ones_and_function(later: Later) -> None:
    session_id = (await later.stub.CreateSession(lp.CreateSessionRequest())).session_id
    for role, problem in (
        ("wizard", "messages[0].role must be user, assistant, system or tool"),
        ("", "not ''"),
        ("function", "metadata.tool_call_id is required"),  # function is tool, which needs its call's id
    ):
        code, details = await status_of(
            later.stub.Generate(
                lp.GenerateRequest(session_id=session_id, messages=[lp.Message(role=role, content="x")])
            )
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and problem in details, details
    assert "'wizard'" in (
        await status_of(later.stub.CreateSession(
            lp.CreateSessionRequest(initial_context=[lp.Message(role="wizard", content="x")])
        ))
    )[1]  # fmt: skip


# --- SessionConfig #7-10 and event type 20 --------------------------------------------------


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (lp.SessionConfig(storage_type=lp.STORAGE_TYPE_CUSTOM), "STORAGE_TYPE_CUSTOM is not served"),
        # a number the enum does not name: proto3 enums are open on the wire
        (lp.SessionConfig(storage_type=cast(lp.StorageType, 7)), "storage_type 7 is not served"),
        (lp.SessionConfig(planning_enabled=True), "does not plan or track goals inside a generation"),
        (lp.SessionConfig(goal_tracking=True), "does not plan or track goals inside a generation"),
        (lp.SessionConfig(auto_compact_threshold=1.5), "auto_compact_threshold must be a share"),
        (lp.SessionConfig(auto_compact_threshold=-0.5), "auto_compact_threshold must be a share"),
        (lp.SessionConfig(auto_compact_threshold=float("nan")), "auto_compact_threshold must be a share"),
        (lp.SessionConfig(auto_compact_threshold=0.4), "must be below the compaction threshold (0.4)"),
    ],
)
async def test_session_config_fields_we_do_not_serve_are_refused(
    later: Later, config: lp.SessionConfig, problem: str
) -> None:
    code, details = await status_of(later.stub.CreateSession(lp.CreateSessionRequest(config=config)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and problem in details, details
    session_id = (await later.stub.CreateSession(lp.CreateSessionRequest())).session_id
    code, details = await status_of(
        later.stub.ConfigureSession(lp.ConfigureSessionRequest(session_id=session_id, config=config))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and problem in details, details


async def test_storage_types_we_serve_and_a_box_client_sending_the_threshold(later: Later) -> None:
    for storage in (lp.STORAGE_TYPE_UNSPECIFIED, lp.STORAGE_TYPE_MEMORY, lp.STORAGE_TYPE_FILE):
        await later.stub.CreateSession(lp.CreateSessionRequest(config=lp.SessionConfig(storage_type=storage)))
    config = pb.SessionConfig(name="box")  # a Box client that knows the additive field 8
    config.MergeFromString(lp.SessionConfig(auto_compact_threshold=0.75).SerializeToString())
    box = later.server.stub
    call = box.CreateSession(pb.CreateSessionRequest(config=config))
    reply = await call
    assert dict(await call.trailing_metadata())["a3s-compact-threshold"] == "0.75"
    # Not echoed to a Box connection: its SessionConfig has no field 8.
    assert lp.SessionConfig.FromString(reply.session.config.SerializeToString()).auto_compact_threshold == 0
    request = lp.GetSessionRequest(session_id=reply.session_id)
    unknown = await later.stub.GetSession(request)  # nothing says this connection is later yet
    assert unknown.session.config.auto_compact_threshold == 0
    async with later_client(later.server, NODE_AGENT) as node:  # the TypeScript SDK's user-agent
        got = await node.stub.GetSession(request)
    assert got.session.config.auto_compact_threshold == pytest.approx(0.75)


def _words(tag: str, count: int) -> str:
    return " ".join(f"{tag}w{n}" for n in range(count))


async def test_a_later_only_rpc_marks_its_connection_as_later(later: Later) -> None:
    config = lp.SessionConfig(auto_compact_threshold=0.75)
    session_id = (await later.stub.CreateSession(lp.CreateSessionRequest(config=config))).session_id
    request = lp.GetSessionRequest(session_id=session_id)
    assert (await later.stub.GetSession(request)).session.config.auto_compact_threshold == 0  # unknown yet
    listed = await later.stub_channel.unary_unary(SERVICE + "ListProviders")(b"")
    assert lp.ListProvidersResponse.FromString(listed).providers == []
    assert (await later.stub.GetSession(request)).session.config.auto_compact_threshold == pytest.approx(0.75)


async def test_the_later_threshold_drives_compaction_and_event_20_goes_to_later_clients_only(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> None:
    scripted.fallback = lambda body: text(
        "Goal: the task." if str(body["messages"][0].get("content", "")).startswith("Summarise") else "ok"
    )
    settings = fake_settings(workspace, tmp_path / "data")
    async with running(settings, connect=scripted.connect) as server, later_client(server) as client:
        # About 55% of the window: under the default threshold (80%), over this session's 50%.
        context = [lp.Message(role="user", content="THE TASK")] + [
            lp.Message(role="assistant" if i % 2 else "user", content=_words(f"m{i}", 600)) for i in range(6)
        ]
        created = await client.stub.CreateSession(
            lp.CreateSessionRequest(
                config=lp.SessionConfig(
                    auto_compact=True, max_context_length=32_000, auto_compact_threshold=0.5
                ),
                initial_context=context,
            ),
            metadata=(("a3s-compact-target", "0.35"),),
        )
        session_id = created.session_id
        later_events = client.stub.SubscribeEvents(
            lp.SubscribeEventsRequest(session_id=session_id, event_types=["CONTEXT_COMPACTED"])
        )
        box_events = server.stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=session_id))
        memory_only = client.stub.SubscribeEvents(
            lp.SubscribeEventsRequest(session_id=session_id, event_types=["event_type_memory_stored"])
        )
        await subscribed(server, 3)
        chunks = [c async for c in client.stub.StreamGenerate(
            lp.GenerateRequest(session_id=session_id, messages=[lp.Message(role="user", content="go on")])
        )]  # fmt: skip
        assert any(c.type == "metadata" and c.metadata.get("type") == "context_compacted" for c in chunks)
        compacted = await asyncio.wait_for(later_events.read(), 10)
        assert compacted.type == lp.AgentEvent.EVENT_TYPE_CONTEXT_COMPACTED == 20
        assert compacted.message == "context_compacted" and int(compacted.data["after_tokens"]) > 0
        box_types = []
        while True:
            event = await asyncio.wait_for(box_events.read(), 10)
            box_types.append(event.type)
            if event.type == pb.AgentEvent.EVENT_TYPE_GENERATION_COMPLETED:
                break
            if event.message == "context_compacted":
                assert event.type == pb.AgentEvent.EVENT_TYPE_INFO
        assert max(box_types) <= 15 and pb.AgentEvent.EVENT_TYPE_INFO in box_types
        with pytest.raises(asyncio.TimeoutError):  # we publish no memory events
            await asyncio.wait_for(memory_only.read(), 0.3)
        for call in (later_events, box_events, memory_only):
            call.cancel()


def test_event_filters_naming_later_types() -> None:
    assert later_convert.event_filter(["TOOL_CALLED"]).names == ["TOOL_CALLED"]
    mixed = later_convert.event_filter(["tool_called", "EVENT_TYPE_CONTEXT_COMPACTED"])
    assert mixed.names == ["tool_called", "INFO"] and mixed.later == {20}
    with pytest.raises(Exception, match="unknown event type 'NOPE'"):
        later_convert.event_filter(["MEMORY_CLEARED", "NOPE"])


# --- the decision on a real server: mixed, undecidable, forced, hostile ---------------------


def _box_message(content: str) -> pb.Message:
    return pb.Message(role=pb.Message.ROLE_USER, content=content)


async def test_a_request_mixing_the_dialects_is_refused_naming_the_message(later: Later) -> None:
    box = pb.GenerateRequest(session_id="s", messages=[_box_message("a"), _box_message("b")])
    mixed = (
        box.SerializeToString() + lp.GenerateRequest(messages=[lp.Message(role="user")]).SerializeToString()
    )
    code, details = await status_of(raw_call(later.server, "Generate")(mixed))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[2] is in the later dialect but messages[0] in the Box dialect" in details
    with_options = lp.GenerateStructuredRequest(messages=[lp.Message(role="user")]).SerializeToString()
    with_options += pb.GenerateStructuredRequest(options=pb.GenerateOptions()).SerializeToString()
    code, details = await status_of(raw_call(later.server, "StreamGenerateStructured")(with_options))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "options is in the Box dialect" in details
    context = pb.CreateSessionRequest(initial_context=[_box_message("a")]).SerializeToString()
    context += lp.CreateSessionRequest(initial_context=[lp.Message(role="user")]).SerializeToString()
    code, details = await status_of(raw_call(later.server, "CreateSession")(context))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "initial_context[1] is in the later" in details


async def _first_seq(client: Later, session_id: str) -> str:
    chunks = [c async for c in client.stub.StreamGenerate(
        lp.GenerateRequest(session_id=session_id, messages=[lp.Message(role="user", content="hi")])
    )]  # fmt: skip
    return chunks[0].metadata["seq"]


def _follow(session_id: str, seq: str) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """StreamGenerate following a run from `seq`: no messages, so no dialect in its bytes."""
    return pb.GenerateRequest(session_id=session_id).SerializeToString(), (("a3s-after-seq", seq),)


async def _followed(channel: grpc.aio.Channel, session_id: str, seq: str) -> list[bytes]:
    request, metadata = _follow(session_id, seq)
    return [raw async for raw in channel.unary_stream(SERVICE + "StreamGenerate")(request, metadata=metadata)]


async def test_undecidable_requests_follow_the_connection_then_the_client_hint(
    later: Later, fake: FakeLLM
) -> None:
    fake.fallback = text("hello there")
    session_id = (await later.stub.CreateSession(lp.CreateSessionRequest())).session_id
    seq = await _first_seq(later, session_id)  # decided later: this connection is remembered as later
    server = later.server

    async with channel_to(server.address) as plain, channel_to(server.address, NODE_AGENT) as node:
        for channel, dialect_of in (
            (plain, BOX),  # nothing known: Box
            (node, LATER),  # the TypeScript SDK's user-agent
        ):
            last = (await _followed(channel, session_id, seq))[-1]
            if dialect_of == LATER:
                chunk = lp.GenerateChunk.FromString(last)
                assert chunk.type == "done" and chunk.finish_reason == "stop"
            else:
                assert pb.GenerateChunk.FromString(last).type == pb.GenerateChunk.CHUNK_TYPE_DONE
        # A Box request decided on the hinted connection: its memory now outranks the hint.
        await pb_grpc.CodeAgentServiceStub(node).Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("x")])
        )
        last = (await _followed(node, session_id, seq))[-1]
        assert pb.GenerateChunk.FromString(last).type == pb.GenerateChunk.CHUNK_TYPE_DONE
    # And on the later client's own connection, its memory.
    request, metadata = _follow(session_id, seq)
    chunks = [
        c async for c in later.stub.StreamGenerate(lp.GenerateRequest.FromString(request), metadata=metadata)
    ]
    assert [c.type for c in chunks][-1] == "done" and chunks[-1].content == "hello there"


@pytest.mark.parametrize("mode", ["box", "later"])
async def test_the_switch_forces_one_dialect(
    workspace: Path, tmp_path: Path, fake: FakeLLM, mode: str
) -> None:
    fake.fallback = text("forced")
    async with (
        running(fake_settings(workspace, tmp_path / "data", fake.base_url, mode)) as server,
        later_client(server) as client,
    ):
        session_id = (await server.stub.CreateSession(pb.CreateSessionRequest())).session_id
        box_call = server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("hi")]))
        later_call = client.stub.Generate(
            lp.GenerateRequest(session_id=session_id, messages=[lp.Message(role="user", content="hi")])
        )
        served, refused = (later_call, box_call) if mode == "later" else (box_call, later_call)
        code, details = await status_of(refused)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "role must be" in details
        assert (await served).message.content == "forced"
        if mode == "later":
            seq = await _first_seq(client, session_id)
        else:
            seq = (await server.stub.StreamGenerate(
                pb.GenerateRequest(session_id=session_id, messages=[user("hi")])
            ).read()).metadata["seq"]  # fmt: skip
        async with channel_to(server.address, NODE_AGENT) as node:  # the hint does not count now
            last = (await _followed(node, session_id, seq))[-1]
        if mode == "later":
            assert lp.GenerateChunk.FromString(last).type == "done"
        else:
            assert pb.GenerateChunk.FromString(last).type == pb.GenerateChunk.CHUNK_TYPE_DONE


def test_the_switch_setting(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert settings_from(env={}).a3s_dialect == "auto"
    assert settings_from(env={"A3S_DIALECT": " Later "}).a3s_dialect == "later"
    assert settings_from(a3s_dialect="box", env={"A3S_DIALECT": "later"}).a3s_dialect == "box"
    with pytest.raises(
        ConfigError, match=r"--a3s-dialect \(A3S_DIALECT\) must be auto, box or later, not 'tls'"
    ):
        settings_from(env={"A3S_DIALECT": "tls"})
    code = cli.main(
        ["serve", "--a3s-dialect", "string", "--workspace", str(tmp_path), "--data-dir", str(tmp_path)]
    )
    assert code == 2 and "--a3s-dialect (A3S_DIALECT) must be auto, box or later" in capsys.readouterr().err


HOSTILE = [
    b"\x12",  # a tag, no length
    b"\x12\xff\xff",  # a truncated length varint
    b"\x12\x05ab",  # a length past the end
    b"\x12\x03\x0a\x10a",  # a message whose role runs past its end
    b"\x0a\x01s\x12\x02\x1a\x05",  # an attachment or metadata past its end
    b"\x08" + b"\xff" * 10 + b"\x01",  # an 11-byte varint
    b"\x00\x00",  # field number 0
    b"\x13" * 100_000,  # 100,000 nested groups
    b"\x28\x00" * 300_000,  # more fields than the scan reads
    b"\x12\x80\x80\x80\x80\x10",  # a 4 GiB length
]


@pytest.mark.parametrize("payload", HOSTILE, ids=range(len(HOSTILE)))
async def test_hostile_bytes_are_invalid_argument_quickly(later: Later, payload: bytes) -> None:
    for method in ("Generate", "StreamGenerate", "CreateSession", "Initialize", "GenerateStructured"):
        started = time.monotonic()
        if method == "StreamGenerate":
            call = later.server.channel.unary_stream(SERVICE + method)(payload, timeout=10)
            code, details = await status_of(call.read())
        else:
            code, details = await status_of(raw_call(later.server, method)(payload, timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, details)
        assert time.monotonic() - started < 5
    health = await later.stub.HealthCheck(lp.HealthCheckRequest())
    assert health.status == lp.HealthCheckResponse.STATUS_HEALTHY


async def test_reflection_still_describes_the_box_dialect(later: Later) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    call = later.server.channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )()
    await call.write(
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="a3s.code.agent.v1.Message")
    )
    reply = await call.read()
    await call.done_writing()
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in reply.file_descriptor_response.file_descriptor_proto
    ]
    message = next(m for f in files for m in f.message_type if m.name == "Message")
    role = next(f for f in message.field if f.name == "role")
    assert role.type == descriptor_pb2.FieldDescriptorProto.TYPE_ENUM


# --- dialect.py: the spec's bytes -----------------------------------------------------------


def _generate_with(*messages: str) -> bytes:
    """A GenerateRequest holding each hex-written Message as field 2."""
    out = b""
    for message in messages:
        body = bytes.fromhex(message)
        out += b"\x12" + bytes([len(body)]) + body
    return out


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (["08 01 12 02 68 69"], BOX),  # {role: ROLE_USER, content: "hi"}
        (["0a 04 75 73 65 72 12 02 68 69"], LATER),  # {role: "user", content: "hi"}
        (["12 02 68 69 22 04 0a 00 12 00"], BOX),  # field 4: Box's metadata
        (["12 02 68 69 1a 0d 0a 04 6e 61 6d 65 12 05 61 6c 69 63 65"], LATER),  # metadata{"name": "alice"}
        (["1a 04 0a 00 12 00"], LATER),  # an empty key and value still start with 0x0A
        (["12 02 68 69 1a 09 08 01 12 05 61 2e 74 78 74"], BOX),  # Attachment {TYPE_FILE, "a.txt"}
        (["1a 07 12 05 61 2e 74 78 74"], BOX),  # an Attachment without a type starts with its name
        (["1a 00"], BOX),  # an empty Attachment
        (["12 02 68 69"], None),  # content only
        ([""], None),  # an empty message
        ([], None),  # no messages at all
        (["12 02 68 69", "0a 04 75 73 65 72"], LATER),  # the undecidable ones go with the decided
    ],
)
def test_messages_decide_as_the_spec_says(messages: list[str], expected: str | None) -> None:
    data = b"\x0a\x01s" + _generate_with(*messages)
    assert dialect.generate_dialect(data) == expected
    assert dialect.structured_dialect(data) == expected


def test_options_and_initial_context_fields() -> None:
    assert (
        dialect.generate_dialect(pb.GenerateRequest(options=pb.GenerateOptions()).SerializeToString()) == BOX
    )
    options_4 = pb.GenerateStructuredRequest(options=pb.GenerateOptions()).SerializeToString()
    assert dialect.structured_dialect(options_4) == BOX
    assert dialect.generate_dialect(options_4) is None  # #4 is not Generate's options
    later_context = lp.CreateSessionRequest(initial_context=[lp.Message(role="user")]).SerializeToString()
    assert dialect.create_session_dialect(later_context) == LATER
    assert dialect.create_session_dialect(pb.CreateSessionRequest(session_id="x").SerializeToString()) is None
    with pytest.raises(dialect.Mixed, match=r"messages\[2\] is in the Box dialect but messages\[0\]"):
        dialect.generate_dialect(_generate_with("0a 01 75", "12 01 78", "08 01"))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("0a 03 2f 77 73", None),  # workspace only: nothing to decide
        ("1a 07 0a 02 43 49 12 01 31", BOX),  # field 3: Box's env
        ("12 07 0a 02 43 49 12 01 31", LATER),  # env {CI: "1"}: one printable entry
        ("12 0d 0a 04 48 4f 4d 45 12 05 2f 72 6f 6f 74 12 07 0a 02 43 49 12 01 31", LATER),  # two entries
        (
            "12 0a 0a 08 0a 06 6f 70 65 6e 61 69",
            BOX,
        ),  # config{llm{provider: "openai"}}: the key is not printable
        ("12 0b 0a 02 43 49 12 01 31 1a 02 0a 00", BOX),  # a third field: an AgentConfig
        (
            "12 07 0a 03 0a 01 70 12 00",
            BOX,
        ),  # config{llm{provider: "p"}, tools{}}: entry-shaped, key not printable
        ("12 07 0a 03 43 ff 49 12 00", BOX),  # a key that is not UTF-8
        ("12 04 12 02 43 49", BOX),  # value first: not a map entry
        ("12 00", BOX),  # an empty AgentConfig
    ],
)
def test_initialize_decides_as_the_spec_says(data: str, expected: str | None) -> None:
    assert dialect.initialize_dialect(bytes.fromhex(data)) == expected


def test_initialize_from_the_real_encoders() -> None:
    assert dialect.initialize_dialect(lp.InitializeRequest(env={"CI": "1"}).SerializeToString()) == LATER
    box = pb.InitializeRequest(
        config=pb.AgentConfig(llm=pb.LLMConfig(provider="openai", model="m"), tools=pb.ToolsConfig()),
        env={"CI": "1"},
    )
    assert dialect.initialize_dialect(box.SerializeToString()) == BOX
    only_config = pb.InitializeRequest(config=pb.AgentConfig(llm=pb.LLMConfig(provider="p")))
    assert dialect.initialize_dialect(only_config.SerializeToString()) == BOX


@pytest.mark.parametrize("payload", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bytes_are_malformed_or_left_to_the_decoder(payload: bytes) -> None:
    """The scan either refuses the bytes or decides without reading them all; then the decoder refuses."""
    for scan in (dialect.generate_dialect, dialect.create_session_dialect, dialect.initialize_dialect):
        try:
            scan(payload)
        except dialect.Malformed:
            continue


def test_neutral_and_later_replies() -> None:
    reply = pb.GenerateResponse(
        session_id="s",
        message=pb.Message(role=pb.Message.ROLE_ASSISTANT, content="ok", metadata={"k": "v"}),
        finish_reason=pb.FINISH_REASON_TOOL_CALLS,
        metadata={"model": "m"},
    )
    later = later_convert.generate_response(pb.GenerateResponse.FromString(reply.SerializeToString()))
    assert (later.message.role, later.finish_reason, dict(later.message.metadata)) == (
        "assistant",
        "tool_calls",
        {"k": "v"},
    )
    assert later.metadata["model"] == "m" and later.message.content == "ok"
    neutral = later_convert.neutral_response(reply).SerializeToString()
    for decoded in (pb.GenerateResponse.FromString(neutral), lp.GenerateResponse.FromString(neutral)):
        assert decoded.message.content == "ok" and not decoded.message.role and not decoded.finish_reason
        assert decoded.message.ListFields() == [(decoded.message.DESCRIPTOR.fields_by_name["content"], "ok")]
    chunk = later_convert.chunk(
        pb.GenerateChunk(
            type=pb.GenerateChunk.CHUNK_TYPE_DONE, content="all", metadata={"finish_reason": "length"}
        )
    )
    assert (chunk.type, chunk.finish_reason, chunk.content) == ("done", "length", "all")
    content = later_convert.chunk(pb.GenerateChunk(type=pb.GenerateChunk.CHUNK_TYPE_CONTENT, content="a"))
    assert (content.type, content.finish_reason) == ("content", "")
