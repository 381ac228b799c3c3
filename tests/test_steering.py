"""Steering a running generation (core/loop/steering.py): a message sent while the agent works is
taken in at the run's next safe point and answered before the run ends, over HTTP
(`POST /sessions/{id}/steer`) and gRPC (Generate with `a3s-steer: true`), against a real server
with real clients."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from a3s_agent.app import Application
from a3s_agent.config import Settings
from a3s_agent.faces.http import start_http
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import text, tool_call

from .conftest import LiveServer, eventually, new_session, running, user
from .scripted_model import ScriptedProvider, after
from .test_http import JSON, Http, error_of, serving, sse

STEER_APPLIED = "steer_applied"


def heard(body: dict[str, Any]) -> Any:
    """A model turn that answers the last message it was sent, whoever sent it."""
    return text(f"heard: {body['messages'][-1]['content']}")


@pytest.fixture
async def http(scripted_agent: LiveServer) -> AsyncIterator[Http]:
    async with serving(scripted_agent) as served:
        yield served


async def start_stream(http: Http, session_id: str, content: str) -> aiohttp.ClientResponse:
    body = {"messages": [{"role": "ROLE_USER", "content": content}]}
    response = await http.client.post(f"/sessions/{session_id}/generate/stream", json=body)
    assert response.status == 200, await response.text()
    return response


async def steer(http: Http, session_id: str, body: object) -> aiohttp.ClientResponse:
    return await http.client.post(f"/sessions/{session_id}/steer", data=json.dumps(body), headers=JSON)


async def whole_stream(http: Http, session_id: str, content: str) -> list[dict[str, Any]]:
    """The chunks of a generation's stream, to its end (its reply's headers come with its first chunk)."""
    return chunks(await sse(await start_stream(http, session_id, content)))


def chunks(events: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [data for event, data in events if event == "message"]


async def logged_steers(http: Http, session_id: str) -> list[dict[str, Any]]:
    page = await (await http.client.get(f"/sessions/{session_id}/events")).json()
    return [e for e in page["events"] if e["kind"] == "event" and e.get("message") == STEER_APPLIED]


async def test_a_steer_sent_during_a_tool_call_is_taken_in_before_the_next_model_request(
    http: Http, scripted: ScriptedProvider
) -> None:
    session_id = await new_session(http.server)
    policy = {"enabled": True, "require_confirm_tools": ["write_file"], "default_timeout_ms": 60000}
    await http.client.post("/rpc/SetConfirmationPolicy", json={"session_id": session_id, "policy": policy})
    scripted.script(tool_call("write_file", {"path": "a.txt", "content": "x"}), heard)
    stream = await start_stream(http, session_id, "write a.txt")
    tool_id = ""
    async for raw in stream.content:  # the run holds in its tool call until confirmed
        line = raw.decode()
        if line.startswith("data: ") and "confirmation_required" in line:
            tool_id = json.loads(line.removeprefix("data: "))["metadata"]["tool_id"]
            break
    assert tool_id

    steered = await steer(http, session_id, {"content": "use tabs, not spaces"})
    assert steered.status == 202, await steered.text()
    steer_id = (await steered.json())["steer_id"]
    assert steer_id and await logged_steers(http, session_id) == []  # not taken in yet: a tool runs
    await http.client.post(f"/sessions/{session_id}/confirmations/{tool_id}", json={"approved": True})

    seen = chunks(await sse(stream))
    kinds = [c.get("metadata", {}).get("type") or c["type"] for c in seen]
    applied = kinds.index(STEER_APPLIED)
    assert kinds.index("CHUNK_TYPE_TOOL_RESULT") < applied, kinds  # after the call ended
    assert seen[applied]["metadata"]["steer_id"] == steer_id
    assert seen[-1]["content"] == "heard: use tabs, not spaces"
    assert len(scripted.requests) == 2
    sent = scripted.requests[1].messages
    assert [m["role"] for m in sent[-3:]] == ["assistant", "tool", "user"]
    assert sent[-1]["content"] == "use tabs, not spaces"
    [event] = await logged_steers(http, session_id)
    assert event["data"]["steer_id"] == steer_id and event["data"]["content"] == "use tabs, not spaces"
    history = await http.server.runtime.sessions.history(session_id)
    assert [m.content for m in history if m.role == "user"] == ["write a.txt", "use tabs, not spaces"]


async def test_a_steer_sent_while_the_model_answers_keeps_the_run_going_to_answer_it(
    http: Http, scripted: ScriptedProvider
) -> None:
    session_id = await new_session(http.server)
    released = asyncio.Event()
    scripted.script(after(released, text("the first answer")), heard)
    stream = asyncio.create_task(whole_stream(http, session_id, "hello"))
    await eventually(lambda: scripted.requests or None, "the first model call")
    steered = await steer(http, session_id, {"content": "and in French?"})
    assert steered.status == 202, await steered.text()
    released.set()

    seen = await asyncio.wait_for(stream, 30)
    texts = "".join(c.get("content", "") for c in seen if c["type"] == "CHUNK_TYPE_CONTENT")
    assert "the first answer" in texts and seen[-1]["content"] == "heard: and in French?"
    assert len(scripted.requests) == 2
    late = await steer(http, session_id, {"content": "too late"})  # the run is over
    assert "new prompt" in await error_of(late, 409, "FAILED_PRECONDITION")


async def test_steer_refuses_bad_input_and_other_sessions_runs_stay_untouched(
    http: Http, scripted: ScriptedProvider
) -> None:
    session_id = await new_session(http.server)
    idle = await new_session(http.server)
    released = asyncio.Event()
    scripted.script(after(released, text("done")))
    stream = asyncio.create_task(whole_stream(http, session_id, "work"))
    await eventually(lambda: scripted.requests or None, "the model call")

    for body, named in [
        ({}, "content is required"),
        ({"content": 5}, "content must be a string"),
        ({"content": "   "}, "content"),
        ({"content": "x", "role": "system"}, "role"),
        (["content"], "JSON object"),
    ]:
        refused = await steer(http, session_id, body)
        assert named in await error_of(refused, 400, "INVALID_ARGUMENT"), body
    malformed = await http.client.post(f"/sessions/{session_id}/steer", data="{", headers=JSON)
    await error_of(malformed, 400, "INVALID_ARGUMENT")
    assert "ghost" in await error_of(await steer(http, "ghost", {"content": "x"}), 404, "NOT_FOUND")
    # The idle session's id does not reach the run of the other.
    await error_of(await steer(http, idle, {"content": "not yours"}), 409, "FAILED_PRECONDITION")
    huge = await steer(http, session_id, {"content": "x" * (17 * 1024 * 1024)})
    assert huge.status == 413

    released.set()
    seen = await asyncio.wait_for(stream, 30)
    assert seen[-1]["content"] == "done" and len(scripted.requests) == 1
    assert await logged_steers(http, session_id) == [] and await logged_steers(http, idle) == []


async def collected(call: Any) -> list[pb.GenerateChunk]:
    return [chunk async for chunk in call]


async def test_generate_with_the_steer_metadata_steers_the_running_generation(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    stub = scripted_agent.stub
    session_id = await new_session(scripted_agent)
    steering = (("a3s-steer", "true"),)

    with pytest.raises(grpc.aio.AioRpcError) as none_runs:
        await stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("x")]), metadata=steering
        )
    assert none_runs.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no generation is running" in (none_runs.value.details() or "")

    released = asyncio.Event()
    scripted.script(after(released, text("first")), heard)
    request = pb.GenerateRequest(session_id=session_id, messages=[user("hello")])
    stream = asyncio.create_task(collected(stub.StreamGenerate(request)))
    await eventually(lambda: scripted.requests or None, "the first model call")

    for messages in ([user("a"), user("b")], [pb.Message(role=pb.Message.ROLE_SYSTEM, content="a")]):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.Generate(
                pb.GenerateRequest(session_id=session_id, messages=messages), metadata=steering
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "one user message" in (bad.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as bad_flag:
        await stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("a")]), metadata=(("a3s-steer", "yes"),)
        )
    assert bad_flag.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "a3s-steer" in (
        bad_flag.value.details() or ""
    )

    call = stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("say more")]), metadata=steering
    )
    reply = await call
    trailing = dict(await call.trailing_metadata() or ())
    assert reply.metadata["steer_id"] and trailing["a3s-steer-id"] == reply.metadata["steer_id"]
    released.set()
    seen = await asyncio.wait_for(stream, 30)
    applied = [c for c in seen if c.metadata.get("type") == STEER_APPLIED]
    assert [c.metadata["steer_id"] for c in applied] == [reply.metadata["steer_id"]]
    assert seen[-1].type == pb.GenerateChunk.CHUNK_TYPE_DONE
    assert any(c.content == "heard: say more" for c in seen)


async def test_a_steer_without_the_token_is_refused(workspace: Path, tmp_path: Path) -> None:
    token = "s3cret-token"
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "d", auth_token=token)
    async with running(settings) as server:
        good = (("authorization", f"Bearer {token}"),)
        session_id = (await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=good)).session_id
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await server.stub.Generate(
                pb.GenerateRequest(session_id=session_id, messages=[user("x")]),
                metadata=(("a3s-steer", "true"),),
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        listener = await start_http(Application(server.runtime), "127.0.0.1:0")
        url = f"http://127.0.0.1:{listener.port}/sessions/{session_id}/steer"
        try:
            async with aiohttp.ClientSession() as client:
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    async with client.post(url, json={"content": "x"}, headers=headers) as reply:
                        assert reply.status == 401, headers
                async with client.post(
                    url, json={"content": "x"}, headers={"Authorization": f"Bearer {token}"}
                ) as reply:
                    assert reply.status == 409  # through the token: no generation runs
        finally:
            await listener.stop()


async def test_a_steer_its_run_never_took_in_stays_in_the_history(
    http: Http, scripted: ScriptedProvider
) -> None:
    session_id = await new_session(http.server)
    released = asyncio.Event()
    scripted.script(after(released, text("never seen")))
    body = {"messages": [{"role": "ROLE_USER", "content": "work"}]}
    stream = asyncio.create_task(http.client.post(f"/sessions/{session_id}/generate/stream", json=body))
    await eventually(lambda: scripted.requests or None, "the model call")
    steered = await steer(http, session_id, {"content": "and also this"})
    assert steered.status == 202
    cancelled = await http.client.post(f"/sessions/{session_id}/cancel", json={})
    assert (await cancelled.json())["success"] is True
    released.set()
    assert "cancelled" in await error_of(await asyncio.wait_for(stream, 30), 499, "CANCELLED")
    history = await http.server.runtime.sessions.history(session_id)
    assert [m.content for m in history if m.role == "user"] == ["work", "and also this"]
    assert await logged_steers(http, session_id) == []  # never taken in
