"""The later dialect's own RPCs over HTTP `POST /rpc/<Method>` with a real aiohttp client, next to
the gRPC face of the same server: every RPC gRPC serves is served, in the JSON a grpcurl user sends
(proto field names or their camelCase), with the replies gRPC gives for the same state; bad input is
400 naming the field, unknown ids 404. Memory and scheduled jobs on SQLite and PostgreSQL."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message as ProtoMessage

from a3s_agent.app import Application
from a3s_agent.config import CronSettings, SandboxSettings, Settings
from a3s_agent.faces import later_service
from a3s_agent.faces.grpc.later_only import later_only_handlers
from a3s_agent.faces.http import methods
from a3s_agent.faces.http.codec import LATER
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text

from .conftest import LiveServer, agent_settings, initialize, new_session, running
from .cron_clock import ManualClock
from .test_cron import MONDAY_8AM
from .test_http import serving
from .test_later_only_rpcs import a_conversation
from .test_planning import GOAL, PLAN, answer
from .test_providers import generate

PATH = "/a3s.code.agent.v1.CodeAgentService/"
LSP_FIXTURE = Path(__file__).with_name("lsp_fixture.py")


@dataclass
class Faces:
    live: LiveServer
    stub: later_grpc.CodeAgentServiceStub
    client: aiohttp.ClientSession

    async def rpc(self, method: str, body: object) -> tuple[int, Any]:
        """POST /rpc/<method>: the HTTP status and the JSON body."""
        async with self.client.post(f"/rpc/{method}", json=body) as response:
            return response.status, await response.json()

    async def ok(self, method: str, body: object) -> Any:
        status, reply = await self.rpc(method, body)
        assert status == 200, reply
        return reply

    async def refused(self, method: str, body: object, status: int, code: str, *words: str) -> str:
        """The error's message, once its status, code and words are as expected."""
        got, reply = await self.rpc(method, body)
        assert (got, reply["error"]["code"]) == (status, code), reply
        message: str = reply["error"]["message"]
        assert all(word in message for word in words), message
        return message


def as_json(reply: ProtoMessage) -> dict[str, Any]:
    """A gRPC reply as the HTTP face writes its JSON (json_format's, by proto field names)."""
    return json_format.MessageToDict(
        reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


@asynccontextmanager
async def faces(settings: Settings, fake: FakeLLM | None = None, **running_with: Any) -> AsyncIterator[Faces]:
    async with running(settings, **running_with) as live:
        if fake is not None:
            await initialize(live, fake)
        async with serving(live) as http:
            yield Faces(live, later_grpc.CodeAgentServiceStub(live.channel), http.client)


@pytest.fixture
async def served(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[Faces]:
    async with faces(agent_settings(workspace, tmp_path / "data"), fake) as both:
        yield both


async def grpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


# --- one list of served RPCs for both faces -----------------------------------------------------


async def test_every_later_rpc_grpc_serves_is_served_over_http(served: Faces) -> None:
    app = Application(served.live.runtime)
    by_grpc = set(later_only_handlers(app))
    by_http = {name for name, method in methods.METHODS.items() if method.codec is LATER}
    assert by_grpc == by_http == set(later_service.SERVED_METHODS)
    for name in sorted(by_http):
        # decoded as the later dialect's request: an unknown field is named, with its message
        request = methods.METHODS[name].request
        await served.refused(name, {"bogus": 1}, 400, "INVALID_ARGUMENT", "bogus", request)
    features = (await served.stub.GetCapabilities(later.GetCapabilitiesRequest())).features
    assert (await served.ok("GetCapabilities", {}))["features"] == list(features)
    assert {"lsp", "memory"} <= set(features) and "cron" not in features  # cron: not enabled


async def test_an_unknown_method_is_unimplemented_naming_it(served: Faces) -> None:
    await served.refused("NoSuchRpc", {}, 501, "UNIMPLEMENTED", "unknown method 'NoSuchRpc'")


async def test_the_token_guards_the_later_rpcs_over_http(workspace: Path, tmp_path: Path) -> None:
    settings = replace(agent_settings(workspace, tmp_path / "data"), auth_token="s3cret-token")
    async with faces(settings) as both:
        for name in ("ListMcpServers", "GetMessages", "AgenticGenerate", "ListCronJobs"):
            await both.refused(name, {}, 401, "UNAUTHENTICATED")  # not even whether it is served
        headers = {"Authorization": "Bearer s3cret-token"}
        async with both.client.post("/rpc/ListMcpServers", json={}, headers=headers) as response:
            assert (response.status, await response.json()) == (200, {"servers": []})


# --- history, todos, MCP servers, observability -------------------------------------------------


async def test_history_as_grpc_gives_it_paged_and_restored(served: Faces, fake: FakeLLM) -> None:
    session_id = await a_conversation(served.live, fake)
    whole = await served.ok("GetMessages", {"session_id": session_id})
    assert whole == as_json(await served.stub.GetMessages(later.GetMessagesRequest(session_id=session_id)))
    assert whole["total_count"] == 7 and whole["messages"][3]["content"][1]["tool_use"]["name"] == "read_file"
    page = await served.ok("GetMessages", {"sessionId": session_id, "offset": 3, "limit": "3"})
    assert [m["id"] for m in page["messages"]] == ["msg_3", "msg_4", "msg_5"] and page["has_more"]
    grpc_page = await served.stub.GetMessages(
        later.GetMessagesRequest(session_id=session_id, offset=3, limit=3)
    )
    assert page == as_json(grpc_page)

    await served.refused(
        "GetMessages", {"session_id": session_id, "limit": -1}, 400, "INVALID_ARGUMENT", "limit"
    )
    await served.refused(
        "GetMessages", {"session_id": session_id, "offset": "x"}, 400, "INVALID_ARGUMENT", "offset"
    )
    await served.refused("GetMessages", [session_id], 400, "INVALID_ARGUMENT", "GetMessagesRequest")
    await served.refused("GetMessages", {"session_id": "nope"}, 404, "NOT_FOUND", "nope")

    restored = await served.ok("RestoreSession", {"session_id": session_id})
    assert restored == {
        "success": True,
        "session_id": session_id,
        "message": f"session {session_id} restored with 7 messages",
    }
    gone = await served.ok("RestoreSession", {"session_id": "gone"})
    assert not gone["success"] and "gone" in gone["message"]
    await served.refused("RestoreSession", {}, 400, "INVALID_ARGUMENT", "session_id is required")


async def test_a_page_over_http_stops_at_what_one_reply_may_carry(
    served: Faces, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = "é" * 3000
    initial = [pb.Message(role=pb.Message.ROLE_USER, content=text) for text in (big, "x", big)]
    request = pb.CreateSessionRequest(initial_context=initial)
    session_id = (await served.live.stub.CreateSession(request)).session_id
    monkeypatch.setattr("a3s_agent.faces.agent_service.MAX_PAGE_BYTES", 10_000)
    first = await served.ok("GetMessages", {"session_id": session_id})
    assert [m["id"] for m in first["messages"]] == ["msg_0", "msg_1"] and first["has_more"]
    monkeypatch.setattr("a3s_agent.faces.agent_service.MAX_PAGE_BYTES", 2_000)
    cut = await served.ok("GetMessages", {"session_id": session_id})
    assert [m["id"] for m in cut["messages"]] == ["msg_0"] and cut["has_more"]
    assert cut["messages"][0]["content"][0]["text"]["text"].endswith("more than one reply carries]")
    assert cut == as_json(await served.stub.GetMessages(later.GetMessagesRequest(session_id=session_id)))


async def test_todos_set_over_http_are_grpcs_and_bad_ones_refused(served: Faces) -> None:
    session_id = await new_session(served.live)
    todos = [
        {"id": "1", "content": "read the spec", "status": "completed", "priority": "high"},
        {"id": "2", "content": "ünïcode ✓", "status": "in_progress", "priority": "low"},
    ]
    assert await served.ok("SetTodos", {"session_id": session_id, "todos": todos}) == {
        "success": True,
        "todos": todos,
    }
    over_grpc = await served.stub.GetTodos(later.GetTodosRequest(session_id=session_id))
    assert as_json(over_grpc) == {"todos": todos} == await served.ok("GetTodos", {"session_id": session_id})
    bad = {"session_id": session_id, "todos": [{**todos[0], "status": "someday"}]}
    await served.refused("SetTodos", bad, 400, "INVALID_ARGUMENT", "someday")
    wrong_type = {"session_id": session_id, "todos": [{"id": 5}]}
    await served.refused("SetTodos", wrong_type, 400, "INVALID_ARGUMENT", "todos[0].id")
    assert await served.ok("GetTodos", {"session_id": session_id}) == {"todos": todos}
    await served.refused("GetTodos", {"session_id": "nope"}, 404, "NOT_FOUND")
    async with served.client.ws_connect("/ws") as ws:  # the WebSocket serves them too, by snake_case name
        await ws.send_json({"method": "get_todos", "params": {"session_id": session_id}, "id": 1})
        assert await ws.receive_json(timeout=10) == {"id": 1, "result": {"todos": todos}}
        await ws.send_json({"method": "delegate", "params": {"session_id": session_id}, "id": 2})
        refused = (await ws.receive_json(timeout=10))["error"]
        assert refused["code"] == "INVALID_ARGUMENT" and "agent_name is required" in refused["message"]


async def test_mcp_servers_over_http_refuse_in_band_as_grpc(served: Faces) -> None:
    hostile = {"name": "web", "enabled": True, "transport": {"http": {"url": "file:///etc/passwd"}}}
    reply = await served.ok("RegisterMcpServer", {"config": hostile})
    assert not reply["success"] and "is not an http:// or https:// URL" in reply["message"]
    with_env = {**hostile, "env": {"TOKEN": "x"}, "transport": {"http": {"url": "https://mcp.example/mcp"}}}
    reply = await served.ok("RegisterMcpServer", {"config": with_env})
    assert reply == {
        "success": False,
        "message": "web: env is for stdio servers; an http server takes headers",
    }
    stdio = {"name": "fx", "transport": {"stdio": {"command": sys.executable, "args": ["-c", "pass"]}}}
    reply = await served.ok("RegisterMcpServer", {"config": stdio})
    assert not reply["success"] and "--allow-api-mcp-commands" in reply["message"]
    await served.refused("RegisterMcpServer", {}, 400, "INVALID_ARGUMENT", "config.transport is required")
    two: dict[str, Any] = {"config": {"transport": {"stdio": {}, "http": {}}}}
    await served.refused("RegisterMcpServer", two, 400, "INVALID_ARGUMENT", "config.transport.http")

    idle = {"name": "later", "transport": {"http": {"url": "https://mcp.example/mcp"}}, "toolTimeoutSecs": 5}
    assert await served.ok("RegisterMcpServer", {"config": idle}) == {
        "success": True,
        "message": "registered MCP server later: not connected (enabled is false)",
    }
    listed = await served.ok("ListMcpServers", {})
    assert listed == as_json(await served.stub.ListMcpServers(later.ListMcpServersRequest()))
    assert listed["servers"] == [{"name": "later", "connected": False, "enabled": False, "tool_count": 0}]
    assert await served.ok("GetMcpTools", {"server_name": "later"}) == {"tools": []}
    assert await served.ok("DisconnectMcpServer", {"name": "nope"}) == {"success": False}
    connect = await served.ok("ConnectMcpServer", {"name": "nope"})
    assert not connect["success"] and "no MCP server is registered as 'nope'" in connect["message"]


async def test_metrics_costs_and_queues_over_http_are_grpcs(served: Faces, fake: FakeLLM) -> None:
    session_id = await a_conversation(served.live, fake)
    for name, request in (
        ("GetToolMetrics", later.GetToolMetricsRequest(session_id=session_id)),
        ("GetToolMetrics", later.GetToolMetricsRequest(tool_name="read_file")),
        ("GetCostSummary", later.GetCostSummaryRequest(session_id=session_id)),
        ("GetQueueStats", later.GetQueueStatsRequest(session_id=session_id)),
    ):
        over_grpc = as_json(await getattr(served.stub, name)(request))
        assert await served.ok(name, as_json(request)) == over_grpc, name
    metrics = await served.ok("GetToolMetrics", {"session_id": session_id})
    assert metrics["total_calls"] == "2" and metrics["tools"][0]["tool_name"] == "read_file"  # uint64 as text
    await served.refused("GetCostSummary", {"end_date": "yesterday"}, 400, "INVALID_ARGUMENT", "end_date")
    await served.refused("GetQueueStats", {"session_id": "nope"}, 404, "NOT_FOUND")


# --- LSP --------------------------------------------------------------------------------------


async def test_lsp_over_http_is_grpcs(workspace: Path, tmp_path: Path) -> None:
    command = f"{sys.executable} {LSP_FIXTURE} ok {tmp_path / 'probe'}"
    settings = replace(
        agent_settings(workspace, tmp_path / "data"),
        lsp_servers=[f"fixture:.fx={command}"],
        sandbox=SandboxSettings(read=(LSP_FIXTURE.parent,)),
    )
    (workspace / "a.fx").write_text("first version\nsecond line\n")
    async with faces(settings) as both:
        hover = await both.ok("LspHover", {"file_path": "a.fx", "line": 1, "column": 3})
        assert hover["found"] and "fixture hover at 1:3 of 'second line'" in hover["content"]
        request = later.LspHoverRequest(file_path="a.fx", line=1, column=3)
        assert hover == as_json(await both.stub.LspHover(request))
        listed = await both.ok("ListLspServers", {})
        assert listed == as_json(await both.stub.ListLspServers(later.ListLspServersRequest()))
        assert listed["servers"] == [
            {"language": "fixture", "name": "fixture-ls", "version": "1.0", "running": True}
        ]
        diagnostics = await both.ok("LspDiagnostics", {"filePath": "a.fx"})
        assert [d["message"] for d in diagnostics["diagnostics"]] == ["first line: first version"]
        assert diagnostics["diagnostics"][0]["range"]["start"] == {"line": 0, "character": 0}

        outside = tmp_path / "outside.fx"
        outside.write_text("x\n")
        await both.refused(
            "LspHover", {"file_path": str(outside)}, 400, "INVALID_ARGUMENT", "outside the workspace"
        )
        await both.refused("LspHover", {"file_path": "a.fx", "line": 40}, 400, "INVALID_ARGUMENT", "line 40")
        await both.refused("LspHover", {"file_path": "a.fx", "line": -1}, 400, "INVALID_ARGUMENT", "line")
        await both.refused(
            "StartLspServer", {"language": "cobol"}, 409, "FAILED_PRECONDITION", "no language server is known"
        )
        assert await both.ok("StopLspServer", {"language": "fixture"}) == {"success": True}
        assert await both.ok("ListLspServers", {}) == {"servers": []}


# --- memory and scheduled jobs, on SQLite and PostgreSQL ----------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("postgres_url")) if request.param == "postgresql" else ""


async def test_memories_over_http_are_grpcs(workspace: Path, tmp_path: Path, store_url: str) -> None:
    settings = replace(agent_settings(workspace, tmp_path / "data"), store=store_url)
    async with faces(settings) as both:
        session_id = await new_session(both.live)
        item = {
            "content": "User prefers TypeScript",
            "memoryType": "MEMORY_TYPE_SEMANTIC",
            "importance": 0.8,
            "tags": ["language"],
        }
        stored = await both.ok("StoreMemory", {"session_id": session_id, "memory": item})
        assert stored["success"] and stored["memory_id"]
        found = await both.stub.RetrieveMemory(
            later.RetrieveMemoryRequest(session_id=session_id, memory_id=stored["memory_id"])
        )
        assert (found.memory.content, found.memory.memory_type) == (
            item["content"],
            later.MEMORY_TYPE_SEMANTIC,
        )
        retrieved = await both.ok(
            "RetrieveMemory", {"session_id": session_id, "memory_id": stored["memory_id"]}
        )
        assert retrieved["memory"]["memory_type"] == "MEMORY_TYPE_SEMANTIC" and retrieved["memory"][
            "tags"
        ] == ["language"]
        assert retrieved["memory"]["access_count"] == found.memory.access_count + 1  # each retrieval counts

        over_grpc = await both.stub.StoreMemory(
            later.StoreMemoryRequest(
                session_id=session_id, memory=later.MemoryItem(content="Project uses React")
            )
        )
        search = {"session_id": session_id, "query": "React", "limit": 5}
        searched = await both.ok("SearchMemories", search)
        assert [m["id"] for m in searched["memories"]] == [over_grpc.memory_id] and searched[
            "total_count"
        ] == 1
        stats = await both.ok("GetMemoryStats", {"session_id": session_id})
        assert stats == as_json(
            await both.stub.GetMemoryStats(later.GetMemoryStatsRequest(session_id=session_id))
        )
        assert stats["stats"]["long_term_count"] == "2"  # semantic and episodic

        bad_type = {"session_id": session_id, "memory": {**item, "memory_type": 9}}
        await both.refused("StoreMemory", bad_type, 400, "INVALID_ARGUMENT", "memory.memory_type 9")
        bad_importance = {"session_id": session_id, "memory": {**item, "importance": "high"}}
        await both.refused("StoreMemory", bad_importance, 400, "INVALID_ARGUMENT", "memory.importance")
        await both.refused(
            "StoreMemory", {"session_id": session_id}, 400, "INVALID_ARGUMENT", "memory is required"
        )
        await both.refused("StoreMemory", {"session_id": "nope", "memory": item}, 404, "NOT_FOUND")
        no_tier = {"session_id": session_id}
        await both.refused("ClearMemories", no_tier, 400, "INVALID_ARGUMENT")
        unknown = {"session_id": session_id, "memory_id": "nope"}
        assert await both.ok("DeleteMemory", unknown) == {"success": False}
        assert await both.ok("RetrieveMemory", unknown) == {}
        assert await both.ok(
            "DeleteMemory", {"session_id": session_id, "memory_id": stored["memory_id"]}
        ) == {"success": True}
        cleared = await both.ok(
            "ClearMemories", {"session_id": session_id, "clear_long_term": True, "clear_short_term": True}
        )
        assert cleared == {"success": True, "cleared_count": "1"}  # uint64 as text
        await both.refused("SummarizeMemories", {"session_id": session_id}, 409, "FAILED_PRECONDITION")


async def test_cron_jobs_over_http_are_grpcs(workspace: Path, tmp_path: Path, store_url: str) -> None:
    settings = replace(
        agent_settings(workspace, tmp_path / "data"), store=store_url, cron=CronSettings(enabled=True)
    )
    async with faces(settings, clock=ManualClock(MONDAY_8AM)) as both:
        created = await both.ok(
            "CreateCronJob",
            {"name": "greet", "schedule": "every day at 9am", "command": "echo hi", "timeoutMs": "5000"},
        )
        job = created["job"]
        assert (job["schedule"], job["status"], job["job_type"], job["timeout_ms"]) == (
            "0 9 * * *", "CRON_JOB_STATUS_ACTIVE", "CRON_JOB_TYPE_SHELL", "5000",
        )  # fmt: skip
        got = await both.ok("GetCronJob", {"id": job["id"]})
        assert (
            got == {"job": job} == as_json(await both.stub.GetCronJob(later.GetCronJobRequest(name="greet")))
        )
        listed = await both.ok("ListCronJobs", {})
        assert listed == as_json(await both.stub.ListCronJobs(later.ListCronJobsRequest())) == {"jobs": [job]}

        paused = await both.ok("PauseCronJob", {"id": job["id"]})
        assert paused["job"]["status"] == "CRON_JOB_STATUS_PAUSED" and "next_run" not in paused["job"]
        resumed = await both.ok("ResumeCronJob", {"id": job["id"]})
        assert resumed["job"]["status"] == "CRON_JOB_STATUS_ACTIVE"
        updated = await both.ok("UpdateCronJob", {"id": job["id"], "command": "echo changed"})
        assert updated["job"]["command"] == "echo changed" and updated["job"]["schedule"] == "0 9 * * *"

        run = await both.ok("RunCronJob", {"id": job["id"]})
        assert run["success"] and run["execution"]["status"] == "CRON_EXECUTION_STATUS_SUCCESS"
        assert run["execution"]["stdout"].strip() == "changed" and run["execution"]["exit_code"] == 0
        history = await both.ok("GetCronHistory", {"id": job["id"], "limit": 5})
        over_grpc = await both.stub.GetCronHistory(later.GetCronHistoryRequest(id=job["id"], limit=5))
        assert history == as_json(over_grpc) and [e["id"] for e in history["executions"]] == [
            run["execution"]["id"]
        ]

        parsed = await both.ok("ParseCronSchedule", {"input": "every day at 9am"})
        assert (parsed["success"], parsed["cron_expression"]) == (True, "0 9 * * *")
        unreadable = await both.ok("ParseCronSchedule", {"input": "whenever"})
        assert not unreadable["success"] and unreadable["error"]

        bad = {"name": "bad", "schedule": "61 * * * *", "command": "true"}
        await both.refused("CreateCronJob", bad, 400, "INVALID_ARGUMENT", "schedule")
        await both.refused(
            "CreateCronJob",
            {**bad, "schedule": "* * * * *", "jobType": 7},
            400,
            "INVALID_ARGUMENT",
            "job_type 7",
        )
        await both.refused(
            "CreateCronJob", {**bad, "jobType": "CRON_JOB_TYPE_NOPE"}, 400, "INVALID_ARGUMENT", "jobType"
        )
        await both.refused("GetCronJob", {"id": "nope"}, 404, "NOT_FOUND")
        await both.refused("RunCronJob", {"id": "nope"}, 404, "NOT_FOUND")
        assert await both.ok("DeleteCronJob", {"id": job["id"]}) == {"success": True, "error": ""}
        assert await both.ok("ListCronJobs", {}) == {"jobs": []}


async def test_cron_over_http_is_refused_until_the_operator_enables_it(served: Faces) -> None:
    await served.refused("ListCronJobs", {}, 409, "FAILED_PRECONDITION", "--enable-cron")
    job = {"name": "x", "schedule": "* * * * *", "command": "true"}
    await served.refused("CreateCronJob", job, 409, "FAILED_PRECONDITION", "--enable-cron")


# --- skill additions ----------------------------------------------------------------------------


async def test_skills_over_http_are_grpcs(workspace: Path, tmp_path: Path) -> None:
    operator = tmp_path / "operator-skills"
    (operator / "release").mkdir(parents=True)
    frontmatter = "name: release\ndescription: Cut a release.\nallowed-tools: Read\nkind: agent\n"
    (operator / "release" / "SKILL.md").write_text(f"---\n{frontmatter}---\nRun the checklist.\n")
    settings = replace(agent_settings(workspace, tmp_path / "data"), skill_dirs=[operator])
    async with faces(settings) as both:
        release = await both.ok("GetSkill", {"name": "release"})
        assert release == as_json(await both.stub.GetSkill(later.GetSkillRequest(name="release")))
        [skill] = release["skills"]
        assert (skill["allowed_tools"], skill["kind"], skill["content"]) == (
            "Read",
            "agent",
            "Run the checklist.",
        )
        assert await both.ok("GetSkill", {"name": "no-such-skill"}) == {"skills": []}
        claude = await both.ok("GetClaudeCodeSkills", {})
        assert claude == as_json(await both.stub.GetClaudeCodeSkills(later.GetClaudeCodeSkillsRequest()))

        outside = {"session_id": await new_session(both.live), "directory": str(tmp_path)}
        await both.refused("LoadSkillsFromDir", outside, 400, "INVALID_ARGUMENT", "directory", "outside")
        await both.refused("SearchSkills", {"query": "pdf"}, 409, "FAILED_PRECONDITION")
        await both.refused(
            "InstallSkill", {"source": "acme/skills@pdf", "global": "yes"}, 400, "INVALID_ARGUMENT", "global"
        )


# --- provider configuration ---------------------------------------------------------------------

KIMI_KEY = "sk-kimi-http-0123456789abcdef"
KIMI_MODEL = {
    "id": "kimi-k2",
    "name": "Kimi K2",
    "toolCall": True,
    "releaseDate": "2025-07-11",
    "modalities": {"input": ["text"], "output": ["text"]},
    "cost": {"input": 0.6, "output": 2.5, "cacheRead": 0.15},
    "limit": {"context": 131072, "output": 8192},
}


async def test_providers_over_http_are_grpcs_and_never_show_a_key(
    workspace: Path, tmp_path: Path, store_url: str
) -> None:
    settings = replace(agent_settings(workspace, tmp_path / "data"), store=store_url)
    async with FakeLLM(fallback=text("from kimi")) as kimi, faces(settings) as both:
        replies: list[Any] = []

        async def ok(method: str, body: object) -> Any:
            replies.append(await both.ok(method, body))
            return replies[-1]

        given = {"name": "kimi", "baseUrl": kimi.base_url, "apiKey": KIMI_KEY, "models": [KIMI_MODEL]}
        added = await ok("AddProvider", {"provider": given})
        over_grpc = await both.stub.GetProvider(later.GetProviderRequest(name="kimi"))
        assert added == {"success": True, "error": "", **as_json(over_grpc)}
        assert "api_key" not in added["provider"]
        assert added["provider"]["models"][0]["cost"]["cache_read"] == 0.15
        assert await ok("GetProvider", {"name": "kimi"}) == as_json(over_grpc)
        assert await generate(both.stub, later.LLMConfig(provider="kimi")) == "from kimi"
        assert kimi.requests[-1].authorization == f"Bearer {KIMI_KEY}"

        # An update without api_key (or with null) keeps the key; "" clears it.
        for unchanged in ({"name": "kimi"}, {"name": "kimi", "apiKey": None, "base_url": None}):
            kept = await ok("UpdateProvider", {"provider": unchanged})
            assert kept["provider"] == added["provider"]
            assert await generate(both.stub, later.LLMConfig(provider="kimi")) == "from kimi"
            assert kimi.requests[-1].authorization == f"Bearer {KIMI_KEY}"
        await ok("UpdateProvider", {"provider": {"name": "kimi", "api_key": ""}})
        assert await generate(both.stub, later.LLMConfig(provider="kimi")) == "from kimi"
        assert kimi.requests[-1].authorization is None

        assert await ok("SetDefaultModel", {"provider": "kimi", "model": "kimi-k2"}) == {
            "success": True,
            "error": "",
            "provider": "kimi",
            "model": "kimi-k2",
        }
        default = await ok("GetDefaultModel", {})
        assert default == {"provider": "kimi", "model": "kimi-k2"}
        assert default == as_json(await both.stub.GetDefaultModel(later.GetDefaultModelRequest()))
        listed = await ok("ListProviders", {})
        assert listed == as_json(await both.stub.ListProviders(later.ListProvidersRequest()))
        assert listed["default_provider"] == "kimi"

        # base_url "" clears the endpoint (the protocol's public API), absent left it as it was.
        cleared = await ok("UpdateProvider", {"provider": {"name": "kimi", "base_url": ""}})
        assert "base_url" not in cleared["provider"]
        assert cleared["provider"] == as_json(
            (await both.stub.GetProvider(later.GetProviderRequest(name="kimi"))).provider
        )
        assert await ok("RemoveProvider", {"name": "kimi"}) == {"success": True, "error": ""}
        assert await ok("GetDefaultModel", {}) == {}
        assert KIMI_KEY not in repr(replies)


async def test_bad_provider_input_over_http_is_named(served: Faces) -> None:
    await served.ok("AddProvider", {"provider": {"name": "kimi", "models": [{"id": "kimi-k2"}]}})
    await served.refused("AddProvider", {"provider": {"name": "kimi"}}, 409, "ALREADY_EXISTS", "kimi")
    await served.refused("GetProvider", {"name": "nobody"}, 404, "NOT_FOUND", "nobody")
    await served.refused("RemoveProvider", {}, 400, "INVALID_ARGUMENT", "name is required")
    missing = {"provider": {"name": "nobody", "baseUrl": "https://x.example"}}
    await served.refused("UpdateProvider", missing, 404, "NOT_FOUND", "nobody")
    for body, words in [
        ({}, ("provider is required",)),
        ({"provider": {"name": "two words"}}, ("provider.name",)),
        ({"provider": {"name": "a", "baseUrl": "ftp://files.example"}}, ("provider.base_url",)),
        ({"provider": {"name": "a", "baseUrl": 5}}, ("baseUrl",)),
        ({"provider": {"name": "a", "api_key": "sk-a", "apiKey": "sk-b"}}, ("given twice",)),
        (
            {"provider": {"name": "a", "models": [{"id": "m", "apiKey": "sk-x"}]}},
            ("provider.models[0].api_key",),
        ),
        ({"provider": {"name": "a", "models": [{"id": "m"}, {"id": "m"}]}}, ("listed twice",)),
        ({"provider": {"name": "a", "models": [{"id": "m", "limit": {"context": -1}}]}}, ("context",)),
    ]:
        await served.refused("AddProvider", body, 400, "INVALID_ARGUMENT", *words)
    refused = {"provider": "kimi", "model": "gpt-4"}
    await served.refused("SetDefaultModel", refused, 400, "INVALID_ARGUMENT", "not one of kimi's models")
    assert [p["name"] for p in (await served.ok("ListProviders", {}))["providers"]] == ["kimi"]


# --- planning and goal tracking -----------------------------------------------------------------


async def test_plans_and_goals_over_http_are_grpcs(served: Faces, fake: FakeLLM) -> None:
    session_id = await new_session(served.live)
    fake.script(answer(PLAN))
    asked = {"sessionId": session_id, "prompt": "Add JWT auth to the API", "context": "Express"}
    created = await served.ok("CreatePlan", asked)
    assert "Express" in fake.requests[-1].messages[-1]["content"]
    over_grpc = await served.stub.GetPlan(later.GetPlanRequest(session_id=session_id))
    assert created == as_json(over_grpc)
    plan = created["plan"]
    assert (plan["complexity"], plan["estimated_steps"], plan["steps"][1]["status"]) == (
        "COMPLEXITY_COMPLEX",
        3,
        "STEP_STATUS_PENDING",
    )
    assert (plan["steps"][0]["tool"], plan["steps"][2]["dependencies"]) == (
        "read_file",
        ["read", "middleware"],
    )
    got = await served.ok("GetPlan", {"session_id": session_id, "plan_id": "current"})
    assert got == created

    fake.script(answer(GOAL))
    goal = (await served.ok("ExtractGoal", {"session_id": session_id, "prompt": "a todo API"}))["goal"]
    assert (goal["description"], goal["success_criteria"]) == (GOAL["description"], GOAL["success_criteria"])
    assert int(goal["created_at"]) > 0 and "achieved_at" not in goal
    fake.script(
        answer({"achieved": False, "progress": 0.5, "remaining_criteria": ["Todos are stored per user"]})
    )
    checked = {"session_id": session_id, "goal": goal, "current_state": "users can log in"}
    assert await served.ok("CheckGoalAchievement", checked) == {
        "achieved": False,
        "progress": 0.5,
        "remaining_criteria": ["Todos are stored per user"],
    }
    assert "users can log in" in fake.requests[-1].messages[-1]["content"]

    await served.refused("CheckGoalAchievement", {"session_id": session_id}, 400, "INVALID_ARGUMENT", "goal")
    await served.refused("GetPlan", {"session_id": session_id, "plan_id": "other"}, 404, "NOT_FOUND")
    await served.refused("CreatePlan", {"session_id": "nope", "prompt": "x"}, 404, "NOT_FOUND", "nope")
    await served.refused(
        "CreatePlan", {"session_id": session_id, "context": 5}, 400, "INVALID_ARGUMENT", "context"
    )


async def test_planning_over_http_without_a_model_says_what_to_configure(
    workspace: Path, tmp_path: Path
) -> None:
    async with faces(agent_settings(workspace, tmp_path / "data")) as both:
        asked = {"session_id": await new_session(both.live), "prompt": "Add JWT auth"}
        await both.refused("CreatePlan", asked, 409, "FAILED_PRECONDITION", "no LLM is configured")
