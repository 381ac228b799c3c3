"""Ids no session, space or run can have (a NUL byte, other control characters, spaces, too long),
through the real interfaces on both stores (SQLite, and a real PostgreSQL: tests/postgres.py): one
answer, INVALID_ARGUMENT / 400 naming the field, before any store sees them. PostgreSQL refuses a
NUL in text with an error of its own, which clients got as INTERNAL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from yarl import URL

from a3s_agent.app import Application
from a3s_agent.faces.http import start_http
from a3s_agent.faces.http.spaces import spaces_routes
from a3s_agent.proto import code_agent_later_pb2 as lp
from a3s_agent.proto import code_agent_later_pb2_grpc as lp_grpc
from a3s_agent.proto import code_agent_pb2 as pb

from ..conftest import LiveServer, agent_settings, new_session, running, user

pytestmark = pytest.mark.security

BAD_IDS = ["a\x00b", "\x00", "a\nb", "a\x7fb", "a b", "x" * 129]
BAD_SESSION_ID = "session_id must be 1-128 characters of letters, digits, '.', '_', ':' or '-'"

CALLS: dict[str, Callable[[LiveServer, str], Any]] = {
    "GetSession": lambda s, i: s.stub.GetSession(pb.GetSessionRequest(session_id=i)),
    "DestroySession": lambda s, i: s.stub.DestroySession(pb.DestroySessionRequest(session_id=i)),
    "ConfigureSession": lambda s, i: s.stub.ConfigureSession(pb.ConfigureSessionRequest(session_id=i)),
    "Generate": lambda s, i: s.stub.Generate(pb.GenerateRequest(session_id=i, messages=[user("hi")])),
    "GetContextUsage": lambda s, i: s.stub.GetContextUsage(pb.GetContextUsageRequest(session_id=i)),
    "Cancel": lambda s, i: s.stub.Cancel(pb.CancelRequest(session_id=i)),
    "Pause": lambda s, i: s.stub.Pause(pb.PauseRequest(session_id=i)),
    "CheckPermission": lambda s, i: s.stub.CheckPermission(
        pb.CheckPermissionRequest(session_id=i, tool_name="bash", arguments="{}")
    ),
    "GetSession (later dialect)": lambda s, i: lp_grpc.CodeAgentServiceStub(s.channel).GetSession(
        lp.GetSessionRequest(session_id=i)
    ),
    "StoreMemory": lambda s, i: lp_grpc.CodeAgentServiceStub(s.channel).StoreMemory(
        lp.StoreMemoryRequest(session_id=i, memory=lp.MemoryItem(content="a note"))
    ),
    "SearchMemories": lambda s, i: lp_grpc.CodeAgentServiceStub(s.channel).SearchMemories(
        lp.SearchMemoriesRequest(session_id=i, query="note")
    ),
}


@dataclass
class Served:
    live: LiveServer
    http: aiohttp.ClientSession


@pytest.fixture(params=["sqlite", "postgresql"])
async def served(request: pytest.FixtureRequest, workspace: Path, tmp_path: Path) -> AsyncIterator[Served]:
    store = "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    settings = replace(agent_settings(workspace, tmp_path / "data"), store=store)
    async with running(settings) as live, http_face(live) as http:
        yield Served(live, http)


@asynccontextmanager
async def http_face(live: LiveServer) -> AsyncIterator[aiohttp.ClientSession]:
    """The HTTP face with the Agent Spaces routes, as server.py assembles it."""
    app = Application(live.runtime)
    listener = await start_http(app, "127.0.0.1:0", extra_routes=spaces_routes(app))
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{listener.port}") as client:
            yield client
    finally:
        await listener.stop()


def path(*parts: str) -> URL:
    """A path whose parts are percent-encoded as they are (a NUL as %00)."""
    return URL.build(path="/" + "/".join(parts))


@pytest.mark.parametrize("name", CALLS)
async def test_malformed_session_ids_are_invalid_argument_on_every_store(served: Served, name: str) -> None:
    for bad in BAD_IDS:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await CALLS[name](served.live, bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{bad!r}: {err.value.details()}"
        assert err.value.details() == BAD_SESSION_ID
    with pytest.raises(grpc.aio.AioRpcError) as err:  # an id a session could have is only unknown
        await CALLS[name](served.live, "no-such-session")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()


async def test_malformed_ids_in_http_paths_are_400_on_every_store(served: Served) -> None:
    http = served.http
    for bad in BAD_IDS:
        for method in ("GET", "DELETE"):
            async with http.request(method, path("sessions", bad)) as answer:
                assert answer.status == 400, f"{method} {bad!r}: {await answer.text()}"
                assert (await answer.json())["error"]["message"] == BAD_SESSION_ID
    async with http.post("/v1/spaces", json={"spaceId": "box1"}) as answer:
        assert answer.status == 201, await answer.text()
    for bad in BAD_IDS:
        for route, field in [
            (path("v1", "spaces", bad), "spaceId"),
            (path("v1", "spaces", "box1", "runs", bad), "runId"),
        ]:
            async with http.get(route) as answer:
                assert answer.status == 400, f"{route}: {await answer.text()}"
                message = (await answer.json())["error"]["message"]
                assert message.startswith(f"{field} must be 1 to 64 letters, digits, '_' or '-', not "), (
                    message
                )
    async with http.get(path("v1", "spaces", "box1", "runs", "run_0")) as answer:
        assert answer.status == 404, await answer.text()
    # Nothing was left half done: a session made now is the only one.
    session = await new_session(served.live)
    listed = await served.live.stub.ListSessions(pb.ListSessionsRequest())
    assert [s.session_id for s in listed.sessions] == [session]
