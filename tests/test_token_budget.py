"""The per-session token budget, through the real gRPC and HTTP faces (and coven): server-wide from
Initialize `config.custom["token_budget"]`, per session from `a3s-token-budget` call metadata (gRPC
metadata, HTTP headers), and once spent, the run stops before its next model call with
FINISH_REASON_LENGTH and a message saying so; a new generation stops at once, calling no model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import coven_pb2 as coven_pb
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import LiveServer, agent_settings, new_session, running, subscribed, user
from .test_coven import FakeGateway, coven_agent, gateway, send_message
from .test_http import serving, sse

__all__ = ["gateway"]  # the coven tests' fake gateway, as a fixture here

BUDGET = "a3s-token-budget"
NOTES = "hello from the notes\n"


async def initialize(server: LiveServer, fake: FakeLLM, **custom: str) -> None:
    llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url)
    await server.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm, custom=custom)))


@pytest.fixture
async def server(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[LiveServer]:
    (workspace / "notes.txt").write_text(NOTES)
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        await initialize(live, fake, token_budget="1")  # spent by the first model call
        yield live


async def generate(server: LiveServer, session_id: str, prompt: str = "go") -> pb.GenerateResponse:
    return await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user(prompt)]))


async def session_metadata(server: LiveServer, session_id: str) -> dict[str, str]:
    call = server.stub.GetSession(pb.GetSessionRequest(session_id=session_id))
    await call
    return dict(await call.trailing_metadata())


async def create(server: LiveServer, *metadata: tuple[str, str]) -> tuple[str, dict[str, str]]:
    call = server.stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata)
    reply = await call
    return reply.session_id, dict(await call.trailing_metadata())


def assert_spent(reply: pb.GenerateResponse, used: int, budget: int = 1) -> None:
    assert reply.finish_reason == pb.FINISH_REASON_LENGTH
    assert f"token budget of {budget} tokens is spent: {used} tokens used" in reply.message.content
    assert reply.metadata["token_budget"] == str(budget)
    assert reply.metadata["token_budget_used"] == str(used)


async def test_a_run_stops_before_the_next_model_call_and_a_new_one_at_once(
    server: LiveServer, fake: FakeLLM
) -> None:
    fake.script(tool_call("read_file", {"path": "notes.txt"}, content="Reading."), text("never asked for"))
    session_id = await new_session(server)
    reply = await generate(server, session_id, "what do the notes say?")

    used = fake.usages[0]["total_tokens"]
    assert len(fake.requests) == 1  # the call after the tool's result was not made
    [ran] = reply.tool_calls
    assert ran.result.success and NOTES.strip() in ran.result.output  # the turn's calls did run
    assert_spent(reply, used)
    assert reply.message.content.startswith("Reading.\n\n")
    assert reply.metadata["turns"] == "1" and reply.metadata["prompt_tokens"] == str(
        fake.usages[0]["prompt_tokens"]
    )

    history = await server.runtime.sessions.history(session_id)
    again = await generate(server, session_id, "and now?")
    assert_spent(again, used)
    assert again.metadata["turns"] == "0" and again.usage.total_tokens == 0
    assert len(fake.requests) == 1
    # Nothing of the refused request is stored: the model never saw it.
    assert await server.runtime.sessions.history(session_id) == history


async def test_a_stream_says_so_in_a_metadata_chunk_and_events_tell_subscribers(
    server: LiveServer, fake: FakeLLM
) -> None:
    fake.script(text("Hello."))
    session_id = await new_session(server)
    await generate(server, session_id)
    events = server.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id, event_types=["warning", "generation_completed"])
    )
    await subscribed(server)
    request = pb.GenerateRequest(session_id=session_id, messages=[user("more")])
    chunks = [c async for c in server.stub.StreamGenerate(request)]

    used = str(fake.usages[0]["total_tokens"])
    notice, done = chunks
    metadata = dict(notice.metadata)
    assert int(metadata.pop("seq")) < int(done.metadata["seq"])  # every chunk's place in the log
    assert metadata == {"type": "token_budget_spent", "token_budget": "1", "token_budget_used": used}
    assert done.type == pb.GenerateChunk.CHUNK_TYPE_DONE and done.metadata["finish_reason"] == "length"
    assert "token budget of 1 tokens is spent" in done.content
    warning = await asyncio.wait_for(anext(aiter(events)), 10)
    completed = await asyncio.wait_for(anext(aiter(events)), 10)
    events.cancel()
    assert warning.type == pb.AgentEvent.EVENT_TYPE_WARNING and warning.message == done.content
    data = dict(warning.data)
    assert int(data.pop("seq")) > 0  # every event's place in the log
    assert int(data.pop("timestamp_ms")) // 1000 == warning.timestamp  # every event's time (issue 18)
    assert data == {"token_budget": "1", "token_budget_used": used}
    assert completed.data["finish_reason"] == "length" and completed.data["turns"] == "0"
    assert len(fake.requests) == 1


async def test_a_session_budget_overrides_the_servers_and_configure_changes_it(
    server: LiveServer, fake: FakeLLM
) -> None:
    fake.fallback = text("ok")
    unbounded, metadata = await create(server, (BUDGET, "0"))
    assert metadata[BUDGET] == "0"
    for _ in range(3):
        assert (await generate(server, unbounded)).finish_reason == pb.FINISH_REASON_STOP

    session_id, metadata = await create(server, (BUDGET, "100000"))
    assert metadata[BUDGET] == "100000"
    assert (await generate(server, session_id)).finish_reason == pb.FINISH_REASON_STOP
    used = int((await session_metadata(server, session_id))["a3s-total-tokens"])

    call = server.stub.ConfigureSession(
        pb.ConfigureSessionRequest(session_id=session_id), metadata=((BUDGET, str(used)),)
    )
    await call
    assert dict(await call.trailing_metadata())[BUDGET] == str(used)
    requests = len(fake.requests)
    assert_spent(await generate(server, session_id), used, used)
    assert len(fake.requests) == requests

    # A merge without the key keeps the session's budget; raising it lets the session go on.
    await server.stub.ConfigureSession(pb.ConfigureSessionRequest(session_id=session_id))
    assert (await session_metadata(server, session_id))[BUDGET] == str(used)
    await server.stub.ConfigureSession(
        pb.ConfigureSessionRequest(session_id=session_id), metadata=((BUDGET, str(used + 10_000)),)
    )
    assert (await generate(server, session_id)).finish_reason == pb.FINISH_REASON_STOP
    # Replace mode without the key: the server's budget again (1, long spent).
    await server.stub.ConfigureSession(
        pb.ConfigureSessionRequest(session_id=session_id), metadata=(("a3s-config-mode", "replace"),)
    )
    assert (await session_metadata(server, session_id))[BUDGET] == "1"
    assert (await generate(server, session_id)).finish_reason == pb.FINISH_REASON_LENGTH


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "", "12.5", "0x10", "9" * 19, "1,000", "+5"])
async def test_bad_budgets_are_invalid_argument_naming_the_key(server: LiveServer, value: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await create(server, (BUDGET, value))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert BUDGET in err.value.details()
    session_id = await new_session(server)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.ConfigureSession(
            pb.ConfigureSessionRequest(session_id=session_id), metadata=((BUDGET, value),)
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and BUDGET in err.value.details()
    assert (await session_metadata(server, session_id))[BUDGET] == "1"  # unchanged


async def test_initialize_takes_the_server_budget_checked_and_a_restart_keeps_both(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    fake.fallback = text("ok")
    settings = agent_settings(workspace, tmp_path / "data")
    async with running(settings) as live:
        await initialize(live, fake, token_budget="5000")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await initialize(live, fake, token_budget="lots", other="kept out")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "config.custom.token_budget" in err.value.details()
        server_wide = await new_session(live)
        own, _ = await create(live, (BUDGET, "7"))
        assert (await session_metadata(live, server_wide))[
            BUDGET
        ] == "5000"  # the refused one changed nothing
    async with running(settings) as live:
        assert (await session_metadata(live, server_wide))[BUDGET] == "5000"
        assert (await session_metadata(live, own))[BUDGET] == "7"
        await initialize(live, fake)  # an Initialize without the key: no server budget
        assert (await session_metadata(live, server_wide))[BUDGET] == "0"


async def test_structured_generation_on_a_spent_session_is_resource_exhausted(
    server: LiveServer, fake: FakeLLM
) -> None:
    fake.script(text("warm up"))
    session_id = await new_session(server)
    await generate(server, session_id)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.GenerateStructured(
            pb.GenerateStructuredRequest(
                session_id=session_id, messages=[user("Ada, 36")], schema=json.dumps({"type": "object"})
            )
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "token budget of 1 tokens is spent" in err.value.details()
    assert len(fake.requests) == 1


async def test_compacting_a_spent_session_asks_the_model_for_no_summary(
    server: LiveServer, fake: FakeLLM
) -> None:
    fake.script(text("warm up"))
    context = [
        pb.Message(
            role=pb.Message.ROLE_ASSISTANT if i % 2 else pb.Message.ROLE_USER, content=f"m{i} " * 2_000
        )
        for i in range(20)
    ]
    reply = await server.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(max_context_length=32_000), initial_context=context)
    )
    await generate(server, reply.session_id)
    compacted = await server.stub.CompactContext(pb.CompactContextRequest(session_id=reply.session_id))
    assert compacted.after.total_tokens < compacted.before.total_tokens
    assert len(fake.requests) == 1  # the spent budget kept the summariser from being called


# --- the HTTP face: the same metadata as request and response headers ----------------------------


async def test_the_http_face_reads_the_budget_and_the_other_metadata_from_headers(
    server: LiveServer, fake: FakeLLM
) -> None:
    fake.fallback = text("ok")
    message = {"messages": [{"role": "ROLE_USER", "content": "hi"}]}
    async with serving(server) as http:
        created = await http.client.post(
            "/sessions", json={}, headers={"A3S-Token-Budget": "0", "a3s-compact-threshold": "0.7"}
        )
        session_id = (await created.json())["session_id"]
        assert created.status == 201 and created.headers[BUDGET] == "0"
        assert created.headers["a3s-compact-threshold"] == "0.7"
        ran = await http.client.post(f"/sessions/{session_id}/generate", json=message)
        assert (await ran.json())["finish_reason"] == "FINISH_REASON_STOP"

        # ConfigureSession (only by /rpc) in replace mode: the server's budget (1), spent.
        configured = await http.client.post(
            "/rpc/ConfigureSession", json={"session_id": session_id}, headers={"a3s-config-mode": "replace"}
        )
        assert configured.status == 200 and configured.headers[BUDGET] == "1"
        assert configured.headers["a3s-compact-threshold"] == "0.8"
        requests = len(fake.requests)
        spent = await (await http.client.post(f"/sessions/{session_id}/generate", json=message)).json()
        assert spent["finish_reason"] == "FINISH_REASON_LENGTH"
        assert "token budget of 1 tokens is spent" in spent["message"]["content"]
        events = await sse(await http.client.post(f"/sessions/{session_id}/generate/stream", json=message))
        chunks = [data for kind, data in events if kind == "message"]
        assert chunks[0]["metadata"]["type"] == "token_budget_spent"
        assert chunks[-1]["metadata"]["finish_reason"] == "length"
        assert len(fake.requests) == requests

        for bad in ("-3", "\uff11\uff12", "1" * 19):  # fullwidth digits: isdigit() but no number of ours
            refused = await http.client.post(
                "/rpc/ConfigureSession", json={"session_id": session_id}, headers={BUDGET: bad}
            )
            body = await refused.json()
            assert refused.status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", bad
            assert BUDGET in body["error"]["message"]


async def test_initialize_over_http_takes_the_budget_too(server: LiveServer, fake: FakeLLM) -> None:
    llm = {"provider": "openai", "model": "fake-model", "base_url": fake.base_url}
    async with serving(server) as http:
        refused = await http.client.post(
            "/rpc/Initialize", json={"config": {"llm": llm, "custom": {"token_budget": "-1"}}}
        )
        body = await refused.json()
        assert refused.status == 400 and "config.custom.token_budget" in body["error"]["message"]
        done = await http.client.post(
            "/rpc/Initialize", json={"config": {"llm": llm, "custom": {"token_budget": "250"}}}
        )
        assert done.status == 200, await done.json()
        created = await http.client.post("/sessions", json={})
        assert created.headers[BUDGET] == "250"


async def test_the_http_face_pages_sessions_by_headers(server: LiveServer) -> None:
    made = [await new_session(server) for _ in range(3)]
    async with serving(server) as http:
        listed: list[str] = []
        token = None
        while True:
            headers = {"a3s-page-size": "2", **({"a3s-page-token": token} if token else {})}
            page = await http.client.get("/sessions", headers=headers)
            listed += [s["session_id"] for s in (await page.json())["sessions"]]
            token = page.headers.get("a3s-next-page-token")
            if token is None:
                break
        assert listed == made
        bad = await http.client.get("/sessions", headers={"a3s-page-size": "0"})
        assert bad.status == 400 and "a3s-page-size" in (await bad.json())["error"]["message"]


# --- coven ---------------------------------------------------------------------------------------


async def test_coven_says_the_budget_is_spent_and_ends_the_request(
    server: LiveServer, fake: FakeLLM, gateway: FakeGateway
) -> None:
    fake.script(text("First answer."))
    async with coven_agent(server, gateway):
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "thread-b", "hello")
        assert (await stream.events("r1"))[-1] == ("done", coven_pb.Done(full_response="First answer."))
        send_message(stream, "r2", "thread-b", "again")
        events = await stream.events("r2")
    kind, note = events[-2]
    assert kind == "text" and "token budget of 1 tokens is spent" in note
    assert events[-1] == ("done", coven_pb.Done(full_response=note))
    assert len(fake.requests) == 1
