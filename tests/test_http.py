"""The HTTP face with a real aiohttp client, next to the in-process gRPC server: REST, SSE, WebSocket."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from a3s_agent.app import Application
from a3s_agent.config import Settings
from a3s_agent.faces.agent_service import FEATURES
from a3s_agent.faces.http import HttpBindError, start_http
from a3s_agent.faces.http import app as http_app
from a3s_agent.faces.later_service import served_features
from a3s_agent.faces.readiness import Readiness
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, broken_stream, text, tool_call

from .conftest import LiveServer, alive, eventually, host_pid, new_session, running, subscribed
from .test_spaces_http import spaces_server

USER = "ROLE_USER"
JSON = {"Content-Type": "application/json"}


@dataclass
class Http:
    client: aiohttp.ClientSession
    server: LiveServer
    port: int


@asynccontextmanager
async def serving(
    server: LiveServer,
    address: str = "127.0.0.1:0",
    trust: ssl.SSLContext | None = None,
    readiness: Readiness | None = None,
) -> AsyncIterator[Http]:
    """The HTTP face of `server` on `address`, and a client to it (over TLS trusting `trust`, if given)."""
    listener = await start_http(Application(server.runtime), address, readiness=readiness)
    base_url = f"{'https' if trust else 'http'}://127.0.0.1:{listener.port}"
    try:
        async with aiohttp.ClientSession(
            base_url=base_url, connector=aiohttp.TCPConnector(ssl=trust) if trust else None
        ) as client:
            yield Http(client, server, listener.port)
    finally:
        await listener.stop()


@pytest.fixture
async def rest(live: LiveServer) -> AsyncIterator[Http]:
    """Without an LLM."""
    async with serving(live) as http:
        yield http


@pytest.fixture
async def api(agent: LiveServer) -> AsyncIterator[Http]:
    """With the fake LLM configured."""
    async with serving(agent) as http:
        yield http


def user(content: str) -> dict[str, Any]:
    return {"role": USER, "content": content}


async def error_of(response: aiohttp.ClientResponse, status: int, code: str) -> str:
    """Assert the status and JSON error shape; the message."""
    body = await response.json()
    assert response.status == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    return body["error"]["message"]


async def sse(response: aiohttp.ClientResponse) -> list[tuple[str, Any]]:
    """(event, data) pairs of a server-sent event stream, until it ends; comments as (":", text)."""
    assert response.status == 200 and response.content_type == "text/event-stream"
    events: list[tuple[str, Any]] = []
    event, data = "message", None
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if data is not None:
                events.append((event, json.loads(data)))
            event, data = "message", None
        elif line.startswith(":"):
            events.append((":", line[1:].strip()))
        elif line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
    return events


# --- health and capabilities --------------------------------------------------------------


async def test_healthz_is_ok_while_serving_and_503_when_shutting_down(rest: Http) -> None:
    reply = await rest.client.get("/healthz")
    body = await reply.json()
    assert reply.status == 200
    assert body["status"] == "ok" and body["version"] == rest.server.runtime.info.version
    assert body["uptime_s"] >= 0 and body["sessions"] == 0
    rest.server.runtime.shutting_down = True
    reply = await rest.client.get("/healthz")
    assert reply.status == 503 and await reply.json() == {"status": "shutting_down"}
    health = await (await rest.client.get("/health")).json()
    assert health["status"] == "STATUS_UNHEALTHY" and health["message"] == "shutting down"


HEALTH_SCHEMA = "a3s.code.agent-health.v1"


async def test_the_probes_answer_without_the_token_and_whatever_the_host(
    workspace: Path, tmp_path: Path
) -> None:
    settings = Settings(workspace=workspace, data_dir=tmp_path / "data", auth_token="s3cret-token")
    async with running(settings) as server, serving(server) as http:
        foreign = {"Host": "attacker.example"}
        for path, status, body in [
            ("/health/live", 200, {"schema": HEALTH_SCHEMA, "status": "live"}),
            ("/health/ready", 200, {"schema": HEALTH_SCHEMA, "status": "ready"}),
            ("/healthz", 200, None),
        ]:
            for headers in (None, foreign):
                reply = await http.client.get(path, headers=headers)
                assert reply.status == status, path
                assert body is None or await reply.json() == body
        assert (await http.client.get("/sessions")).status == 401  # the token still guards the rest
        assert (await http.client.get("/sessions", headers=foreign)).status == 421
        server.runtime.shutting_down = True
        reply = await http.client.get("/health/ready")
        assert reply.status == 503 and await reply.json() == {"schema": HEALTH_SCHEMA, "status": "not_ready"}
        assert (await http.client.get("/health/live")).status == 200


async def test_a_starting_server_refuses_work_and_says_not_ready(rest: Http) -> None:
    readiness = Readiness(
        Application(rest.server.runtime).lifecycle
    )  # as the server's own, before every face listens
    async with serving(rest.server, readiness=readiness) as http:
        reply = await http.client.get("/health/ready")
        assert reply.status == 503 and (await reply.json())["status"] == "not_ready"
        assert (await http.client.get("/healthz")).status == 503
        message = await error_of(await http.client.post("/sessions", json={}), 503, "UNAVAILABLE")
        assert "starting" in message
        readiness.mark_ready()
        assert (await http.client.get("/health/ready")).status == 200
        assert (await http.client.post("/sessions", json={})).status == 201


async def test_a_stop_ends_a_running_stream_with_the_reason_after_the_grace(
    agent: LiveServer, fake: FakeLLM, tmp_path: Path
) -> None:
    marker = agent.workspace / "sleep.pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; exec sleep 60"}), text("never reached"))
    session = await new_session(agent)
    async with serving(agent, readiness=agent.server.readiness) as http:
        stream = await http.client.post(
            f"/sessions/{session}/generate/stream", json={"messages": [user("go")]}
        )
        sleep_pid = host_pid(
            int(await eventually(lambda: marker.exists() and marker.read_text().strip(), "the tool runs"))
        )
        stopping = asyncio.create_task(agent.server.stop(1.0))
        await asyncio.sleep(0)
        reply = await http.client.get("/health/ready")
        assert reply.status == 503 and (await reply.json())["status"] == "not_ready"
        message = await error_of(await http.client.post("/sessions", json={}), 503, "UNAVAILABLE")
        assert "shutting down" in message
        events = await sse(stream)
        await stopping
    event, data = events[-1]
    assert event == "error" and data["error"]["code"] == "UNAVAILABLE", events
    assert "the server stopped" in data["error"]["message"]
    assert not alive(sleep_pid)


async def test_health_and_capabilities_are_the_rpc_replies_as_json(rest: Http) -> None:
    health = await (await rest.client.get("/health")).json()
    assert health["status"] == "STATUS_HEALTHY" and health["message"] == "ok"
    assert health["details"]["version"] == rest.server.runtime.info.version
    capabilities = await (await rest.client.get("/capabilities")).json()
    assert capabilities["features"] == [
        *FEATURES,
        *served_features(False),
        "sandbox",
        "checkpoints",
    ]  # tool processes run in the OS sandbox; workspaces are checkpointed
    assert capabilities["info"]["name"] == "a3s-agent"
    assert {t["name"] for t in capabilities["tools"]} >= {"read_file", "bash"}
    assert capabilities["limits"]["max_tools_per_request"] == 50


# --- sessions -------------------------------------------------------------------------------


async def test_session_routes_share_the_core_with_grpc(rest: Http) -> None:
    client = rest.client
    created = await client.post(
        "/sessions", json={"session_id": "s1", "config": {"system_prompt": "Be terse."}}
    )
    body = await created.json()
    assert created.status == 201 and created.headers["Location"] == "/sessions/s1"
    assert body["session_id"] == "s1" and body["session"]["config"]["system_prompt"] == "Be terse."
    # The same session over gRPC: one core.
    grpc_view = await rest.server.stub.GetSession(pb.GetSessionRequest(session_id="s1"))
    assert grpc_view.session.config.system_prompt == "Be terse."

    camel = await client.post("/sessions", json={"sessionId": "s2"})  # the JSON mapping's other name
    assert camel.status == 201 and (await camel.json())["session_id"] == "s2"
    anonymous = await client.post("/sessions", headers=JSON)  # an empty body is an empty request
    assert anonymous.status == 201 and (await anonymous.json())["session_id"]

    listed = await (await client.get("/sessions")).json()
    assert {"s1", "s2"} <= {s["session_id"] for s in listed["sessions"]}
    one = await (await client.get("/sessions/s1")).json()
    assert one["session"]["session_id"] == "s1" and "context_usage" in one["session"]

    await error_of(await client.post("/sessions", json={"session_id": "s1"}), 409, "ALREADY_EXISTS")
    deleted = await client.delete("/sessions/s1")
    assert deleted.status == 200 and await deleted.json() == {"success": True}
    assert "s1" in await error_of(await client.get("/sessions/s1"), 404, "NOT_FOUND")
    await error_of(await client.delete("/sessions/s1"), 404, "NOT_FOUND")


async def test_an_unknown_confirmation_or_task_is_the_grpc_reply_as_json(rest: Http) -> None:
    """As A3S answers them: success=false and what is unknown, an unknown session still 404."""
    session_id = await new_session(rest.server)
    stub = rest.server.stub
    over_grpc = {
        "ConfirmToolExecution": await stub.ConfirmToolExecution(
            pb.ConfirmToolExecutionRequest(session_id=session_id, tool_id="t-9", approved=True)
        ),
        "CompleteExternalTask": await stub.CompleteExternalTask(
            pb.CompleteExternalTaskRequest(session_id=session_id, task_id="t-9", success=True)
        ),
    }
    for method, fields in (
        ("ConfirmToolExecution", {"tool_id": "t-9", "approved": True}),
        ("CompleteExternalTask", {"task_id": "t-9", "success": True}),
    ):
        reply = await rest.client.post(f"/rpc/{method}", json={"session_id": session_id, **fields})
        assert reply.status == 200 and await reply.json() == {
            "success": False,
            "error": over_grpc[method].error,
        }
        assert not over_grpc[method].success and "'t-9'" in over_grpc[method].error
        ghost = await rest.client.post(f"/rpc/{method}", json={"session_id": "ghost", **fields})
        assert "ghost" in await error_of(ghost, 404, "NOT_FOUND")


async def test_bad_requests_are_json_errors_naming_the_fault(rest: Http) -> None:
    client = rest.client
    message = await error_of(
        await client.post("/sessions", data=b"{not json", headers=JSON), 400, "INVALID_ARGUMENT"
    )
    assert "not valid JSON" in message
    message = await error_of(await client.post("/sessions", json={"bogus": 1}), 400, "INVALID_ARGUMENT")
    assert "bogus" in message and "CreateSessionRequest" in message
    message = await error_of(await client.post("/sessions", json=[1]), 400, "INVALID_ARGUMENT")
    assert "JSON object, not an array" in message
    message = await error_of(
        await client.post("/sessions/a/generate", json={"session_id": "b", "messages": [user("x")]}),
        400,
        "INVALID_ARGUMENT",
    )
    assert "differs" in message
    await error_of(
        await client.post("/sessions/ghost/generate", json={"messages": [user("x")]}), 404, "NOT_FOUND"
    )
    session_id = await new_session(rest.server)
    message = await error_of(
        await client.post(f"/sessions/{session_id}/generate", json={"messages": [user("x")]}),
        409,
        "FAILED_PRECONDITION",
    )
    assert "A3S_LLM_MODEL" in message  # no LLM configured: fix the state, retry the same request
    await error_of(await client.get("/nowhere"), 404, "NOT_FOUND")
    wrong_method = await client.put("/healthz")
    assert "GET" in wrong_method.headers["Allow"]
    await error_of(wrong_method, 405, "UNIMPLEMENTED")
    too_big = await client.post("/sessions", data=b" " * (16 * 1024 * 1024 + 1), headers=JSON)
    assert "exceeded" in await error_of(too_big, 413, "RESOURCE_EXHAUSTED")


async def test_any_rpc_by_name_and_unknown_names(rest: Http) -> None:
    tools = await rest.client.post("/rpc/list_tools", headers=JSON)
    assert tools.status == 200 and len((await tools.json())["tools"]) >= 20
    policy = await rest.client.post("/rpc/GetCapabilities", json={})
    assert (await policy.json())["features"] == [
        *FEATURES,
        *served_features(False),
        "sandbox",
        "checkpoints",
    ]  # tool processes run in the OS sandbox; workspaces are checkpointed
    unknown = await rest.client.post("/rpc/launch_rockets", headers=JSON)
    body = await unknown.json()
    assert unknown.status == 501 and body["error"]["code"] == "UNIMPLEMENTED"
    assert "stream_generate" in body["error"]["details"]["methods"]


# --- generation and tools -------------------------------------------------------------------


async def test_generate_and_execute_tool(api: Http, fake: FakeLLM) -> None:
    fake.script(text("Hello from the fake model."))
    session_id = await new_session(api.server)
    reply = await api.client.post(f"/sessions/{session_id}/generate", json={"messages": [user("hi")]})
    body = await reply.json()
    assert reply.status == 200, body
    assert body["session_id"] == session_id
    assert body["message"]["role"] == "ROLE_ASSISTANT"
    assert body["message"]["content"] == "Hello from the fake model."
    assert body["finish_reason"] == "FINISH_REASON_STOP" and int(body["usage"]["total_tokens"]) > 0

    (api.server.workspace / "notes.txt").write_text("remember the milk\n")
    ran = await api.client.post(f"/sessions/{session_id}/tools/read_file", json={"path": "notes.txt"})
    result = (await ran.json())["result"]
    assert ran.status == 200 and result["success"] and "remember the milk" in result["output"]
    failed = await api.client.post(f"/sessions/{session_id}/tools/read_file", json={"path": "missing.txt"})
    result = (await failed.json())["result"]
    assert failed.status == 200 and result["success"] is False and result["error"]  # a result, not an error
    await error_of(await api.client.post(f"/sessions/{session_id}/tools/nope", json={}), 404, "NOT_FOUND")
    await error_of(
        await api.client.post(f"/sessions/{session_id}/tools/read_file", json={}), 400, "INVALID_ARGUMENT"
    )
    message = await error_of(
        await api.client.post(f"/sessions/{session_id}/tools/read_file", json=["notes.txt"]),
        400,
        "INVALID_ARGUMENT",
    )
    assert "arguments" in message


async def test_stream_is_server_sent_events_in_order_ending_with_done(api: Http, fake: FakeLLM) -> None:
    fake.script(
        tool_call("read_file", {"path": "notes.txt"}, content="Reading the notes first."),
        text("The notes say: remember the milk."),
    )
    (api.server.workspace / "notes.txt").write_text("remember the milk\n")
    session_id = await new_session(api.server)
    response = await api.client.post(
        f"/sessions/{session_id}/generate/stream", json={"messages": [user("notes?")]}
    )
    events = await sse(response)
    assert response.headers["Cache-Control"] == "no-cache"
    assert events[-1] == ("done", {})
    chunks = [data for event, data in events[:-1] if event == "message"]
    assert len(chunks) == len(events) - 1
    kinds = [c["type"].removeprefix("CHUNK_TYPE_") for c in chunks]
    assert kinds[0] == "CONTENT" and kinds[-1] == "DONE" and kinds.count("DONE") == 1
    assert kinds.index("TOOL_CALL") < kinds.index("TOOL_RESULT")
    assert all(c["session_id"] == session_id for c in chunks)
    first_turn = "".join(c["content"] for c in chunks[: kinds.index("TOOL_CALL")])
    assert first_turn == "Reading the notes first."
    call = chunks[kinds.index("TOOL_CALL")]["tool_call"]
    assert call["name"] == "read_file" and json.loads(call["arguments"]) == {"path": "notes.txt"}
    assert "remember the milk" in chunks[kinds.index("TOOL_RESULT")]["tool_result"]["output"]
    assert chunks[-1]["content"] == "The notes say: remember the milk."
    assert chunks[-1]["metadata"]["finish_reason"] == "stop"


async def test_stream_by_get_takes_the_message_from_the_query(api: Http, fake: FakeLLM) -> None:
    fake.script(text("pong"))
    session_id = await new_session(api.server)
    events = await sse(
        await api.client.get(f"/sessions/{session_id}/generate/stream", params={"content": "ping"})
    )
    assert events[-1] == ("done", {}) and events[-2][1]["content"] == "pong"
    assert fake.requests[0].messages[-1] == {"role": "user", "content": "ping"}
    missing = await api.client.get(f"/sessions/{session_id}/generate/stream")
    assert "content" in await error_of(missing, 400, "INVALID_ARGUMENT")
    extra = await api.client.get(f"/sessions/{session_id}/generate/stream", params={"content": "x", "q": "y"})
    assert "unknown: q" in await error_of(extra, 400, "INVALID_ARGUMENT")
    # A failure before the first chunk is a plain error with its status, not a 200 stream.
    ghost = await api.client.get("/sessions/ghost/generate/stream", params={"content": "x"})
    await error_of(ghost, 404, "NOT_FOUND")


async def test_a_failure_mid_stream_is_an_error_event(api: Http, fake: FakeLLM) -> None:
    fake.script(broken_stream(text("this reply will be cut off before the end"), after_chunks=3))
    session_id = await new_session(api.server)
    events = await sse(
        await api.client.post(f"/sessions/{session_id}/generate/stream", json={"messages": [user("x")]})
    )
    event, data = events[-1]
    assert event == "error" and data["error"]["code"] == "UNAVAILABLE" and data["error"]["message"]
    assert len(events) > 1 and all(
        e == "message" and d["type"] == "CHUNK_TYPE_CONTENT" for e, d in events[:-1]
    )


async def test_a_quiet_stream_gets_keepalive_comments(
    api: Http, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_app, "KEEPALIVE_S", 0.05)
    fake.script(tool_call("bash", {"command": "sleep 0.3"}), text("done"))
    session_id = await new_session(api.server)
    events = await sse(
        await api.client.post(f"/sessions/{session_id}/generate/stream", json={"messages": [user("x")]})
    )
    assert (":", "keepalive") in events and events[-1] == ("done", {})


# --- WebSocket ------------------------------------------------------------------------------


class Socket:
    """A WebSocket client that keeps replies that arrive for other ids."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.received: list[dict[str, Any]] = []

    async def send(self, method: str, params: Any = None, id: Any = None) -> None:
        message: dict[str, Any] = {"method": method, "id": id}
        if params is not None:
            message["params"] = params
        await self.ws.send_json(message)

    async def next_for(self, id: Any) -> dict[str, Any]:
        """The next message for `id`, in arrival order."""
        while True:
            for i, message in enumerate(self.received):
                if message["id"] == id:
                    return self.received.pop(i)
            self.received.append(await self.ws.receive_json(timeout=5))

    async def call(self, method: str, params: Any = None, id: Any = "call") -> dict[str, Any]:
        await self.send(method, params, id)
        return await self.next_for(id)

    async def stream(self, method: str, params: Any, id: Any) -> list[dict[str, Any]]:
        """Every message of a streaming call, until `done` or an error."""
        await self.send(method, params, id)
        messages: list[dict[str, Any]] = []
        while not messages or not ({"done", "error"} & set(messages[-1])):
            messages.append(await self.next_for(id))
        return messages


@asynccontextmanager
async def socket_to(http: Http) -> AsyncIterator[Socket]:
    async with http.client.ws_connect("/ws") as ws:
        yield Socket(ws)


async def test_websocket_create_generate_and_stream(api: Http, fake: FakeLLM) -> None:
    fake.script(text("first answer"), text("second answer, streamed"))
    async with socket_to(api) as sock:
        created = await sock.call("create_session", {"config": {"system_prompt": "Be terse."}}, id=1)
        session_id = created["result"]["session_id"]
        assert created["id"] == 1 and created["result"]["session"]["config"]["system_prompt"] == "Be terse."
        reply = await sock.call("Generate", {"session_id": session_id, "messages": [user("one")]}, id="g")
        assert reply["result"]["message"]["content"] == "first answer"
        messages = await sock.stream(
            "stream_generate", {"session_id": session_id, "messages": [user("two")]}, id="s"
        )
        assert messages[-1] == {"id": "s", "done": True}
        chunks = [m["result"] for m in messages[:-1]]
        assert chunks[-1]["type"] == "CHUNK_TYPE_DONE" and chunks[-1]["content"] == "second answer, streamed"
        text_ = "".join(c["content"] for c in chunks if c["type"] == "CHUNK_TYPE_CONTENT")
        assert text_ == "second answer, streamed"
        history = await api.server.stub.GetSession(pb.GetSessionRequest(session_id=session_id))
        assert history.session.context_usage.message_count == 4


async def test_websocket_errors_answer_the_request_and_keep_the_socket(api: Http) -> None:
    async with socket_to(api) as sock:
        await sock.ws.send_str("{oops")
        bad_json = await sock.next_for(None)
        assert (
            bad_json["error"]["code"] == "INVALID_ARGUMENT"
            and "not valid JSON" in bad_json["error"]["message"]
        )
        unknown = await sock.call("launch_rockets", id=7)
        assert unknown["error"]["code"] == "UNIMPLEMENTED" and "launch_rockets" in unknown["error"]["message"]
        assert "subscribe_events" in unknown["error"]["details"]["methods"]
        not_object = await sock.call("get_session", ["s"], id=8)
        assert not_object["error"]["code"] == "INVALID_ARGUMENT"
        missing = await sock.call("get_session", {"session_id": "ghost"}, id=9)
        assert missing == {
            "id": 9,
            "error": {"code": "NOT_FOUND", "message": missing["error"]["message"], "details": None},
        }
        await sock.ws.send_json({"method": "health_check", "id": 10, "extra": True})
        assert "extra" in (await sock.next_for(10))["error"]["message"]
        await sock.ws.send_json(["health_check"])
        assert (await sock.next_for(None))["error"]["code"] == "INVALID_ARGUMENT"
        await sock.ws.send_bytes(b"{}")
        assert "text" in (await sock.next_for(None))["error"]["message"]
        healthy = await sock.call("HealthCheck", {}, id=11)
        assert healthy["result"]["status"] == "STATUS_HEALTHY"


async def test_websocket_events_arrive_while_a_generation_runs(api: Http, fake: FakeLLM) -> None:
    fake.script(tool_call("list_files", {}), text("done"))
    session_id = await new_session(api.server)
    async with socket_to(api) as sock:
        await sock.send("subscribe_events", {"session_id": session_id}, id="events")
        await sock.call("health_check", {}, id="sync")  # the subscription is in place by now
        reply = await sock.call("generate", {"session_id": session_id, "messages": [user("x")]}, id="gen")
        assert reply["result"]["message"]["content"] == "done"
        types = []
        while "EVENT_TYPE_GENERATION_COMPLETED" not in types:
            event = (await sock.next_for("events"))["result"]
            assert event["session_id"] == session_id
            types.append(event["type"])
        assert types[0] == "EVENT_TYPE_GENERATION_STARTED"
        assert types.index("EVENT_TYPE_TOOL_CALLED") < types.index("EVENT_TYPE_TOOL_COMPLETED")
    # Closing the socket ended the subscription on the server.
    await eventually(lambda: not api.server.runtime.events.subscriber_count, "no subscription left")


async def test_websocket_streams_run_side_by_side_and_cancel_reaches_the_run(
    api: Http, fake: FakeLLM
) -> None:
    gate = api.server.workspace / "gate"
    fake.script(
        tool_call("bash", {"command": f"until [ -e {gate} ]; do sleep 0.05; done"}),  # the slow one
        text("fast answer"),
        text("slow answer"),
        tool_call("bash", {"command": "sleep 30"}),  # the stuck one
    )
    slow, fast, stuck = [await new_session(api.server) for _ in range(3)]
    async with socket_to(api) as sock:
        await sock.send("stream_generate", {"session_id": slow, "messages": [user("slow")]}, id="slow")
        await sock.send("stream_generate", {"session_id": fast, "messages": [user("fast")]}, id="fast")
        fast_chunks = [await sock.next_for("fast")]
        while "result" in fast_chunks[-1]:
            fast_chunks.append(await sock.next_for("fast"))
        assert fast_chunks[-1]["done"] and fast_chunks[-2]["result"]["content"] == "fast answer"
        assert not any({"done", "error"} & set(m) for m in sock.received)  # the slow one goes on
        gate.touch()
        slow_chunks = [await sock.next_for("slow")]
        while "result" in slow_chunks[-1]:
            slow_chunks.append(await sock.next_for("slow"))
        assert slow_chunks[-1]["done"] and slow_chunks[-2]["result"]["content"] == "slow answer"

        # Sent at once: the cancel starts once the stream has, so it finds the run going.
        await sock.send("stream_generate", {"session_id": stuck, "messages": [user("stuck")]}, id="stuck")
        cancelled = await sock.call("cancel", {"session_id": stuck}, id="cancel")
        assert cancelled["result"] == {"success": True}
        last = await sock.next_for("stuck")
        while "result" in last:  # the chunks of the call before the cancel came
            last = await sock.next_for("stuck")
        assert last["error"]["code"] == "CANCELLED"


async def test_websocket_requests_start_in_the_order_they_arrive(api: Http, fake: FakeLLM) -> None:
    """Pipelined, without waiting for a reply: each request starts once the one before it has
    finished (a unary call) or started (a stream), so the subscription is in place for the new
    session before its generation begins."""
    fake.script(*[tool_call("list_files", {}), text("done")] * 3)
    async with socket_to(api) as sock:
        for n in range(3):
            session_id = f"piped-{n}"
            await sock.send("create_session", {"session_id": session_id}, id=f"create-{n}")
            await sock.send("get_session", {"session_id": session_id}, id=f"get-{n}")
            await sock.send("subscribe_events", {"session_id": session_id}, id=f"events-{n}")
            generate = {"session_id": session_id, "messages": [user("x")]}
            await sock.send("stream_generate", generate, id=f"generate-{n}")
            assert (await sock.next_for(f"create-{n}"))["result"]["session_id"] == session_id
            assert (await sock.next_for(f"get-{n}"))["result"]["session"]["session_id"] == session_id
            chunks = [await sock.next_for(f"generate-{n}")]
            while "result" in chunks[-1]:
                chunks.append(await sock.next_for(f"generate-{n}"))
            assert chunks[-1] == {"id": f"generate-{n}", "done": True}
            types: list[str] = []
            while "EVENT_TYPE_GENERATION_COMPLETED" not in types:
                reply = await sock.next_for(f"events-{n}")
                assert "result" in reply, reply
                types.append(reply["result"]["type"])
            assert types[0] == "EVENT_TYPE_GENERATION_STARTED", types
            assert "EVENT_TYPE_TOOL_COMPLETED" in types
        # The subscriptions run on side by side, one per session.
        assert api.server.runtime.events.subscriber_count == 3


# --- a client that goes away, and the control routes ---------------------------------------


async def drop_sse(api: Http, session_id: str) -> None:
    """Read `GET …/generate/stream` until the tool call, then go away without a word."""
    response = await api.client.get(f"/sessions/{session_id}/generate/stream", params={"content": "x"})
    async for line in response.content:
        if b"CHUNK_TYPE_TOOL_CALL" in line:
            break
    response.close()


async def drop_websocket(api: Http, session_id: str) -> None:
    """Read stream_generate on a socket until the tool call, then close the socket."""
    async with socket_to(api) as sock:
        await sock.send("stream_generate", {"session_id": session_id, "messages": [user("x")]}, id="s")
        while (await sock.next_for("s"))["result"]["type"] != "CHUNK_TYPE_TOOL_CALL":
            pass


def call_lines(caplog: pytest.LogCaptureFixture, method: str) -> list[str]:
    """The one-line-per-call log lines of `method`."""
    lines = [r.getMessage() for r in caplog.records if r.name == "a3s_agent.rpc"]
    return [line for line in lines if line.startswith(f"rpc {method} ")]


@pytest.mark.parametrize("go_away", [drop_sse, drop_websocket], ids=["sse", "websocket"])
async def test_a_client_going_away_leaves_the_run_going_until_the_cancel_route_stops_it(
    api: Http,
    fake: FakeLLM,
    caplog: pytest.LogCaptureFixture,
    go_away: Callable[[Http, str], Awaitable[None]],
) -> None:
    # The generation does not stop with its stream: the client may come back with Last-Event-ID
    # (tests/test_resume.py). POST /sessions/{id}/cancel stops it and its process.
    caplog.set_level("INFO", logger="a3s_agent.rpc")
    marker = api.server.workspace / "pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    session_id = await new_session(api.server)
    await go_away(api, session_id)
    pid = host_pid(
        int(await eventually(lambda: marker.exists() and marker.read_text().strip(), "the tool runs"))
    )
    # The call's log line says that the client went away, not that the run was cancelled.
    (line,) = await eventually(lambda: call_lines(caplog, "StreamGenerate"), "the stream's log line")
    assert f"session={session_id} status=DISCONNECTED " in line
    await eventually(lambda: api.server.runtime.events.subscriber_count == 0, "the stream is gone")
    await asyncio.sleep(0.2)  # what a disconnect would have stopped by now
    assert alive(pid)
    cancelled = await api.client.post(f"/sessions/{session_id}/cancel", headers=JSON)
    assert cancelled.status == 200 and await cancelled.json() == {"success": True}
    await eventually(lambda: not alive(pid), "the tool's process is gone")
    assert len(fake.requests) == 1  # the run stopped; the model was not called again
    assert f"session={session_id} status=OK " in call_lines(caplog, "Cancel")[0]
    assert "ghost" in await error_of(
        await api.client.post("/sessions/ghost/cancel", headers=JSON), 404, "NOT_FOUND"
    )


async def test_pause_resume_and_confirmations_have_rest_routes(api: Http, fake: FakeLLM) -> None:
    session_id = await new_session(api.server)
    paused = await api.client.post(f"/sessions/{session_id}/pause", headers=JSON)
    assert paused.status == 200 and await paused.json() == {"success": True}
    view = await (await api.client.get(f"/sessions/{session_id}")).json()
    assert view["session"]["state"] == "SESSION_STATE_PAUSED"
    refused = await api.client.post(f"/sessions/{session_id}/generate", json={"messages": [user("x")]})
    assert "paused" in await error_of(refused, 409, "FAILED_PRECONDITION")
    resumed = await api.client.post(f"/sessions/{session_id}/resume", headers=JSON)
    assert resumed.status == 200 and await resumed.json() == {"success": True}
    view = await (await api.client.get(f"/sessions/{session_id}")).json()
    assert view["session"]["state"] == "SESSION_STATE_ACTIVE"

    policy = {
        "enabled": True,
        "require_confirm_tools": ["write_file"],
        "default_timeout_ms": 60000,
        "timeout_action": "TIMEOUT_ACTION_REJECT",
    }
    set_policy = await api.client.post(
        "/rpc/SetConfirmationPolicy", json={"session_id": session_id, "policy": policy}
    )
    assert set_policy.status == 200, await set_policy.text()
    fake.script(tool_call("write_file", {"path": "c.txt", "content": "x"}), text("written"))
    response = await api.client.post(
        f"/sessions/{session_id}/generate/stream", json={"messages": [user("write c.txt")]}
    )
    tool_id = ""
    async for raw in response.content:
        line = raw.decode()
        if line.startswith("data: ") and "confirmation_required" in line:
            tool_id = json.loads(line.removeprefix("data: "))["metadata"]["tool_id"]
            break
    assert tool_id and not (api.server.workspace / "c.txt").exists()
    confirmations = f"/sessions/{session_id}/confirmations"
    unknown = await api.client.post(f"{confirmations}/nope", json={"approved": True})
    body = await unknown.json()
    assert unknown.status == 200 and body["success"] is False and "'nope'" in body["error"]
    conflicting = await api.client.post(
        f"{confirmations}/{tool_id}", json={"session_id": "other", "approved": True}
    )
    assert "differs" in await error_of(conflicting, 400, "INVALID_ARGUMENT")
    approved = await api.client.post(f"{confirmations}/{tool_id}", json={"approved": True, "reason": "ok"})
    assert approved.status == 200 and (await approved.json())["success"] is True
    rest = await sse(response)
    assert rest[-1] == ("done", {}) and rest[-2][1]["content"] == "written"
    assert (api.server.workspace / "c.txt").read_text() == "x"
    for route in ("pause", "resume", "confirmations/t-1"):
        ghost = await api.client.post(f"/sessions/ghost/{route}", json={})
        assert "ghost" in await error_of(ghost, 404, "NOT_FOUND"), route


async def test_stopping_the_listener_closes_websockets(agent: LiveServer) -> None:
    listener = await start_http(Application(agent.runtime), "127.0.0.1:0")
    async with (
        aiohttp.ClientSession() as client,
        client.ws_connect(f"http://127.0.0.1:{listener.port}/ws") as ws,
    ):
        await ws.send_json({"method": "subscribe_events", "params": {}, "id": 1})
        await subscribed(agent)
        stopping = asyncio.create_task(listener.stop())
        closing = await ws.receive(timeout=5)
        assert closing.type == aiohttp.WSMsgType.CLOSE and closing.extra == "server shutting down"
        assert ws.close_code == aiohttp.WSCloseCode.GOING_AWAY
        await asyncio.wait_for(stopping, 5)


# --- the listener ---------------------------------------------------------------------------


async def test_a_taken_port_is_a_clear_error(live: LiveServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(HttpBindError, match=f"cannot listen for HTTP on {address}: already in use"):
            await start_http(Application(live.runtime), address)
    with pytest.raises(HttpBindError, match="HOST:PORT"):
        await start_http(Application(live.runtime), "no-port")


# Bodies a client can get wrong, and the start of the one error every JSON route answers them with.
BAD_BODIES = {
    b"{not json": "the request body: not valid JSON",
    b'{"session_id":"\xff"}': "the request body: not valid UTF-8",
    b'{"session_id":"\\ud800"}': "the request body: the string at session_id holds a lone surrogate",
    b"[" * 100_000: "the request body: not valid JSON: nested too deeply",
}


async def test_every_json_route_reads_its_body_one_way(workspace: Path, tmp_path: Path) -> None:
    """REST, /rpc and the Agent Spaces routes refuse a bad body with the same 400, a WebSocket
    message gets the same words, and an empty body is an empty object everywhere."""
    async with spaces_server(workspace, tmp_path / "data") as served:
        client = served.http
        async with client.post("/v1/spaces", data=b"", headers=JSON) as reply:  # empty: {}, a new space
            assert reply.status == 201, await reply.text()
            space = (await reply.json())["spaceId"]
        session = await new_session(served.live)
        routes = [
            "/sessions",
            f"/sessions/{session}/generate",
            f"/sessions/{session}/tools/read_file",
            f"/sessions/{session}/cancel",
            f"/sessions/{session}/confirmations/t-1",
            "/rpc/create_session",
            "/v1/spaces",
            f"/v1/spaces/{space}/runs",
            f"/v1/spaces/{space}/runs/run-1/resume",
        ]
        for route in routes:
            for body, expected in BAD_BODIES.items():
                async with client.post(route, data=body, headers=JSON) as reply:
                    message = await error_of(reply, 400, "INVALID_ARGUMENT")
                    assert message.startswith(expected), (route, body[:20], message)
        async with client.post("/sessions", data=b"  \n", headers=JSON) as reply:  # blank: {}, a new session
            assert reply.status == 201, await reply.text()
        async with client.ws_connect("/ws") as ws:
            await ws.send_bytes(b"")  # a binary frame is refused before any parsing
            assert "JSON text frames" in (await ws.receive_json(timeout=5))["error"]["message"]
            await ws.send_str('{"method":"health_check","id":"\\udc00"}')
            error = (await ws.receive_json(timeout=5))["error"]
            assert error["code"] == "INVALID_ARGUMENT"
            assert error["message"].startswith("the message: the string at id holds a lone surrogate"), error
        # No refused body made a session: only new_session's and the blank body's are there.
        listed = await served.live.stub.ListSessions(pb.ListSessionsRequest())
        assert len(listed.sessions) == 2, listed
