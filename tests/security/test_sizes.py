"""Bounds on what one request can make the server hold, attacked through the real gRPC interface:
lone surrogates in JSON, too many or too large messages, a huge request starving other callers,
ListSessions over a big store after a restart, too many direct tool calls at once, and session
workspaces outside the workspace root."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from a3s_agent.config import Settings
from a3s_agent.faces.agent_service import MAX_REQUEST_MESSAGE_SIZE
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call
from a3s_agent.testing.stored_sessions import session_id, write_sessions

from ..conftest import LiveServer, new_session, running, user
from ..fault.conftest import LoggedServer
from ..test_spaces import until_exists

pytestmark = pytest.mark.security

ROOMY = [("grpc.max_send_message_length", 128 << 20), ("grpc.max_receive_message_length", 128 << 20)]
WAIT_S = 60.0  # the bound on every wait; the machine may be busy
HEALTH_CHECKS = 5


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value


# --- lone surrogates in JSON --------------------------------------------------------------------


async def test_lone_surrogates_in_tool_arguments_are_refused_naming_the_field(agent: LiveServer) -> None:
    session = await new_session(agent)
    for name, arguments, field in [
        ("write_file", '{"path": "a.txt", "content": "x\\ud800"}', "content"),
        ("read_file", '{"path": "\\udfff.txt"}', "path"),
        ("bash", '{"command": "echo \\ud800"}', "command"),
    ]:
        refused = await _refused(
            agent.stub.ExecuteTool(
                pb.ExecuteToolRequest(session_id=session, tool_name=name, arguments=arguments)
            )
        )
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
        assert f"arguments for {name}" in refused.details() and field in refused.details()
        batch = await agent.stub.ExecuteToolBatch(
            pb.ExecuteToolBatchRequest(
                session_id=session, tool_calls=[pb.ToolCall(id="c1", name=name, arguments=arguments)]
            )
        )
        [result] = batch.results
        assert not result.success and field in result.error and "surrogate" in result.error
    assert not (agent.workspace / "a.txt").exists()
    refused = await _refused(
        agent.stub.CheckPermission(
            pb.CheckPermissionRequest(
                session_id=session, tool_name="bash", arguments='{"command": "\\ud800"}'
            )
        )
    )
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "arguments" in refused.details()
    # The refused calls left a history the store holds and the server reads back.
    got = await agent.stub.GetSession(pb.GetSessionRequest(session_id=session))
    assert got.session.context_usage.message_count == 6  # a call and its result per batch


async def test_a_lone_surrogate_in_a_structured_schema_is_invalid_argument(
    agent: LiveServer, fake: FakeLLM
) -> None:
    session = await new_session(agent)
    request = pb.GenerateStructuredRequest(
        session_id=session, messages=[user("hi")], schema='{"type": "object", "description": "\\ud800"}'
    )
    refused = await _refused(agent.stub.GenerateStructured(request))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "schema" in refused.details() and "description" in refused.details()
    assert not fake.requests


async def test_a_lone_surrogate_in_the_models_tool_arguments_is_a_tool_error(
    agent: LiveServer, fake: FakeLLM
) -> None:
    fake.script(tool_call("read_file", '{"path": "\\ud800"}'), text("done"))
    session = await new_session(agent)
    reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("read it")]))
    [call] = reply.tool_calls
    assert not call.result.success
    assert "arguments for read_file" in call.result.error and "path" in call.result.error
    assert reply.message.content == "done"
    assert fake.requests[1].messages[-1]["role"] == "tool"  # the model was told, and went on


async def test_lone_surrogates_the_model_writes_become_replacement_characters(
    agent: LiveServer, fake: FakeLLM
) -> None:
    """A model's words are kept (a reply cannot be refused): its lone surrogates become U+FFFD."""
    fake.script(tool_call("read_file", '{"path": "\ud800"}'), text("bad \udfff text"))
    session = await new_session(agent)
    reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("hi")]))
    assert reply.message.content == "bad \ufffd text"
    [call] = reply.tool_calls
    assert call.arguments == '{"path": "\ufffd"}' and not call.result.success
    fake.script(text("again \ud800"))
    chunks = [
        c
        async for c in agent.stub.StreamGenerate(
            pb.GenerateRequest(session_id=session, messages=[user("hi")])
        )
    ]
    assert chunks[-1].content == "again \ufffd"
    got = await agent.stub.GetSession(pb.GetSessionRequest(session_id=session))
    assert got.session.context_usage.message_count == 6


# --- bounds on one request ---------------------------------------------------------------------


async def test_more_messages_than_the_limit_are_invalid_argument(live: LiveServer) -> None:
    limit = live.runtime.settings.max_request_messages
    assert limit == 10_000  # the default
    too_many = [user(f"m{i}") for i in range(limit + 1)]
    refused = await _refused(live.stub.CreateSession(pb.CreateSessionRequest(initial_context=too_many)))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "initial_context" in refused.details() and str(limit) in refused.details()
    session = await new_session(live)
    for call in (
        live.stub.Generate(pb.GenerateRequest(session_id=session, messages=too_many)),
        live.stub.GenerateStructured(
            pb.GenerateStructuredRequest(session_id=session, messages=too_many, schema='{"type": "object"}')
        ),
    ):
        refused = await _refused(call)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "messages" in refused.details() and str(limit) in refused.details()
    assert len((await live.stub.ListSessions(pb.ListSessionsRequest())).sessions) == 1
    created = await live.stub.CreateSession(pb.CreateSessionRequest(initial_context=too_many[:limit]))
    assert created.session.context_usage.message_count == limit


async def test_messages_beyond_the_size_bound_are_resource_exhausted(live: LiveServer) -> None:
    megabyte = "x" * (1 << 20)
    count = MAX_REQUEST_MESSAGE_SIZE // len(megabyte) + 1
    async with grpc.aio.insecure_channel(live.address, options=ROOMY) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        request = pb.CreateSessionRequest(initial_context=[user(megabyte) for _ in range(count)])
        refused = await _refused(stub.CreateSession(request, timeout=WAIT_S))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "initial_context" in refused.details() and str(MAX_REQUEST_MESSAGE_SIZE) in refused.details()
    assert (await live.stub.ListSessions(pb.ListSessionsRequest())).sessions == []


# --- a huge request does not starve other callers ---------------------------------------------


def test_health_checks_answer_while_a_huge_history_is_counted(tmp_path: Path) -> None:
    """Counting the tokens of megabytes takes seconds: health checks sent one after another while
    a GetContextUsage counts must be answered before it is. (Were the counting done on the event
    loop, none could be answered until it ended.)"""
    (tmp_path / "workspace").mkdir()
    server = LoggedServer(tmp_path / "workspace", tmp_path / "data", tmp_path / "server.log").start()
    try:
        seed = time.time_ns()  # contents no token cache has seen
        lines = "".join(
            f"def handler_{seed}_{i}(request):\n    return {i} * request\n" for i in range(20_000)
        )
        big = [user(f"{n}\n{lines}") for n in range(8)]  # about 8 MB
        with grpc.insecure_channel(server.address, options=ROOMY) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            created = stub.CreateSession(pb.CreateSessionRequest(initial_context=big), timeout=WAIT_S)
            assert created.session.context_usage.prompt_tokens > len(big) * 20_000
            # Another tokenizer (gpt-4's), so that the next count starts from nothing.
            stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=pb.LLMConfig(model="gpt-4"))))
            counting = stub.GetContextUsage.future(
                pb.GetContextUsageRequest(session_id=created.session_id), timeout=WAIT_S
            )
            answered = 0
            while answered < HEALTH_CHECKS and not counting.done():
                health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=WAIT_S)
                assert health.status == pb.HealthCheckResponse.STATUS_HEALTHY
                answered += not counting.done()
            usage = counting.result().usage
        assert answered == HEALTH_CHECKS, f"only {answered} health checks were answered while counting"
        assert usage.message_count == len(big) and usage.prompt_tokens > len(big) * 20_000
        assert usage.prompt_tokens != created.session.context_usage.prompt_tokens  # counted anew
    finally:
        server.kill()


# --- ListSessions over a big store, after a restart --------------------------------------------


def _list(stub: pb_grpc.CodeAgentServiceStub, **metadata: str) -> tuple[list[pb.Session], str | None]:
    reply, call = stub.ListSessions.with_call(
        pb.ListSessionsRequest(), metadata=tuple(metadata.items()), timeout=WAIT_S
    )
    trailing = dict(call.trailing_metadata() or ())
    return list(reply.sessions), trailing.get("a3s-next-page-token")


def test_list_sessions_after_a_restart_reads_no_history_and_pages(tmp_path: Path) -> None:
    workspace, data, sessions, messages = tmp_path / "workspace", tmp_path / "data", 40, 2000
    workspace.mkdir()
    write_sessions(data, workspace, sessions, messages)
    server = LoggedServer(workspace, data, tmp_path / "server.log").start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            every, token = _list(stub)
            assert token is None  # all of a small deployment in one reply, as before paging
            assert [s.session_id for s in every] == [session_id(n) for n in range(sessions)]
            assert {s.context_usage.message_count for s in every} == {messages}
            health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=WAIT_S)
            assert health.details["histories_in_memory"] == "0", "listing read histories"

            pages, token, metadata = [], None, {"a3s-page-size": "15"}
            while True:
                page, token = _list(stub, **metadata, **({"a3s-page-token": token} if token else {}))
                pages.append([s.session_id for s in page])
                if token is None:
                    break
                # A session listed already goes away between pages: the next page does not shift.
                if len(pages) == 1:
                    stub.DestroySession(
                        pb.DestroySessionRequest(session_id=page[0].session_id), timeout=WAIT_S
                    )
            assert [len(p) for p in pages] == [15, 15, 10]
            assert [sid for page in pages for sid in page] == [session_id(n) for n in range(sessions)]

            got = stub.GetSession(pb.GetSessionRequest(session_id=session_id(7)), timeout=WAIT_S).session
            assert got.context_usage.message_count == messages and got.context_usage.prompt_tokens > messages
            health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=WAIT_S)
            assert health.details["histories_in_memory"] == "1"

            for key, value in [("a3s-page-size", "0"), ("a3s-page-size", "1001"), ("a3s-page-size", "x"),
                               ("a3s-page-token", "not-a-token")]:  # fmt: skip
                with pytest.raises(grpc.RpcError) as err:
                    _list(stub, **{key: value})
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and key in err.value.details()
    finally:
        server.kill()


# --- a cap on direct tool calls at once --------------------------------------------------------


async def test_direct_tool_calls_beyond_the_cap_are_resource_exhausted(
    workspace: Path, tmp_path: Path
) -> None:
    settings = Settings(
        listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data", max_tool_calls=2
    )
    async with running(settings) as live:
        waiting = "touch started-{n}; for i in $(seq 600); do [ -e go ] && exit 0; sleep 0.05; done; exit 9"
        held = [
            asyncio.ensure_future(
                live.stub.ExecuteTool(
                    pb.ExecuteToolRequest(
                        tool_name="bash", arguments=f'{{"command": "{waiting.format(n=1)}"}}'
                    )
                )
            ),
            asyncio.ensure_future(
                live.stub.ExecuteToolBatch(
                    pb.ExecuteToolBatchRequest(
                        tool_calls=[
                            pb.ToolCall(name="bash", arguments=f'{{"command": "{waiting.format(n=2)}"}}')
                        ]
                    )
                )
            ),
        ]
        try:
            await until_exists(workspace / "started-1")
            await until_exists(workspace / "started-2")
            for call in (
                live.stub.ExecuteTool(pb.ExecuteToolRequest(tool_name="list_files", arguments="{}")),
                live.stub.ExecuteToolBatch(
                    pb.ExecuteToolBatchRequest(tool_calls=[pb.ToolCall(name="list_files", arguments="{}")])
                ),
            ):
                refused = await _refused(call)
                assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "A3S_MAX_TOOL_CALLS=2" in refused.details()
        finally:
            (workspace / "go").touch()
            first, second = await asyncio.wait_for(asyncio.gather(*held), WAIT_S)
        assert first.result.success and second.results[0].success
        after = await live.stub.ExecuteTool(pb.ExecuteToolRequest(tool_name="list_files", arguments="{}"))
        assert after.result.success


# --- session workspaces lie in the workspace root ----------------------------------------------


async def test_session_workspaces_outside_the_root_are_refused(live: LiveServer, tmp_path: Path) -> None:
    root = live.workspace.resolve()
    outside = tmp_path / "outside"
    outside.mkdir()
    (live.workspace / "inside").mkdir()
    (live.workspace / "escape").symlink_to(outside)
    session = await new_session(live)
    for workspace in [str(outside), "../outside", "escape", "inside/../../outside", "/"]:
        for call in (
            live.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(workspace=workspace))),
            live.stub.ConfigureSession(
                pb.ConfigureSessionRequest(session_id=session, config=pb.SessionConfig(workspace=workspace))
            ),
        ):
            refused = await _refused(call)
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, workspace
            assert "config.workspace" in refused.details() and str(root) in refused.details()
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(workspace="inside"))
    )
    assert created.session.config.workspace == str(root / "inside")
    got = await live.stub.GetSession(pb.GetSessionRequest(session_id=session))
    assert got.session.config.workspace == str(root)
    assert len((await live.stub.ListSessions(pb.ListSessionsRequest())).sessions) == 2


async def test_a_wider_workspace_root_admits_directories_beside_the_workspace(
    workspace: Path, tmp_path: Path
) -> None:
    beside = tmp_path / "beside"
    beside.mkdir()
    settings = Settings(
        listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data", workspace_root=tmp_path
    )
    async with running(settings) as live:
        created = await live.stub.CreateSession(
            pb.CreateSessionRequest(config=pb.SessionConfig(workspace=str(beside)))
        )
        assert created.session.config.workspace == str(beside.resolve())
        refused = await _refused(
            live.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(workspace="/")))
        )
        assert (
            refused.code() == grpc.StatusCode.INVALID_ARGUMENT
            and str(settings.resolved_workspace_root) in refused.details()
        )
