"""Resuming from a cursor through a real server: every chunk and event carries its seq in the
session's log; StreamGenerate and SubscribeEvents resume after `a3s-after-seq` (gRPC), `id:` and
`Last-Event-ID` (SSE) or `after_seq` (WebSocket); `GET /sessions/{id}/events` pages the log; a
cursor past the end is INVALID_ARGUMENT, one older than the retained log FAILED_PRECONDITION
(resync); a client dropped mid-generation and resuming sees every chunk exactly once; a slow
subscriber loses nothing; a generation goes on when its client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import grpc
import pytest

from a3s_agent.core.store.events import EventType
from a3s_agent.faces.http import stalled
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import Reply, call, text

from .conftest import WITHIN_S, LiveServer, eventually, new_session, subscribed, user
from .scripted_model import ScriptedProvider, after
from .test_http import Http, serving

CHUNK = pb.GenerateChunk
AFTER = "a3s-after-seq"
GO = {"role": "ROLE_USER", "content": "go"}


@pytest.fixture
async def http(scripted_agent: LiveServer) -> AsyncIterator[Http]:
    async with serving(scripted_agent) as face:
        yield face


def script_run(scripted: ScriptedProvider, words: int = 40, delay: float = 0.003) -> None:
    """One generation of many chunks: text and a tool call, its result, more text, the answer."""
    scripted.script(
        Reply(
            content="Let me look. ", tool_calls=(call("bash", {"command": "echo looked"}),), chunk_delay=delay
        ),
        Reply(content="word " * words, chunk_delay=delay),
    )


def request(session_id: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(session_id=session_id, messages=[user("go")])


def seq_of(chunk: pb.GenerateChunk) -> int:
    return int(chunk.metadata["seq"])


@dataclass(frozen=True)
class Seen:
    """A chunk as the comparison sees it: seq, type name, content (the tool's output for a result)."""

    seq: int
    type: str
    content: str


def seen_pb(chunk: pb.GenerateChunk) -> Seen:
    content = chunk.tool_result.output if chunk.type == CHUNK.CHUNK_TYPE_TOOL_RESULT else chunk.content
    return Seen(seq_of(chunk), CHUNK.ChunkType.Name(chunk.type), content)


def seen_json(chunk: dict[str, Any]) -> Seen:
    result = chunk.get("tool_result") or {}
    content = (
        result.get("output", "") if chunk["type"] == "CHUNK_TYPE_TOOL_RESULT" else chunk.get("content", "")
    )
    return Seen(int(chunk["metadata"]["seq"]), chunk["type"], content)


def same_run(chunks: list[Seen], baseline: list[Seen]) -> None:
    """Every chunk exactly once: seqs strictly increasing, the types and the content as uninterrupted."""
    seqs = [c.seq for c in chunks]
    assert seqs == sorted(set(seqs)), seqs
    assert [c.type for c in chunks] == [c.type for c in baseline]
    assert "".join(c.content for c in chunks) == "".join(c.content for c in baseline)
    assert chunks[-1].type == "CHUNK_TYPE_DONE"


# --- SSE -------------------------------------------------------------------------------------


@dataclass
class Sse:
    id: str | None
    event: str
    data: Any


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[Sse]:
    """The server-sent events of a stream with their `id:` (comments skipped)."""
    assert response.status == 200, await response.text()
    assert response.content_type == "text/event-stream"
    id_, event, data = None, "message", None
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if data is not None:
                yield Sse(id_, event, json.loads(data))
            id_, event, data = None, "message", None
        elif line.startswith("id: "):
            id_ = line.removeprefix("id: ")
        elif line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")


async def error_json(response: aiohttp.ClientResponse, status: int, code: str) -> dict[str, Any]:
    body = await response.json()
    assert response.status == status, body
    assert body["error"]["code"] == code, body
    return body["error"]


# --- seqs in chunks and events ---------------------------------------------------------------


async def test_every_chunk_carries_its_seq_strictly_increasing_on_every_face(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http
) -> None:
    session_id = await new_session(scripted_agent)
    script_run(scripted, words=5, delay=0)
    chunks = [c async for c in scripted_agent.stub.StreamGenerate(request(session_id))]
    seqs = [seq_of(c) for c in chunks]  # every chunk has one: a missing key fails here
    assert len(chunks) > 5 and seqs == sorted(set(seqs)) and seqs[0] > 1  # after SESSION_CREATED
    assert chunks[-1].type == CHUNK.CHUNK_TYPE_DONE

    script_run(scripted, words=5, delay=0)
    response = await http.client.post(f"/sessions/{session_id}/generate/stream", json={"messages": [GO]})
    events = [e async for e in sse_events(response)]
    messages = [e for e in events if e.event == "message"]
    assert events[-1].event == "done" and events[-1].id is None
    assert [e.id for e in messages] == [e.data["metadata"]["seq"] for e in messages]
    sse_seqs = [int(e.id or 0) for e in messages]
    assert sse_seqs == sorted(set(sse_seqs)) and sse_seqs[0] > seqs[-1]

    script_run(scripted, words=5, delay=0)
    async with http.client.ws_connect("/ws") as ws:
        params = {"session_id": session_id, "messages": [GO]}
        await ws.send_json({"method": "StreamGenerate", "params": params, "id": 1})
        replies: list[dict[str, Any]] = []
        while not replies or "result" in replies[-1]:
            replies.append(await ws.receive_json(timeout=WITHIN_S))
    assert replies[-1] == {"id": 1, "done": True}
    ws_seqs = [int(r["result"]["metadata"]["seq"]) for r in replies[:-1]]
    assert ws_seqs == sorted(set(ws_seqs)) and ws_seqs[0] > sse_seqs[-1]


async def test_a_subscriber_resuming_from_a_cursor_gets_what_it_missed_then_live_events(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http
) -> None:
    session_id = await new_session(scripted_agent)
    script_run(scripted, words=3, delay=0)
    live = scripted_agent.stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=session_id))
    await subscribed(scripted_agent)
    await scripted_agent.stub.Generate(request(session_id))
    first: list[pb.AgentEvent] = []
    while not first or first[-1].type != pb.AgentEvent.EVENT_TYPE_GENERATION_COMPLETED:
        first.append(await live.read())
    live.cancel()
    assert [int(e.data["seq"]) for e in first] == sorted({int(e.data["seq"]) for e in first})

    # Gone after the first event: the rest of that run comes back from the log, then the next run live.
    cursor = first[0].data["seq"]
    resumed = scripted_agent.stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id), metadata=((AFTER, cursor),)
    )
    replayed = [await resumed.read() for _ in first[1:]]
    assert replayed == first[1:]
    scripted.script(text("again"))
    await scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("again")]))
    later = await resumed.read()
    assert later.type == pb.AgentEvent.EVENT_TYPE_GENERATION_STARTED
    assert int(later.data["seq"]) > int(first[-1].data["seq"])
    resumed.cancel()

    # SSE: Last-Event-ID (what EventSource sends when it reconnects) resumes as a3s-after-seq does.
    response = await http.client.post(
        "/rpc/SubscribeEvents", json={"session_id": session_id}, headers={"Last-Event-ID": cursor}
    )
    stream = sse_events(response)
    over_sse = [await anext(stream) for _ in first[1:]]
    response.close()
    assert [e.id for e in over_sse] == [e.data["seq"] for e in first[1:]]
    assert [e.data["data"]["seq"] for e in over_sse] == [e.id for e in over_sse]

    # WebSocket: `after_seq` next to method.
    async with http.client.ws_connect("/ws") as ws:
        params = {"session_id": session_id}
        await ws.send_json(
            {"method": "subscribe_events", "params": params, "id": 7, "after_seq": int(cursor)}
        )
        over_ws = [(await ws.receive_json(timeout=WITHIN_S))["result"] for _ in first[1:]]
    assert [e["data"]["seq"] for e in over_ws] == [e.data["seq"] for e in first[1:]]


async def test_a_slow_subscriber_loses_no_event(scripted_agent: LiveServer) -> None:
    """It reads at its own pace while thousands of events are published, each burst more than its
    queue holds (a group commit hands them over at once): it reads them from the log, every one in
    order, none lost, none twice."""
    session_id = await new_session(scripted_agent)
    infos = pb.SubscribeEventsRequest(session_id=session_id, event_types=["info"])
    stream = scripted_agent.stub.SubscribeEvents(infos)
    await subscribed(scripted_agent)
    bus = scripted_agent.runtime.events
    burst, bursts, received = 1100, 3, []
    for first in range(0, burst * bursts, burst):
        for index in range(first, first + burst):
            bus.publish(EventType.INFO, session_id, f"event {index}")  # never waits for the subscriber
        for _ in range(100):  # slower than the publishing
            received.append(await asyncio.wait_for(stream.read(), WITHIN_S))
            await asyncio.sleep(0.001)
    while len(received) < burst * bursts:
        received.append(await asyncio.wait_for(stream.read(), WITHIN_S))
    stream.cancel()
    assert [e.message for e in received] == [f"event {i}" for i in range(burst * bursts)]
    seqs = [int(e.data["seq"]) for e in received]
    assert seqs == list(range(seqs[0], seqs[0] + burst * bursts))  # contiguous: nothing was lost


# --- reconnecting mid-generation ---------------------------------------------------------------


async def baseline_run(server: LiveServer, scripted: ScriptedProvider) -> list[Seen]:
    session_id = await new_session(server)
    script_run(scripted)
    return [seen_pb(c) async for c in server.stub.StreamGenerate(request(session_id))]


def drop_points(rng: random.Random, length: int) -> list[int]:
    """How many chunks each connection reads before it drops (1 to 3 drops)."""
    return [rng.randint(1, max(1, length // 3)) for _ in range(rng.randint(1, 3))]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_a_grpc_client_dropped_mid_generation_resumes_and_sees_every_chunk_once(
    scripted_agent: LiveServer, scripted: ScriptedProvider, seed: int
) -> None:
    baseline = await baseline_run(scripted_agent, scripted)
    rng = random.Random(seed)
    session_id = await new_session(scripted_agent)
    script_run(scripted)
    received: list[Seen] = []
    metadata: tuple[tuple[str, str], ...] = ()
    for reads in [*drop_points(rng, len(baseline)), None]:
        call_ = scripted_agent.stub.StreamGenerate(request(session_id), metadata=metadata)
        async for chunk in call_:
            received.append(seen_pb(chunk))
            if reads is not None and (reads := reads - 1) == 0:
                call_.cancel()  # the network drops: the run goes on, its chunks wait in the log
                break
        else:
            break
        await asyncio.sleep(rng.uniform(0, 0.05))
        metadata = ((AFTER, str(received[-1].seq)),)
    same_run(received, baseline)


@pytest.mark.parametrize("seed", [5, 6, 7])
async def test_an_sse_client_dropped_mid_generation_resumes_and_sees_every_chunk_once(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http, seed: int
) -> None:
    baseline = await baseline_run(scripted_agent, scripted)
    rng = random.Random(seed)
    session_id = await new_session(scripted_agent)
    script_run(scripted)
    received: list[Seen] = []
    headers: dict[str, str] = {}
    url = f"/sessions/{session_id}/generate/stream"
    for reads in [*drop_points(rng, len(baseline)), None]:
        # EventSource's GET, as a browser reconnects: the same URL with Last-Event-ID.
        response = await http.client.get(url, params={"content": "go"}, headers=headers)
        ended = False
        async for event in sse_events(response):
            if event.event == "done":
                ended = True
                break
            assert event.event == "message", event
            assert event.id == event.data["metadata"]["seq"]
            received.append(seen_json(event.data))
            if reads is not None and (reads := reads - 1) == 0:
                break
        response.close()  # the connection drops
        if ended:
            break
        await asyncio.sleep(rng.uniform(0, 0.05))
        headers = {"Last-Event-ID": str(received[-1].seq)}
    same_run(received, baseline)


async def test_resuming_after_the_last_chunk_ends_at_once(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http
) -> None:
    session_id = await new_session(scripted_agent)
    script_run(scripted, words=3, delay=0)
    chunks = [c async for c in scripted_agent.stub.StreamGenerate(request(session_id))]
    middle, last = chunks[len(chunks) // 2], chunks[-1]
    # From the middle of a finished run: the rest of it, from the log.
    rest = scripted_agent.stub.StreamGenerate(request(session_id), metadata=((AFTER, str(seq_of(middle))),))
    assert [seq_of(c) async for c in rest] == [seq_of(c) for c in chunks[len(chunks) // 2 + 1 :]]
    # From its done chunk (an EventSource reconnects when the stream ends): nothing, at once.
    done = scripted_agent.stub.StreamGenerate(request(session_id), metadata=((AFTER, str(seq_of(last))),))
    assert await asyncio.wait_for(_all(done), WITHIN_S) == []
    response = await http.client.get(
        f"/sessions/{session_id}/generate/stream",
        params={"content": "go"},
        headers={"Last-Event-ID": str(seq_of(last))},
    )
    assert [e.event async for e in sse_events(response)] == ["done"]
    assert len(scripted.requests) == 2  # resuming never started a run


async def test_the_live_chunks_are_those_read_back_from_the_log_field_for_field(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    """The live stream is built from the events the run made, a resumed one from the log: the same."""
    session_id = await new_session(scripted_agent)
    script_run(scripted, words=5, delay=0)
    go = pb.GenerateRequest(
        session_id=session_id,
        messages=[user("go")],
        options=pb.GenerateOptions(enable_tools=True, return_intermediate_steps=True),
    )
    live = [c async for c in scripted_agent.stub.StreamGenerate(go)]
    assert {CHUNK.ChunkType.Name(c.type) for c in live} == {
        "CHUNK_TYPE_CONTENT",
        "CHUNK_TYPE_TOOL_CALL",
        "CHUNK_TYPE_TOOL_RESULT",
        "CHUNK_TYPE_METADATA",
        "CHUNK_TYPE_DONE",
    }
    reread = scripted_agent.stub.StreamGenerate(go, metadata=((AFTER, str(seq_of(live[0]))),))
    assert [c async for c in reread] == live[1:]


async def _all(call_: Any) -> list[Any]:
    return [c async for c in call_]


# --- bad cursors ---------------------------------------------------------------------------------


async def grpc_error(call_: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _all(call_)
    return err.value


async def test_bad_cursors_are_invalid_argument_naming_what_is_wrong(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http
) -> None:
    stub = scripted_agent.stub
    session_id = await new_session(scripted_agent)
    script_run(scripted, words=2, delay=0)
    chunks = [c async for c in stub.StreamGenerate(request(session_id))]
    last = seq_of(chunks[-1])
    for value in ("abc", "-1", "1.5", "", "99999999999999999999999"):
        for call_ in (
            stub.StreamGenerate(request(session_id), metadata=((AFTER, value),)),
            stub.SubscribeEvents(
                pb.SubscribeEventsRequest(session_id=session_id), metadata=((AFTER, value),)
            ),
        ):
            error = await grpc_error(call_)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and AFTER in (error.details() or ""), (
                value
            )
    # Past the last seq.
    past = ((AFTER, str(last + 1)),)
    error = await grpc_error(
        stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=session_id), metadata=past)
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and f"seq {last}" in (error.details() or "")
    error = await grpc_error(stub.StreamGenerate(request(session_id), metadata=past))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and str(last + 1) in (error.details() or "")
    # A seq that is an event, not a chunk, names no run to follow.
    error = await grpc_error(stub.StreamGenerate(request(session_id), metadata=((AFTER, "1"),)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "chunk" in (error.details() or "")
    # Every session's log is numbered on its own: a cursor needs a session.
    error = await grpc_error(stub.SubscribeEvents(pb.SubscribeEventsRequest(), metadata=((AFTER, "1"),)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "session_id" in (error.details() or "")
    assert len(scripted.requests) == 2  # no refused resume started a run

    # HTTP: the same statuses, before any event is sent.
    url = f"/sessions/{session_id}/generate/stream"
    refused = await http.client.get(url, params={"content": "x"}, headers={"Last-Event-ID": "x1"})
    assert "Last-Event-ID" in (await error_json(refused, 400, "INVALID_ARGUMENT"))["message"]
    both = {"Last-Event-ID": str(last), AFTER: "1"}
    refused = await http.client.get(url, params={"content": "x"}, headers=both)
    assert "different cursors" in (await error_json(refused, 400, "INVALID_ARGUMENT"))["message"]
    refused = await http.client.post(
        "/rpc/SubscribeEvents", json={"session_id": session_id}, headers={AFTER: str(last + 1)}
    )
    assert "past the last" in (await error_json(refused, 400, "INVALID_ARGUMENT"))["message"]
    async with http.client.ws_connect("/ws") as ws:
        for after_seq, problem in (
            (-1, "after_seq must be"),
            ("3", "after_seq must be"),
            (True, "after_seq must be"),
        ):
            await ws.send_json(
                {
                    "method": "SubscribeEvents",
                    "params": {"session_id": session_id},
                    "id": 1,
                    "after_seq": after_seq,
                }
            )
            reply = await ws.receive_json(timeout=WITHIN_S)
            assert reply["error"]["code"] == "INVALID_ARGUMENT" and problem in reply["error"]["message"]
        await ws.send_json(
            {"method": "GetSession", "params": {"session_id": session_id}, "id": 2, "after_seq": 1}
        )
        reply = await ws.receive_json(timeout=WITHIN_S)
        assert reply["error"]["code"] == "INVALID_ARGUMENT" and "not GetSession" in reply["error"]["message"]


async def test_a_cursor_older_than_the_retained_log_is_a_resync_naming_the_oldest_seq(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http
) -> None:
    stub = scripted_agent.stub
    session_id = await new_session(scripted_agent)
    script_run(scripted, words=3, delay=0)
    chunks = [c async for c in stub.StreamGenerate(request(session_id))]
    await scripted_agent.runtime.events.flush()
    assert await scripted_agent.runtime.store.prune_log(0, 3) > 0  # the newest 3 entries stay
    oldest, last = await scripted_agent.runtime.store.log_bounds(session_id)
    assert oldest == last - 2 and last >= seq_of(chunks[-1])
    old = ((AFTER, "1"),)
    for call_ in (
        stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id=session_id), metadata=old),
        stub.StreamGenerate(request(session_id), metadata=((AFTER, str(seq_of(chunks[0]))),)),
    ):
        error = await grpc_error(call_)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = error.details() or ""
        assert details.startswith("resync") and f"oldest available is {oldest}" in details
        assert ("a3s-oldest-seq", str(oldest)) in tuple(error.trailing_metadata() or ())
    # From the oldest retained one on, it replays.
    resumed = stub.SubscribeEvents(
        pb.SubscribeEventsRequest(session_id=session_id), metadata=((AFTER, str(oldest - 1)),)
    )
    await asyncio.wait_for(resumed.read(), WITHIN_S)
    resumed.cancel()

    refused = await http.client.get(f"/sessions/{session_id}/events", params={"after_seq": "1"})
    error = await error_json(refused, 409, "FAILED_PRECONDITION")
    assert error["message"].startswith("resync") and error["details"] == {"oldest_seq": oldest}
    refused = await http.client.post(
        "/rpc/SubscribeEvents", json={"session_id": session_id}, headers={"Last-Event-ID": "1"}
    )
    assert (await error_json(refused, 409, "FAILED_PRECONDITION"))["details"] == {"oldest_seq": oldest}


# --- the paged read ---------------------------------------------------------------------------


async def test_the_paged_read_walks_the_whole_log_with_events_and_chunks(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http
) -> None:
    session_id = await new_session(scripted_agent)
    script_run(scripted, words=3, delay=0)
    chunks = [c async for c in scripted_agent.stub.StreamGenerate(request(session_id))]
    await scripted_agent.runtime.events.flush()
    url = f"/sessions/{session_id}/events"
    entries: list[dict[str, Any]] = []
    cursor, pages = 0, 0
    while True:
        reply = await http.client.get(url, params={"after_seq": str(cursor), "limit": "4"})
        assert reply.status == 200, await reply.text()
        page = await reply.json()
        pages += 1
        assert set(page) == {"events", "last_seq", "has_more"} and len(page["events"]) <= 4
        entries += page["events"]
        cursor = page["last_seq"]
        if not page["has_more"]:
            break
    _, last = await scripted_agent.runtime.store.log_bounds(session_id)
    assert [e["seq"] for e in entries] == list(range(1, last + 1)) and cursor == last and pages > 2
    first = entries[0]
    assert first["kind"] == "event" and first["type"] == "EVENT_TYPE_SESSION_CREATED"
    assert first["data"]["seq"] == "1" and first["session_id"] == session_id
    in_log = [e for e in entries if e["kind"] == "chunk"]
    assert [int(e["chunk"]["metadata"]["seq"]) for e in in_log] == [seq_of(c) for c in chunks]
    assert [e["chunk"]["type"] for e in in_log] == [CHUNK.ChunkType.Name(c.type) for c in chunks]
    assert len({e["run"] for e in in_log}) == 1
    # Times as A3S means them (issue 18; milliseconds before): `timestamp` Unix seconds, the
    # milliseconds in data.timestamp_ms (an event's) or timestamp_ms (a chunk entry's), never going back.
    millis = [int(e["data"]["timestamp_ms"] if e["kind"] == "event" else e["timestamp_ms"]) for e in entries]
    assert millis == sorted(millis) and time.time() - 60 < millis[0] / 1000 <= time.time()
    assert [int(e["timestamp"]) for e in entries] == [ms // 1000 for ms in millis]
    types = [e["type"] for e in entries if e["kind"] == "event"]
    assert "EVENT_TYPE_GENERATION_STARTED" in types and types[-1] == "EVENT_TYPE_GENERATION_COMPLETED"

    # Defaults: from the start, 100 at most; an empty page at the end.
    everything = await (await http.client.get(url)).json()
    assert everything["events"] == entries and not everything["has_more"]
    assert await (await http.client.get(url, params={"after_seq": str(last)})).json() == {
        "events": [],
        "last_seq": last,
        "has_more": False,
    }
    for params, name in (
        ({"after_seq": "x"}, "after_seq"),
        ({"after_seq": "-3"}, "after_seq"),
        ({"after_seq": str(last + 1)}, "after_seq"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"cursor": "1"}, "cursor"),
    ):
        message = (await error_json(await http.client.get(url, params=params), 400, "INVALID_ARGUMENT"))[
            "message"
        ]
        assert name in message, (params, message)


async def test_a_failed_run_ends_its_chunks_in_the_log_with_its_error(
    scripted_agent: LiveServer, scripted: ScriptedProvider, http: Http
) -> None:
    session_id = await new_session(scripted_agent)
    scripted.script(Reply(content="this reply breaks off " * 3, break_after=2))
    call_ = scripted_agent.stub.StreamGenerate(request(session_id))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for chunk in call_:
            received.append(chunk)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and received
    # A client that lost the stream before the failure gets the same status on resuming.
    resumed = scripted_agent.stub.StreamGenerate(
        request(session_id), metadata=((AFTER, str(seq_of(received[0]))),)
    )
    error = await grpc_error(resumed)
    assert error.code() == grpc.StatusCode.UNAVAILABLE and error.details() == err.value.details()
    await scripted_agent.runtime.events.flush()
    page = await (await http.client.get(f"/sessions/{session_id}/events")).json()
    ended = [e for e in page["events"] if e["kind"] == "chunk"][-1]
    assert "chunk" not in ended and ended["error"]["code"] == "UNAVAILABLE"
    assert ended["error"]["message"] == err.value.details()


async def test_the_paged_read_needs_the_token(
    scripted_agent: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = await new_session(scripted_agent)
    monkeypatch.setattr(scripted_agent.runtime.settings, "auth_token", "s3cret-token")
    async with serving(scripted_agent) as face:
        url = f"/sessions/{session_id}/events"
        await error_json(await face.client.get(url), 401, "UNAUTHENTICATED")
        allowed = await face.client.get(url, headers={"Authorization": "Bearer s3cret-token"})
        assert allowed.status == 200 and (await allowed.json())["events"][0]["seq"] == 1


# --- runs outlive their callers ---------------------------------------------------------------


async def test_a_generate_whose_client_hangs_up_runs_to_its_end(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    answer = asyncio.Event()
    scripted.script(after(answer, text("finished anyway")))
    session_id = await new_session(scripted_agent)
    channel = grpc.aio.insecure_channel(scripted_agent.address)
    generating = asyncio.ensure_future(pb_grpc.CodeAgentServiceStub(channel).Generate(request(session_id)))
    await eventually(lambda: scripted.requests, "the model call")
    generating.cancel()
    await channel.close()
    answer.set()

    async def answered() -> bool:
        reply = await scripted_agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))
        return reply.session.context_usage.message_count == 2

    await eventually(answered, "the answer is in the history")


async def test_a_cursor_on_a_session_that_never_was_is_not_found_but_a_destroyed_ones_log_reads(
    scripted_agent: LiveServer, http: Http
) -> None:
    stub = scripted_agent.stub
    error = await grpc_error(
        stub.SubscribeEvents(pb.SubscribeEventsRequest(session_id="ghost"), metadata=((AFTER, "0"),))
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND and "ghost" in (error.details() or "")
    await error_json(await http.client.get("/sessions/ghost/events"), 404, "NOT_FOUND")
    session_id = await new_session(scripted_agent)
    await stub.DestroySession(pb.DestroySessionRequest(session_id=session_id))
    await scripted_agent.runtime.events.flush()
    reply = await http.client.get(f"/sessions/{session_id}/events")
    kinds = [e["type"] for e in (await reply.json())["events"]]
    assert kinds == ["EVENT_TYPE_SESSION_CREATED", "EVENT_TYPE_SESSION_DESTROYED"]


def long_answer(scripted: ScriptedProvider, monkeypatch: pytest.MonkeyPatch) -> str:
    """A 6 MB answer scripted (more than the sockets between client and server hold), and streams
    that wait half a second for a client that reads nothing."""
    monkeypatch.setattr(stalled, "STALLED_WRITE_S", 0.5)
    scripted.text_chunk = 64 * 1024
    answer = "".join(f"{i:07d} " for i in range(750_000))
    scripted.script(Reply(content=answer))
    return answer


async def test_a_client_that_reads_nothing_is_closed_and_resumes_with_nothing_lost(
    scripted_agent: LiveServer,
    scripted: ScriptedProvider,
    http: Http,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An SSE client that stops reading holds the frame being written (and the log reader behind
    it) only so long: the server closes its connection, says why in its log, and the client comes
    back after the last event it got, with every chunk once."""
    answer = long_answer(scripted, monkeypatch)
    session_id = await new_session(scripted_agent)
    body = json.dumps({"messages": [{"role": "ROLE_USER", "content": "go"}]}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    sock.connect(("127.0.0.1", http.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    writer.write(
        f"POST /sessions/{session_id}/generate/stream HTTP/1.1\r\nHost: 127.0.0.1:{http.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    transport = cast(asyncio.Transport, writer.transport)
    transport.pause_reading()  # reads nothing from here on

    await eventually(
        lambda: any("closed the event stream of POST" in r.getMessage() for r in caplog.records),
        "the server closing the stalled stream",
    )
    transport.resume_reading()
    got = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(1 << 20), WITHIN_S):
            got += chunk
    writer.close()
    seen = [seen_json(data) for data in whole_frames(got.split(b"\r\n\r\n", 1)[1])]
    assert seen and len(got) < len(answer)  # part of the answer came before the stall, not all
    rest = await http.client.get(
        f"/sessions/{session_id}/generate/stream",
        params={"content": "go"},
        headers={"Last-Event-ID": str(seen[-1].seq)},
    )
    assert rest.status == 200
    seen += [seen_json(data) for data in whole_frames(await rest.read()) if data]  # {} is `done`
    texts = [s.content for s in seen if s.type == "CHUNK_TYPE_CONTENT"]
    assert "".join(texts) == answer and seen[-1].type == "CHUNK_TYPE_DONE"
    assert [s.seq for s in seen] == sorted({s.seq for s in seen})
    assert len(scripted.requests) == 1


def whole_frames(raw: bytes) -> list[dict[str, Any]]:
    """The data of each whole server-sent event in `raw` (a cut last one left out), read without a
    client's line limit: the done chunk of a long answer holds all of it."""
    frames = raw.split(b"\n\n")[:-1]
    return [
        json.loads(line[6:]) for frame in frames for line in frame.split(b"\n") if line.startswith(b"data: ")
    ]


async def test_a_websocket_that_reads_nothing_is_closed_and_resumes_with_nothing_lost(
    scripted_agent: LiveServer,
    scripted: ScriptedProvider,
    http: Http,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answer = long_answer(scripted, monkeypatch)
    session_id = await new_session(scripted_agent)
    params = {"session_id": session_id, "messages": [{"role": "ROLE_USER", "content": "go"}]}
    seen: list[Seen] = []
    async with http.client.ws_connect("/ws", max_msg_size=0) as ws:
        await ws.send_json({"method": "stream_generate", "params": params, "id": 1})
        await eventually(  # the client reads nothing: aiohttp stops reading its socket once it holds 64 KiB
            lambda: any("closed a WebSocket" in r.getMessage() for r in caplog.records),
            "the server closing the stalled socket",
        )
        async for frame in ws:
            if frame.type is not aiohttp.WSMsgType.TEXT:
                break
            seen.append(seen_json(json.loads(frame.data)["result"]))
    assert seen and seen[-1].type != "CHUNK_TYPE_DONE"
    async with http.client.ws_connect("/ws", max_msg_size=0) as ws:
        await ws.send_json(
            {"method": "stream_generate", "params": params, "id": 2, "after_seq": seen[-1].seq}
        )
        while "done" not in (reply := await ws.receive_json(timeout=WITHIN_S)):
            seen.append(seen_json(reply["result"]))
    texts = [s.content for s in seen if s.type == "CHUNK_TYPE_CONTENT"]
    assert "".join(texts) == answer and seen[-1].type == "CHUNK_TYPE_DONE"
    assert [s.seq for s in seen] == sorted({s.seq for s in seen})
    assert len(scripted.requests) == 1
