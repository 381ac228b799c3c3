"""The `todo` tool and the session's todo list: the model keeps it through the tool (the fake LLM
over HTTP), the app layer reads and replaces it, ExecuteTool over the Box gRPC face and the HTTP
face run it, it survives a restart of the server process, replicas on PostgreSQL share it, and
hostile lists are refused with the item and field named."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import grpc
import pytest

from a3s_agent.app import Application
from a3s_agent.base.errors import InvalidArgument, NotFound
from a3s_agent.base.models import Todo
from a3s_agent.config import Settings
from a3s_agent.core.store.events import EVENT, EventType
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import LiveServer, ServerProcess, new_session, running, user
from .test_http import serving

PLAN = [
    {"id": "1", "content": "Find the failing test", "status": "completed", "priority": "high"},
    {"id": "2", "content": "Fix the parser", "status": "in_progress"},
    {"id": "3", "content": "Run the whole suite", "priority": "low"},
]
STORED = [
    Todo("1", "Find the failing test", "completed", "high"),
    Todo("2", "Fix the parser", "in_progress", "medium"),
    Todo("3", "Run the whole suite", "pending", "low"),
]


def as_json(todos: list[Todo]) -> dict[str, Any]:
    return {"todos": [item.to_json() for item in todos]}


async def execute(live: LiveServer, session_id: str, arguments: object) -> pb.ToolResult:
    reply = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=session_id, tool_name="todo", arguments=json.dumps(arguments))
    )
    return reply.result


async def refused(live: LiveServer, session_id: str, arguments: object) -> str:
    """ExecuteTool's INVALID_ARGUMENT message for these arguments."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await execute(live, session_id, arguments)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    return err.value.details() or ""


# --- the model keeps its list ---------------------------------------------------------------------


async def test_the_model_writes_and_reads_its_list_through_the_tool(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(
        tool_call("todo", {"todos": PLAN}, content="Planning first."),
        tool_call("todo", {}),
        text("The parser is next."),
    )
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("fix it")]))
    assert reply.message.content == "The parser is next."

    offered = next(t for t in fake.requests[0].tools or [] if t["function"]["name"] == "todo")
    assert "todos" in offered["function"]["parameters"]["properties"]
    written, read = fake.requests[1].messages[-1], fake.requests[2].messages[-1]
    assert written["role"] == read["role"] == "tool"
    assert json.loads(written["content"]) == json.loads(read["content"]) == as_json(STORED)
    assert await Application(agent.runtime).todos.get(session_id) == STORED

    entries = await agent.runtime.store.read_log(session_id, 0, 1000)
    updates = [
        e for e in entries if e.kind == EVENT and e.body["data"].get("kind") == "todos_updated"
    ]  # one: reading the list changes nothing
    assert len(updates) == 1 and updates[0].body["type"] == EventType.INFO
    data = updates[0].body["data"]
    assert (data["count"], data["completed"], data["in_progress"], data["pending"]) == ("3", "1", "1", "1")
    assert json.loads(data["todos"]) == as_json(STORED)["todos"]


async def test_a_hostile_list_from_the_model_fails_the_call_and_changes_nothing(
    agent: LiveServer, fake: FakeLLM
) -> None:
    session_id = await new_session(agent)
    await Application(agent.runtime).todos.set(session_id, STORED)
    flood = [{"id": str(n), "content": "x"} for n in range(1000)]
    fake.script(
        tool_call("todo", {"todos": flood}),
        tool_call("todo", {"todos": [{"id": "1", "content": "y" * 100_000}]}),
        tool_call("todo", {"todos": [{"id": 1, "content": ["not", "text"]}]}),
        text("gave up"),
    )
    await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("plan")]))
    results = [request.messages[-1]["content"] for request in fake.requests[1:]]
    assert all(result.startswith("error: invalid arguments for todo") for result in results), results
    assert "1000 items; at most 100" in results[0]
    assert "todos[0] (id '1').content has 100000 characters; at most 2000" in results[1]
    assert "todos.0.id" in results[2] and "todos.0.content" in results[2]
    assert await Application(agent.runtime).todos.get(session_id) == STORED


# --- the app layer ----------------------------------------------------------------------------------


async def test_the_app_layer_replaces_and_reads_the_list(live: LiveServer) -> None:
    todos = Application(live.runtime).todos
    session_id = await new_session(live)
    assert await todos.get(session_id) == []
    assert await todos.set(session_id, STORED) == STORED
    most = [Todo(f"id-{n}", "c" * 2000) for n in range(100)]  # the limits themselves are fine
    assert await todos.set(session_id, most) == most
    assert await todos.set(session_id, []) == []
    assert await todos.get(session_id) == []
    with pytest.raises(NotFound):
        await todos.get("no-such-session")
    with pytest.raises(NotFound):
        await todos.set("no-such-session", STORED)


@pytest.mark.parametrize(
    ("todos", "message"),
    [
        ([Todo(str(n), "x") for n in range(1000)], "todos has 1000 items; at most 100"),
        ([Todo("a", "x" * 2001)], "todos[0] (id 'a').content has 2001 characters; at most 2000"),
        ([Todo("a", "x"), Todo(" ", "y")], "todos[1].id is empty"),
        ([Todo("a", " \n")], "todos[0] (id 'a').content is empty"),
        ([Todo("a", "x"), Todo("a", "y")], "todos[1] (id 'a').id is a duplicate"),
        ([Todo("a", "x", status="done")], "todos[0] (id 'a').status 'done' is not one of pending,"),
        ([Todo("a", "x", priority="urgent")], "todos[0] (id 'a').priority 'urgent' is not one of high,"),
        ([Todo("i" * 201, "x")], "todos[0].id has 201 characters; at most 200"),
        ([Todo(1, "x")], "todos[0].id must be a string"),  # type: ignore[arg-type]
        ([Todo("a", None)], "todos[0].content must be a string"),  # type: ignore[arg-type]
    ],
)
async def test_hostile_lists_are_refused_naming_the_item_and_field(
    live: LiveServer, todos: list[Todo], message: str
) -> None:
    app = Application(live.runtime)
    session_id = await new_session(live)
    await app.todos.set(session_id, STORED)
    with pytest.raises(InvalidArgument) as err:
        await app.todos.set(session_id, todos)
    assert message in str(err.value)
    assert await app.todos.get(session_id) == STORED


# --- the faces --------------------------------------------------------------------------------------


async def test_execute_tool_over_the_box_grpc_face(live: LiveServer) -> None:
    session_id = await new_session(live)
    written = await execute(live, session_id, {"todos": PLAN})
    assert written.success and json.loads(written.output) == as_json(STORED)
    assert written.metadata["count"] == "3" and written.metadata["completed"] == "1"
    read = await execute(live, session_id, {})
    assert read.success and json.loads(read.output) == as_json(STORED)

    assert "1000 items; at most 100" in await refused(
        live, session_id, {"todos": [{"id": str(n), "content": "x"} for n in range(1000)]}
    )
    assert "todos.0.id" in await refused(live, session_id, {"todos": [{"id": ["1"], "content": "x"}]})
    assert "todos.0.status" in await refused(
        live, session_id, {"todos": [{"id": "1", "content": "x", "status": "done"}]}
    )
    assert "todos.0.owner" in await refused(
        live, session_id, {"todos": [{"id": "1", "content": "x", "owner": "me"}]}
    )
    assert "todos" in await refused(live, session_id, {"todos": "1. fix it"})
    assert (await execute(live, session_id, {})).output == read.output  # nothing refused changed it

    cleared = await execute(live, session_id, {"todos": []})
    assert cleared.success and json.loads(cleared.output) == {"todos": []}
    without_session = await execute(live, "", {"todos": PLAN})
    assert not without_session.success and "belongs to a session" in without_session.error
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await execute(live, "no-such-session", {})
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_listed_like_every_tool_and_governed_by_permission_rules(live: LiveServer) -> None:
    listed = (await live.stub.ListTools(pb.ListToolsRequest())).tools
    todo = next(t for t in listed if t.name == "todo")
    assert list(todo.tags) == ["interaction", "query"]
    schema = json.loads(todo.parameters_schema)
    assert list(schema["properties"]) == ["todos"] and "required" not in schema
    caps = await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert "todo" in [t.name for t in caps.tools]

    session_id = await new_session(live)
    policy = pb.PermissionPolicy(enabled=True, deny=[pb.PermissionRule(rule="todo")])
    await live.stub.SetPermissionPolicy(pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy))
    checked = await live.stub.CheckPermission(
        pb.CheckPermissionRequest(session_id=session_id, tool_name="todo", arguments=json.dumps({}))
    )
    assert checked.decision == pb.PERMISSION_DECISION_DENY and list(checked.matching_rules) == ["todo"]


async def test_execute_tool_over_the_http_face(live: LiveServer) -> None:
    session_id = await new_session(live)
    async with serving(live) as http:
        written = await http.client.post(f"/sessions/{session_id}/tools/todo", json={"todos": PLAN})
        result = (await written.json())["result"]
        assert written.status == 200 and result["success"] and json.loads(result["output"]) == as_json(STORED)
        read = await http.client.post(f"/sessions/{session_id}/tools/todo", json={})
        assert json.loads((await read.json())["result"]["output"]) == as_json(STORED)
        bad = await http.client.post(
            f"/sessions/{session_id}/tools/todo", json={"todos": [{"id": "1", "content": "x" * 2001}]}
        )
        body = await bad.json()
        assert bad.status == 400 and body["error"]["code"] == "INVALID_ARGUMENT"
        assert "content has 2001 characters; at most 2000" in body["error"]["message"]


# --- stored with the session ------------------------------------------------------------------------


def test_the_list_survives_a_restart_of_the_server_process(server_process: ServerProcess) -> None:
    server_process.start()
    with server_process.channel() as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        session_id = stub.CreateSession(pb.CreateSessionRequest()).session_id
        arguments = json.dumps({"todos": PLAN})
        written = stub.ExecuteTool(
            pb.ExecuteToolRequest(session_id=session_id, tool_name="todo", arguments=arguments)
        )
        assert written.result.success
    assert server_process.stop() == 0
    server_process.start()  # the same workspace and data directory
    try:
        request = Request(
            f"http://127.0.0.1:{server_process.http_port}/sessions/{session_id}/tools/todo",
            data=b"{}",
            headers={"Content-Type": "application/json"},
        )
        with urlopen(request, timeout=10) as reply:
            result = json.loads(reply.read())["result"]
        assert result["success"] and json.loads(result["output"]) == as_json(STORED)
    finally:
        assert server_process.stop() == 0


@asynccontextmanager
async def replica(url: str, name: str, workspace: Path, data: Path) -> AsyncIterator[LiveServer]:
    settings = Settings(
        listen="127.0.0.1:0", workspace=workspace, data_dir=data / name, store=url, replica_id=name
    )
    async with running(settings) as server:
        yield server


async def test_replicas_on_postgresql_share_the_list_and_keep_it(
    postgres_url: str, workspace: Path, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(replica(postgres_url, "A", workspace, tmp_path))
        b = await stack.enter_async_context(replica(postgres_url, "B", workspace, tmp_path))
        session_id = await new_session(a)
        assert (await execute(a, session_id, {"todos": PLAN})).success
        assert await Application(b.runtime).todos.get(session_id) == STORED
        changed = [*STORED[:2], Todo("3", "Run the whole suite", "completed", "low")]
        await Application(b.runtime).todos.set(session_id, changed)
        assert json.loads((await execute(a, session_id, {})).output) == as_json(changed)
        updates = [
            e
            for e in await a.runtime.store.read_log(session_id, 0, 1000)
            if e.kind == EVENT and e.body["data"].get("kind") == "todos_updated"
        ]
        assert [e.body["data"]["completed"] for e in updates] == ["1", "2"]
    async with replica(postgres_url, "C", workspace, tmp_path) as c:
        assert await Application(c.runtime).todos.get(session_id) == changed
