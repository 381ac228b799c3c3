"""The later dialect's own RPCs (a3s-string-dialect.md sections 3 and 4) over a real grpc.aio
channel with the later dialect's stubs: history paging and restore, todos, server-wide MCP servers
(against the real fixture MCP server), observability, and none of them UNIMPLEMENTED."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.base.prices import ModelPrice
from a3s_agent.config import Settings
from a3s_agent.faces import agent_service, later_service
from a3s_agent.faces.grpc import later_only
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, call, text, tool_call, tool_calls

from .conftest import (
    LiveServer,
    agent_settings,
    alive,
    eventually,
    fixture_readable,
    host_pid,
    initialize,
    new_session,
    running,
    user,
)

FIXTURE = str(Path(__file__).with_name("mcp_fixture.py"))
PATH = "/a3s.code.agent.v1.CodeAgentService/"
TOKEN = "s3cret-token"


@asynccontextmanager
async def later_server(
    settings: Settings,
) -> AsyncIterator[tuple[LiveServer, later_grpc.CodeAgentServiceStub]]:
    """The real server (conftest's `running`) and a later-dialect stub on its channel."""
    async with running(settings) as live:
        yield live, later_grpc.CodeAgentServiceStub(live.channel)


@pytest.fixture
async def served(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[tuple[LiveServer, Any]]:
    async with later_server(agent_settings(workspace, tmp_path / "data")) as (live, stub):
        await initialize(live, fake)
        yield live, stub


async def status_of(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


# --- every later-only RPC is served ---------------------------------------------------------------


SPEC_RPCS = 57  # spec section 3: the later-only RPCs of the TS and Code protos


async def test_no_later_only_rpc_is_unimplemented(served: tuple[LiveServer, Any]) -> None:
    """Each RPC of spec section 3 decodes its request (bytes that are not one are INVALID_ARGUMENT
    naming its message): none answers UNIMPLEMENTED."""
    live, _ = served
    assert len(set(later_service.SERVED_METHODS)) == SPEC_RPCS
    for name in later_service.SERVED_METHODS:
        method = later_only.SERVICE.methods_by_name[name]
        if method.server_streaming:
            error = await status_of(_drain(live.channel.unary_stream(PATH + name)(b"\xff\xff not protobuf")))
        else:
            error = await status_of(live.channel.unary_unary(PATH + name)(b"\xff\xff not protobuf"))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error.details())
        assert method.input_type.full_name in (error.details() or ""), error.details()


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def test_the_token_guards_the_later_only_rpcs(workspace: Path, tmp_path: Path) -> None:
    settings = replace(agent_settings(workspace, tmp_path / "data"), auth_token=TOKEN)
    async with later_server(settings) as (live, stub):
        bearer = (("authorization", f"Bearer {TOKEN}"),)
        for attempt in (
            stub.GetMessages(later.GetMessagesRequest(session_id="x")),
            stub.ListMcpServers(later.ListMcpServersRequest()),
            live.channel.unary_unary(PATH + "AgenticGenerate")(b""),
        ):
            assert (await status_of(attempt)).code() == grpc.StatusCode.UNAUTHENTICATED
        wrong = (("authorization", "Bearer nope"),)
        assert (
            await status_of(stub.ListMcpServers(later.ListMcpServersRequest(), metadata=wrong))
        ).code() == (grpc.StatusCode.UNAUTHENTICATED)
        reply = await stub.ListMcpServers(later.ListMcpServersRequest(), metadata=bearer)
        assert list(reply.servers) == []
        refused = await status_of(live.channel.unary_unary(PATH + "AgenticGenerate")(b"", metadata=bearer))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT  # let in: no prompt


# --- GetMessages and RestoreSession -----------------------------------------------------------


async def a_conversation(live: LiveServer, fake: FakeLLM) -> str:
    """A session whose history has every kind of message: system, user, an assistant's text and
    tool calls, a tool's success and failure, the final answer (8 messages)."""
    session_id = (
        await live.stub.CreateSession(
            pb.CreateSessionRequest(
                initial_context=[
                    pb.Message(role=pb.Message.ROLE_SYSTEM, content="be brief"),
                    pb.Message(
                        role=pb.Message.ROLE_USER,
                        content="earlier question",
                        attachments=[
                            pb.Attachment(type=pb.Attachment.TYPE_FILE, name="a.txt", content=b"abc")
                        ],
                    ),
                ]
            )
        )
    ).session_id
    (live.workspace / "notes.txt").write_text("hello notes")
    fake.script(
        tool_calls(
            [
                call("read_file", {"path": "notes.txt"}, id="c1"),
                call("read_file", {"path": "missing.txt"}, id="c2"),
            ],
            content="let me look",
        ),
        text("the notes say hello"),
    )
    await live.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("what do the notes say?")])
    )
    return session_id


async def test_get_messages_gives_the_history_in_a3s_shape(
    served: tuple[LiveServer, Any], fake: FakeLLM
) -> None:
    live, stub = served
    session_id = await a_conversation(live, fake)
    reply = await stub.GetMessages(later.GetMessagesRequest(session_id=session_id))
    assert reply.total_count == 7 and not reply.has_more
    roles = [m.role for m in reply.messages]
    assert roles == ["system", "user", "user", "assistant", "user", "user", "assistant"]
    assert [m.id for m in reply.messages] == [f"msg_{i}" for i in range(7)]
    question = reply.messages[1].content
    assert [b.text.text for b in question] == ["earlier question", "[file attachment: a.txt, 3 bytes]"]
    asking = reply.messages[3].content
    assert asking[0].text.text == "let me look"
    assert [(b.tool_use.id, b.tool_use.name) for b in asking[1:]] == [
        ("c1", "read_file"),
        ("c2", "read_file"),
    ]
    assert json.loads(asking[1].tool_use.arguments) == {"path": "notes.txt"}
    found, missing = reply.messages[4].content[0].tool_result, reply.messages[5].content[0].tool_result
    assert found.tool_use_id == "c1" and "hello notes" in found.content and not found.is_error
    assert missing.tool_use_id == "c2" and missing.is_error
    assert reply.messages[6].content[0].text.text == "the notes say hello"
    session = (await live.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert {m.timestamp for m in reply.messages} == {
        session.updated_at
    }  # the session's time: docs/guide/grpc-later.md
    assert all(not m.metadata for m in reply.messages)


async def test_get_messages_pages(served: tuple[LiveServer, Any], fake: FakeLLM) -> None:
    live, stub = served
    session_id = await a_conversation(live, fake)

    async def page(**given: int) -> tuple[list[str], int, bool]:
        reply = await stub.GetMessages(later.GetMessagesRequest(session_id=session_id, **given))
        return [m.id for m in reply.messages], reply.total_count, reply.has_more

    assert await page(limit=3) == (["msg_0", "msg_1", "msg_2"], 7, True)
    assert await page(offset=3, limit=3) == (["msg_3", "msg_4", "msg_5"], 7, True)
    assert await page(offset=6, limit=3) == (["msg_6"], 7, False)
    assert await page(offset=4, limit=3) == (["msg_4", "msg_5", "msg_6"], 7, False)  # offset + limit == total
    assert await page(offset=5) == (["msg_5", "msg_6"], 7, False)  # no limit: all the rest
    assert await page(offset=7, limit=5) == ([], 7, False)
    assert await page(offset=1000) == ([], 7, False)  # past the end
    assert await page(limit=0) == ([], 7, True)  # limit 0: nothing, more follows
    assert await page(offset=7, limit=0) == ([], 7, False)
    assert await page(offset=2**32 - 1, limit=2**32 - 1) == ([], 7, False)


async def test_get_messages_refusals(served: tuple[LiveServer, Any]) -> None:
    live, stub = served
    error = await status_of(stub.GetMessages(later.GetMessagesRequest(session_id="nope")))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "nope" in (error.details() or "")
    garbage = await status_of(live.channel.unary_unary(PATH + "GetMessages")(b"\x0a\xff\xff\xff"))
    assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "a3s.code.agent.v1.GetMessagesRequest" in (garbage.details() or "")


async def test_a_page_stops_at_what_one_reply_may_carry(
    served: tuple[LiveServer, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    live, stub = served
    big = "é" * 3000  # 6000 bytes of UTF-8
    session_id = (
        await live.stub.CreateSession(
            pb.CreateSessionRequest(initial_context=[user(big), user("x"), user(big)])
        )
    ).session_id
    monkeypatch.setattr(agent_service, "MAX_PAGE_BYTES", 10_000)
    first = await stub.GetMessages(later.GetMessagesRequest(session_id=session_id))
    assert [m.id for m in first.messages] == ["msg_0", "msg_1"] and first.has_more and first.total_count == 3
    assert first.messages[0].content[0].text.text == big
    rest = await stub.GetMessages(later.GetMessagesRequest(session_id=session_id, offset=2))
    assert [m.id for m in rest.messages] == ["msg_2"] and not rest.has_more
    # One message alone over the bound comes cut, marked, never as an empty page.
    monkeypatch.setattr(agent_service, "MAX_PAGE_BYTES", 2_000)
    cut = await stub.GetMessages(later.GetMessagesRequest(session_id=session_id, limit=3))
    assert [m.id for m in cut.messages] == ["msg_0"] and cut.has_more
    shortened = cut.messages[0].content[0].text.text
    assert shortened.startswith("é" * 500) and shortened.endswith(
        "characters cut: more than one reply carries]"
    )
    assert cut.messages[0].ByteSize() < 2_000


async def test_restore_session(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    settings = agent_settings(workspace, tmp_path / "data")
    async with later_server(settings) as (live, stub):
        await initialize(live, fake)
        fake.script(text("hello"))
        session_id = await new_session(live)
        await live.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("hi")]))
    async with later_server(settings) as (live, stub):  # a restart: sessions are stored
        reply = await stub.RestoreSession(later.RestoreSessionRequest(session_id=session_id))
        assert reply.success and reply.session_id == session_id
        assert reply.message == f"session {session_id} restored with 2 messages"
        unknown = await stub.RestoreSession(later.RestoreSessionRequest(session_id="gone"))
        assert not unknown.success and unknown.session_id == "gone" and "gone" in unknown.message
        empty = await status_of(stub.RestoreSession(later.RestoreSessionRequest()))
        assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- todos -----------------------------------------------------------------------------------


async def test_todos_round_trip(served: tuple[LiveServer, Any]) -> None:
    live, stub = served
    session_id = await new_session(live)
    assert list((await stub.GetTodos(later.GetTodosRequest(session_id=session_id))).todos) == []
    todos = [
        later.Todo(id="1", content="read the spec", status="completed", priority="high"),
        later.Todo(id="2", content="write the code", status="in_progress", priority="medium"),
        later.Todo(id="3", content="ünïcode ✓", status="pending", priority="low"),
    ]
    reply = await stub.SetTodos(later.SetTodosRequest(session_id=session_id, todos=todos))
    assert reply.success and list(reply.todos) == todos
    assert list((await stub.GetTodos(later.GetTodosRequest(session_id=session_id))).todos) == todos
    bad = later.Todo(id="4", content="x", status="someday", priority="low")
    error = await status_of(stub.SetTodos(later.SetTodosRequest(session_id=session_id, todos=[bad])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "someday" in (error.details() or "")
    assert list((await stub.GetTodos(later.GetTodosRequest(session_id=session_id))).todos) == todos
    await stub.SetTodos(later.SetTodosRequest(session_id=session_id))  # replaces: empty
    assert list((await stub.GetTodos(later.GetTodosRequest(session_id=session_id))).todos) == []
    missing = await status_of(stub.GetTodos(later.GetTodosRequest(session_id="nope")))
    assert missing.code() == grpc.StatusCode.NOT_FOUND


# --- MCP servers -----------------------------------------------------------------------------


def stdio_config(name: str, log: Path, enabled: bool = True) -> later.McpServerConfigProto:
    return later.McpServerConfigProto(
        name=name,
        transport=later.McpTransport(
            stdio=later.McpStdioTransport(command=sys.executable, args=[FIXTURE, "stdio"])
        ),
        enabled=enabled,
        env={"MCP_FIXTURE_LOG": str(log)},
    )


def http_config(name: str, url: str) -> later.McpServerConfigProto:
    return later.McpServerConfigProto(
        name=name, transport=later.McpTransport(http=later.McpHttpTransport(url=url)), enabled=True
    )


def started(log: Path) -> list[str]:
    return [
        line for line in (log.read_text().splitlines() if log.exists() else []) if line.startswith("started")
    ]


async def test_api_commands_need_the_operators_permission(
    served: tuple[LiveServer, Any], tmp_path: Path
) -> None:
    _, stub = served
    log = tmp_path / "fixture.log"
    reply = await stub.RegisterMcpServer(later.RegisterMcpServerRequest(config=stdio_config("fx", log)))
    assert not reply.success
    assert "fx would run a command" in reply.message and "--allow-api-mcp-commands" in reply.message
    assert started(log) == []
    assert list((await stub.ListMcpServers(later.ListMcpServersRequest())).servers) == []
    connect = await stub.ConnectMcpServer(later.ConnectMcpServerRequest(name="fx"))
    assert not connect.success and "no MCP server is registered as 'fx'" in connect.message
    assert not (await stub.DisconnectMcpServer(later.DisconnectMcpServerRequest(name="fx"))).success


async def test_hostile_configs_are_refused(served: tuple[LiveServer, Any]) -> None:
    live, stub = served
    for config, reason in (
        (http_config("web", "file:///etc/passwd"), "is not an http:// or https:// URL"),
        (http_config("web", "gopher://127.0.0.1:70/"), "is not an http:// or https:// URL"),
        (http_config("../etc", "https://mcp.example/mcp"), "the name must be 1-40 letters"),
        (http_config("", "https://mcp.example/mcp"), "the name must be 1-40 letters"),
        (replace_env(http_config("web", "https://mcp.example/mcp")), "env is for stdio servers"),
        (http_config("web", "https://mcp.example/" + "a" * 70_000), "at most 65536"),
    ):
        reply = await stub.RegisterMcpServer(later.RegisterMcpServerRequest(config=config))
        assert not reply.success and reason in reply.message, reply.message
    assert list((await stub.ListMcpServers(later.ListMcpServersRequest())).servers) == []
    missing = await status_of(stub.RegisterMcpServer(later.RegisterMcpServerRequest()))
    assert missing.code() == grpc.StatusCode.INVALID_ARGUMENT and "transport" in (missing.details() or "")
    # A loopback URL registers, but the request guard refuses to reach it (the API caller's URL).
    reply = await stub.RegisterMcpServer(
        later.RegisterMcpServerRequest(config=http_config("local", "http://127.0.0.1:9/mcp"))
    )
    assert not reply.success and "127.0.0.1 is a loopback address" in reply.message
    [info] = (await stub.ListMcpServers(later.ListMcpServersRequest())).servers
    assert (info.name, info.connected, info.enabled) == ("local", False, True)
    assert "loopback" in info.error
    # At most MAX_SERVERS registrations.
    for i in range(63):
        config = http_config(f"s{i}", "https://mcp.example/mcp")
        config.enabled = False
        assert (await stub.RegisterMcpServer(later.RegisterMcpServerRequest(config=config))).success
    config = http_config("one-more", "https://mcp.example/mcp")
    config.enabled = False
    reply = await stub.RegisterMcpServer(later.RegisterMcpServerRequest(config=config))
    assert not reply.success and "64 servers are registered" in reply.message
    assert live.runtime.mcp.registered.keys() >= {"local", "s0", "s62"}


def replace_env(config: later.McpServerConfigProto) -> later.McpServerConfigProto:
    config.env["TOKEN"] = "x"
    return config


async def test_a_registered_server_serves_the_model_while_connected(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    base = fixture_readable(agent_settings(workspace, tmp_path / "data"), tmp_path)
    settings = replace(base, allow_api_mcp_commands=True)
    async with later_server(settings) as (live, stub):
        await initialize(live, fake)
        reply = await stub.RegisterMcpServer(
            later.RegisterMcpServerRequest(config=stdio_config("fx", log, enabled=False))
        )
        assert reply.success and "not connected" in reply.message
        assert started(log) == []  # enabled=false: registered, not started
        [info] = (await stub.ListMcpServers(later.ListMcpServersRequest())).servers
        assert (info.name, info.connected, info.enabled, info.tool_count, info.HasField("error")) == (
            "fx",
            False,
            False,
            0,
            False,
        )

        connected = await stub.ConnectMcpServer(later.ConnectMcpServerRequest(name="fx"))
        assert connected.success and {"mcp__fx__echo", "mcp__fx__add"} <= set(connected.tool_names)
        assert len(started(log)) == 1
        [info] = (await stub.ListMcpServers(later.ListMcpServersRequest())).servers
        assert info.connected and info.enabled and info.tool_count == len(connected.tool_names)
        tools = (await stub.GetMcpTools(later.GetMcpToolsRequest(server_name="fx"))).tools
        add = next(t for t in tools if t.tool_name == "add")
        assert (add.full_name, add.server_name, add.description) == ("mcp__fx__add", "fx", "Add two numbers.")
        assert json.loads(add.input_schema)["required"] == ["a", "b"]
        assert list((await stub.GetMcpTools(later.GetMcpToolsRequest(server_name="other"))).tools) == []
        assert len((await stub.GetMcpTools(later.GetMcpToolsRequest())).tools) == len(tools)

        fake.script(tool_call("mcp__fx__echo", {"text": "hi"}), text("done"))
        session_id = await new_session(live)
        generated = await live.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("go")]))
        assert generated.tool_calls[0].result.output == "echo: hi"

        pid = host_pid(int(started(log)[0].split()[1]))
        assert (await stub.DisconnectMcpServer(later.DisconnectMcpServerRequest(name="fx"))).success
        await eventually(lambda: not alive(pid), "the server's process ended")
        [info] = (await stub.ListMcpServers(later.ListMcpServersRequest())).servers
        assert (info.connected, info.enabled) == (False, False)
        listed = (await live.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools
        assert not [t for t in listed if t.name.startswith("mcp__fx__")]
        # Registering it again with enabled=true connects it at once.
        again = await stub.RegisterMcpServer(later.RegisterMcpServerRequest(config=stdio_config("fx", log)))
        assert again.success and "connected" in again.message and len(started(log)) == 2


# --- observability and queue statistics ---------------------------------------------------------


async def test_metrics_after_a_generation_with_tool_calls(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    price = ModelPrice(input_per_mtok=1.0, output_per_mtok=2.0)
    settings = replace(agent_settings(workspace, tmp_path / "data"), model_prices={"fake-model": price})
    async with later_server(settings) as (live, stub):
        await initialize(live, fake)
        session_id = await a_conversation(live, fake)
        metrics = await stub.GetToolMetrics(later.GetToolMetricsRequest(session_id=session_id))
        [read] = metrics.tools
        assert (read.tool_name, read.total_calls, read.success_count, read.failure_count) == (
            "read_file",
            2,
            1,
            1,
        )
        assert metrics.total_calls == 2 and metrics.total_duration_ms == read.total_duration_ms
        assert read.min_duration_ms <= read.avg_duration_ms <= read.max_duration_ms
        assert read.last_called_at.startswith(str(datetime.now(UTC).year))
        everywhere = await stub.GetToolMetrics(later.GetToolMetricsRequest())
        assert everywhere.total_calls == 2
        assert list((await stub.GetToolMetrics(later.GetToolMetricsRequest(tool_name="bash"))).tools) == []

        cost = await stub.GetCostSummary(later.GetCostSummaryRequest(session_id=session_id))
        assert (
            cost.call_count == 2
            and cost.total_tokens == cost.total_prompt_tokens + cost.total_completion_tokens
        )
        assert cost.total_prompt_tokens > 0
        expected = (cost.total_prompt_tokens * 1.0 + cost.total_completion_tokens * 2.0) / 1e6
        assert cost.total_cost_usd == pytest.approx(expected)
        [model] = cost.by_model
        assert (model.model, model.call_count, model.total_tokens) == ("fake-model", 2, cost.total_tokens)
        [day] = cost.by_day
        assert day.date == datetime.now(UTC).date().isoformat() and day.call_count == 2
        assert (await stub.GetCostSummary(later.GetCostSummaryRequest(model="other"))).call_count == 0
        future = later.GetCostSummaryRequest(start_date="2999-01-01")
        assert (await stub.GetCostSummary(future)).call_count == 0
        bad = await status_of(stub.GetCostSummary(later.GetCostSummaryRequest(end_date="yesterday")))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and "end_date" in (bad.details() or "")

        stats = await stub.GetQueueStats(later.GetQueueStatsRequest(session_id=session_id))
        assert stats.HasField("control") and stats.HasField("generate") and stats.dead_letters == 0
        assert (stats.query.completed, stats.query.failed) == (1, 1)  # read_file runs in the query lane
        assert (stats.generate.completed, stats.generate.pending, stats.generate.active) == (1, 0, 0)
        for request in (
            stub.GetToolMetrics(later.GetToolMetricsRequest(session_id="nope")),
            stub.GetQueueStats(later.GetQueueStatsRequest(session_id="nope")),
        ):
            assert (await status_of(request)).code() == grpc.StatusCode.NOT_FOUND
