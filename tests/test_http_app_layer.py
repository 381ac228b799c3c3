"""The HTTP face over the application layer, held to the gRPC face: every RPC of the service, over
/rpc/{method} and over the WebSocket, answers what the gRPC face answers for the same request (its
reply printed by json_format), on a real `a3s-agent serve` process; bad input is refused alike;
and the HTTP face imports no protobuf."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import json_format

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, text

from .conftest import ServerProcess, eventually

SERVICE = pb.DESCRIPTOR.services_by_name["CodeAgentService"]
VOLATILE = {"created_at", "updated_at", "timestamp", "timestamp_ms", "uptime_s", "duration_ms"}
"""Fields that tell when, not what: two calls one after the other differ in them."""
ANSWER = "The answer, from the fake model."
STRUCTURED = '{"answer": 42}'
SCHEMA = json.dumps({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]})


def as_json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def same_form(value: Any, ids: set[str]) -> Any:
    """`value` with session ids (`ids`: each face has sessions of its own) and times left out."""
    if isinstance(value, dict):
        return {k: "<time>" if k in VOLATILE else same_form(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [same_form(v, ids) for v in value]
    if isinstance(value, str):
        for session_id in ids:
            value = value.replace(session_id, "<session>")
    return value


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


@dataclass
class Face:
    """One way to call the server: `call` takes the RPC's name and its request JSON and returns the
    reply JSON (a list of them for a stream, up to `limit`) or {"error": {"code", "message"}}."""

    call: Callable[..., Any]
    session: str = ""
    """The face's own session: each face runs every case on a session of its own."""
    victim: str = ""
    """Another, to destroy."""


class Grpc:
    def __init__(self, stub: pb_grpc.CodeAgentServiceStub) -> None:
        self.stub = stub

    async def __call__(self, method: str, body: dict[str, Any], limit: int | None = None) -> Any:
        descriptor = SERVICE.methods_by_name[method]
        request = json_format.ParseDict(body, getattr(pb, descriptor.input_type.name)())
        try:
            if descriptor.server_streaming:
                call = getattr(self.stub, method)(request)
                replies = []
                async for reply in call:
                    replies.append(as_json(reply))
                    if limit is not None and len(replies) == limit:
                        call.cancel()
                        break
                return replies
            return as_json(await getattr(self.stub, method)(request))
        except grpc.aio.AioRpcError as exc:
            return error(exc.code().name, exc.details() or "")


class Rest:
    def __init__(self, client: aiohttp.ClientSession) -> None:
        self.client = client

    async def __call__(self, method: str, body: dict[str, Any], limit: int | None = None) -> Any:
        async with self.client.post(f"/rpc/{method}", json=body) as response:
            if response.content_type != "text/event-stream":
                reply = await response.json()
                if response.status != 200:
                    return error(reply["error"]["code"], reply["error"]["message"])
                return reply
            replies: list[Any] = []
            event = "message"
            async for raw in response.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    data = json.loads(line.removeprefix("data: "))
                    if event == "done":
                        break
                    if event == "error":
                        return error(data["error"]["code"], data["error"]["message"])
                    replies.append(data)
                    if limit is not None and len(replies) == limit:
                        break
            return replies


class Socket:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = count()

    async def __call__(self, method: str, body: dict[str, Any], limit: int | None = None) -> Any:
        call_id = next(self.ids)
        await self.ws.send_json({"method": method, "params": body, "id": call_id})
        streaming = SERVICE.methods_by_name[method].server_streaming
        replies: list[Any] = []
        while True:
            message = await self.ws.receive_json(timeout=30)
            assert message["id"] == call_id, message  # one call at a time on this socket
            if "error" in message:
                return error(message["error"]["code"], message["error"]["message"])
            if not streaming:
                return message["result"]
            if message.get("done"):
                return replies
            replies.append(message["result"])
            if limit is not None and len(replies) == limit:
                return replies  # the rest goes to a call id nobody reads: see first_event


@asynccontextmanager
async def faces_of(server: ServerProcess) -> AsyncIterator[tuple[Face, Face, Face]]:
    """The gRPC face, /rpc/{method} and the WebSocket of one server process."""
    async with (
        grpc.aio.insecure_channel(server.address) as channel,
        aiohttp.ClientSession(base_url=f"http://127.0.0.1:{server.http_port}") as client,
        client.ws_connect("/ws") as ws,
    ):
        yield (
            Face(Grpc(pb_grpc.CodeAgentServiceStub(channel))),
            Face(Rest(client)),
            Face(Socket(ws)),
        )


def started(tmp_path: Path, name: str) -> ServerProcess:
    workspace = tmp_path / name / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text("remember the milk\n")
    return ServerProcess(workspace, tmp_path / name / "data").start()


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[list[ServerProcess]]:
    """Three server processes: the sweep runs on the first; Shutdown ends one per face."""
    processes = await asyncio.gather(*(asyncio.to_thread(started, tmp_path, f"s{i}") for i in range(3)))
    yield list(processes)
    for process in processes:
        if process.proc is not None and process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait()


def user(content: str) -> dict[str, Any]:
    return {"role": "ROLE_USER", "content": content}


# Each case: the RPC, its request (a function of the calling face, for its own session), and how
# many model turns one call plays (scripted once per face).
Case = tuple[str, Callable[[Face], dict[str, Any]], int]
CASES: list[Case] = [
    ("HealthCheck", lambda f: {}, 0),
    ("GetCapabilities", lambda f: {}, 0),
    ("ListTools", lambda f: {}, 0),
    ("ListTools", lambda f: {"session_id": f.session}, 0),
    ("GetSession", lambda f: {"session_id": f.session}, 0),
    ("ListSessions", lambda f: {}, 0),
    (
        "ConfigureSession",
        lambda f: {
            "session_id": f.session,
            "config": {"system_prompt": "Be brief.", "llm": {"temperature": 0.7}},
        },
        0,
    ),
    ("GetContextUsage", lambda f: {"session_id": f.session}, 0),
    ("Generate", lambda f: {"session_id": f.session, "messages": [user("hi")]}, 1),
    (
        "StreamGenerate",
        lambda f: {"session_id": f.session, "messages": [user("again")], "options": {"enable_tools": True}},
        1,
    ),
    (
        "GenerateStructured",
        lambda f: {"session_id": f.session, "messages": [user("json")], "schema": SCHEMA},
        1,
    ),
    (
        "StreamGenerateStructured",
        lambda f: {"session_id": f.session, "messages": [user("json")], "schema": SCHEMA},
        1,
    ),
    (
        "ExecuteTool",
        lambda f: {"session_id": f.session, "tool_name": "read_file", "arguments": '{"path": "notes.txt"}'},
        0,
    ),
    ("ExecuteTool", lambda f: {"session_id": f.session, "tool_name": "no_such_tool", "arguments": "{}"}, 0),
    (
        "ExecuteToolBatch",
        lambda f: {
            "session_id": f.session,
            "tool_calls": [
                {"id": "a", "name": "read_file", "arguments": '{"path": "notes.txt"}'},
                {"id": "b", "name": "read_file", "arguments": '{"path": "missing.txt"}'},
            ],
        },
        0,
    ),
    (
        "RegisterTool",
        lambda f: {
            "session_id": f.session,
            "tool": {
                "name": "client_echo",
                "description": "Echo.",
                "parameters_schema": '{"type": "object"}',
            },
        },
        0,
    ),
    ("LoadSkill", lambda f: {"session_id": f.session, "skill_name": "word-count"}, 0),
    ("ListSkills", lambda f: {"session_id": f.session}, 0),
    ("UnloadSkill", lambda f: {"session_id": f.session, "skill_name": "word-count"}, 0),
    ("ClearContext", lambda f: {"session_id": f.session}, 0),
    ("CompactContext", lambda f: {"session_id": f.session}, 0),
    ("Cancel", lambda f: {"session_id": f.session}, 0),
    ("Pause", lambda f: {"session_id": f.session}, 0),
    ("Resume", lambda f: {"session_id": f.session}, 0),
    ("ConfirmToolExecution", lambda f: {"session_id": f.session, "tool_id": "t-1", "approved": True}, 0),
    (
        "SetConfirmationPolicy",
        lambda f: {
            "session_id": f.session,
            "policy": {
                "enabled": True,
                "require_confirm_tools": ["bash"],
                "default_timeout_ms": 5000,
                "yolo_lanes": ["SESSION_LANE_QUERY"],
            },
        },
        0,
    ),
    ("GetConfirmationPolicy", lambda f: {"session_id": f.session}, 0),
    (
        "SetLaneHandler",
        lambda f: {
            "session_id": f.session,
            "lane": "SESSION_LANE_EXECUTE",
            "config": {"mode": "TASK_HANDLER_MODE_EXTERNAL", "timeout_ms": "60000"},
        },
        0,
    ),
    ("GetLaneHandler", lambda f: {"session_id": f.session, "lane": "SESSION_LANE_EXECUTE"}, 0),
    ("ListPendingExternalTasks", lambda f: {"session_id": f.session}, 0),
    ("CompleteExternalTask", lambda f: {"session_id": f.session, "task_id": "nope", "success": True}, 0),
    (
        "SetPermissionPolicy",
        lambda f: {
            "session_id": f.session,
            "policy": {
                "deny": [{"rule": "bash(rm *)"}],
                "default_decision": "PERMISSION_DECISION_ASK",
                "enabled": True,
            },
        },
        0,
    ),
    ("AddPermissionRule", lambda f: {"session_id": f.session, "rule_type": "allow", "rule": "read_file"}, 0),
    ("GetPermissionPolicy", lambda f: {"session_id": f.session}, 0),
    (
        "CheckPermission",
        lambda f: {"session_id": f.session, "tool_name": "bash", "arguments": '{"command": "rm -r x"}'},
        0,
    ),
    ("GetSession", lambda f: {"session_id": f.session}, 0),
    ("DestroySession", lambda f: {"session_id": f.victim}, 0),
    ("DestroySession", lambda f: {"session_id": f.victim}, 0),  # a second time: NOT_FOUND
    ("GetSession", lambda f: {"session_id": "ghost"}, 0),
]


async def first_event(face: Face, creator: Face, ids: set[str]) -> Any:
    """The first SESSION_CREATED event a subscription over `face` sees. A subscription in another
    process cannot be waited for: `creator` creates sessions (their ids added to `ids`) until it
    has seen one."""
    stream = asyncio.create_task(face.call("SubscribeEvents", {"event_types": ["session_created"]}, limit=1))

    async def seen() -> bool:
        if not stream.done():
            ids.add((await creator.call("CreateSession", {"config": {"name": "probe"}}))["session_id"])
        return stream.done()

    await eventually(seen, "the subscription sees a session created")
    return await stream


async def test_every_rpc_answers_over_http_and_websocket_as_over_grpc(
    servers: list[ServerProcess], fake: FakeLLM
) -> None:
    main, second, third = servers
    called: set[str] = set()
    async with faces_of(main) as faces:
        grpc_face, rest, _ = faces

        async def sweep(method: str, request: Callable[[Face], dict[str, Any]], ids: set[str]) -> list[Any]:
            """The replies of each face, in the same form (sessions it creates join `ids`)."""
            called.add(method)
            replies = [await face.call(method, request(face)) for face in faces]
            if method == "CreateSession":
                ids |= {reply["session_id"] for reply in replies}
            answers = [same_form(reply, ids) for reply in replies]
            assert answers[1] == answers[0], (method, "over /rpc", answers)
            assert answers[2] == answers[0], (method, "over /ws", answers)
            return answers

        llm = {"llm": {"provider": "openai", "model": "fake-model", "base_url": fake.base_url}}
        assert (await sweep("Initialize", lambda f: {"config": llm}, set()))[0]["success"]
        ids: set[str] = set()
        for face in faces:
            face.session = (await grpc_face.call("CreateSession", {}))["session_id"]
            face.victim = (await grpc_face.call("CreateSession", {}))["session_id"]
            ids |= {face.session, face.victim}
        created = await sweep(
            "CreateSession", lambda f: {"config": {"name": "made"}, "initial_context": [user("x")]}, ids
        )
        assert created[0]["session"]["config"]["name"] == "made"

        for method, request, turns in CASES:
            fake.script(*[text(STRUCTURED if "Structured" in method else ANSWER)] * (turns * len(faces)))
            await sweep(method, request, ids)
        assert fake.remaining == 0

        events = [same_form(await first_event(face, grpc_face, ids), ids) for face in faces]
        assert events[0][0]["type"] == "EVENT_TYPE_SESSION_CREATED", events
        assert events[1] == events[0] and events[2] == events[0], events
        called.add("SubscribeEvents")

        # Shutdown ends a server: one per face, and the same reply from each.
        shutdown = [await rest.call("Shutdown", {})]
    async with faces_of(second) as (_, _, other_socket):
        shutdown.append(await other_socket.call("Shutdown", {}))
    async with faces_of(third) as (other_grpc, _, _):
        shutdown.append(await other_grpc.call("Shutdown", {}))
    assert shutdown == [{"success": True, "message": "shutting down"}] * 3
    called.add("Shutdown")
    assert called == {m.name for m in SERVICE.methods}, "every RPC of the service is in the sweep"
    for server in servers:
        assert server.proc is not None and server.proc.wait(15) == 0


# Bad input: (RPC, request JSON, status, code, words the message holds).
BAD = [
    ("CreateSession", {"bogus": 1}, 400, "INVALID_ARGUMENT", ["CreateSessionRequest", "bogus"]),
    ("GetSession", {"session_id": 5}, 400, "INVALID_ARGUMENT", ["GetSessionRequest", "session_id"]),
    ("Generate", {"messages": [{"role": "ROLE_WIZARD"}]}, 400, "INVALID_ARGUMENT", ["messages[0].role"]),
    ("Generate", {"messages": {"role": 1}}, 400, "INVALID_ARGUMENT", ["messages", "array"]),
    ("SetLaneHandler", {"session_id": "s", "lane": 9}, 400, "INVALID_ARGUMENT", ["lane must be"]),
    ("GetSession", [1], 400, "INVALID_ARGUMENT", ["GetSessionRequest", "JSON object, not an array"]),
    ("launch_rockets", {}, 501, "UNIMPLEMENTED", ["launch_rockets"]),
]


async def test_bad_input_is_refused_alike_over_rest_and_websocket(server_process: ServerProcess) -> None:
    (server_process.workspace / "notes.txt").write_text("x")
    server_process.start()
    async with (
        aiohttp.ClientSession(base_url=f"http://127.0.0.1:{server_process.http_port}") as client,
        client.ws_connect("/ws") as ws,
    ):
        for index, (method, body, status, code, words) in enumerate(BAD):
            async with client.post(f"/rpc/{method}", json=body) as reply:
                answer = await reply.json()
                assert reply.status == status and answer["error"]["code"] == code, (method, answer)
                assert all(word in answer["error"]["message"] for word in words), (method, answer)
            await ws.send_json({"method": method, "params": body, "id": index})
            over_ws = await ws.receive_json(timeout=10)
            assert over_ws == {"id": index, **answer}, (method, over_ws)
        async with client.post("/rpc/launch_rockets", json={}) as reply:
            assert "stream_generate" in (await reply.json())["error"]["details"]["methods"]
        async with client.post("/sessions/ghost/tools/read_file", json={"path": "notes.txt"}) as reply:
            assert reply.status == 404 and (await reply.json())["error"]["code"] == "NOT_FOUND"
    server_process.stop()


def test_the_http_face_imports_no_protobuf_or_grpc() -> None:
    """The face, its Agent Spaces routes and everything they import, in a fresh interpreter."""
    probe = (
        "import sys, a3s_agent.faces.http, a3s_agent.faces.http.spaces\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('google', 'grpc', 'grpc_health',"
        " 'grpc_reflection') or m.startswith(('a3s_agent.proto', 'a3s_agent.faces.grpc'))])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
