"""OpenTelemetry traces (base/telemetry.py, docs/operations/telemetry.md): a real `a3s-agent serve`
exporting over OTLP/HTTP to a receiver in the test, which decodes what it gets with
opentelemetry-proto. The six-turn task (benchmarks/common.py) over gRPC and over HTTP gives one
trace under the client's `traceparent`; a subagent's spans are under its `task` call; no content is
recorded unless opted in, and then redacted; JSON log lines name their trace and span; with no
endpoint configured nothing is traced and no exporter runs."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp
import grpc
import pytest
from acp import text_block
from aiohttp import web
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import RequestParamsMeta
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from a3s_agent.base.sparse_log import LINES_PER_WINDOW, WINDOW_S
from a3s_agent.faces.acp.content import PromptBlock
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_llm import FakeLLM, Reply, tool_call
from a3s_agent.testing.fake_llm import ToolCall as FakeCall
from benchmarks.common import TASK_SOURCE, task_turns

from .conftest import ServerProcess, eventually, run_fresh_server, user
from .fault.test_crash_repair import processes_with
from .postgres import fresh_database
from .security.test_listeners import TOKEN, GuardedServer
from .test_acp import Editor, acp_agent
from .test_mcp_server import stdio_command
from .test_replicas import kill_leftovers, replica_servers

SECRET_PROMPT = "the prompt says swordfish-4711"
TOOL_NAMES = ["read_file", "grep", "edit_file", "bash", "write_file"]


@dataclass
class Receiver:
    """An OTLP/HTTP receiver: every span it was sent, with its resource's attributes, and every
    metrics export (tests/test_metrics.py)."""

    port: int = 0
    spans: list[Span] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)

    async def export(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.bodies.append(body)
        decoded = ExportTraceServiceRequest.FromString(body)
        for resource_spans in decoded.resource_spans:
            self.resources.append(attributes(resource_spans.resource))
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    async def export_metrics(self, request: web.Request) -> web.Response:
        self.metrics.append(ExportMetricsServiceRequest.FromString(await request.read()))
        reply = ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    def trace(self, trace_id: bytes) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]


def attributes(item: Any) -> dict[str, Any]:
    """A span's (or resource's) attributes as plain values."""
    found: dict[str, Any] = {}
    for kv in item.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            found[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        else:
            found[kv.key] = getattr(value, kind)
    return found


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", found.export)
    app.router.add_post("/v1/metrics", found.export_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    found.port = runner.addresses[0][1]
    yield found
    await runner.cleanup()


def otel_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_SERVICE_NAME": "agent-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export soon after each span ends
    }


class Unsandboxed(ServerProcess):
    """The server with `--sandbox off`: what is traced does not depend on the machine's sandbox."""

    def command(self) -> list[str]:
        return [*super().command(), "--sandbox", "off"]


def complete(
    receiver: Receiver, trace_id: bytes, root: str, agents: int = 1, chats: int = 6
) -> list[Span] | None:
    """The trace once its request's span (named `root`...), `agents` generations' and `chats`
    model requests' spans are in."""
    spans = receiver.trace(trace_id)
    done = (
        len(named(spans, root)) == 1
        and len(named(spans, "invoke_agent")) == agents
        and len(named(spans, "chat")) == chats
    )
    return spans if done else None


def task_workspace(workspace: Path) -> Path:
    """A new workspace with the six-turn task's file."""
    workspace.mkdir()
    (workspace / "task.py").write_text(TASK_SOURCE)
    return workspace


@pytest.fixture
async def served(tmp_path: Path, fake: FakeLLM) -> AsyncIterator[Any]:
    """Start `a3s-agent serve` against the fake model with `env`; stopped at the end."""
    started: list[ServerProcess] = []

    async def start(env: dict[str, str]) -> ServerProcess:
        workspace = task_workspace(tmp_path / f"workspace{len(started)}")
        llm = {"A3S_LLM_MODEL": "fake-model", "A3S_LLM_BASE_URL": fake.base_url, "A3S_LLM_API_KEY": "sk-test"}
        server = Unsandboxed(workspace, tmp_path / f"data{len(started)}", {**llm, **env})
        started.append(server)
        await asyncio.to_thread(server.start)
        return server

    yield start
    for server in started:
        if server.proc is not None and server.proc.poll() is None:
            await asyncio.to_thread(server.stop)


def script_task(fake: FakeLLM) -> None:
    """The six-turn task, the user's prompt carried in each call's arguments to show none is recorded."""
    turns: list[Any] = []
    for turn in task_turns():
        calls = turn.get("tool_calls")
        if isinstance(calls, list):
            turns.append(Reply(tool_calls=tuple(FakeCall(c["name"], c["arguments"]) for c in calls)))
        else:
            turns.append(Reply(content=str(turn["content"])))
    fake.script(*turns)


def traceparent() -> tuple[str, bytes, bytes]:
    """A client's W3C traceparent header and its trace and span ids."""
    trace_id, span_id = secrets.token_bytes(16), secrets.token_bytes(8)
    return f"00-{trace_id.hex()}-{span_id.hex()}-01", trace_id, span_id


async def generate(server: ServerProcess, prompt: str, metadata: list[tuple[str, str]]) -> str:
    """A new session's StreamGenerate of `prompt` over gRPC with `metadata`, to its end; its id."""
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        session_id: str = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
        go = pb.GenerateRequest(session_id=session_id, messages=[user(prompt)])
        chunks = [c async for c in stub.StreamGenerate(go, metadata=metadata)]
    assert chunks[-1].type == pb.GenerateChunk.CHUNK_TYPE_DONE
    return session_id


def named(spans: list[Span], prefix: str) -> list[Span]:
    return [s for s in spans if s.name.startswith(prefix)]


def check_generation(
    spans: list[Span], parent: Span, fake: FakeLLM, session_id: str, asked: frozenset[str] = frozenset()
) -> Span:
    """The generation's spans under `parent`: invoke_agent, six chats and five tool calls under it,
    with the conventions' names and the fake model's tokens; returns the invoke_agent span."""
    (invoke,) = [s for s in named(spans, "invoke_agent") if s.parent_span_id == parent.span_id]
    assert invoke.name == "invoke_agent a3s-agent"
    given = attributes(invoke)
    assert given["gen_ai.operation.name"] == "invoke_agent"
    assert given["gen_ai.agent.name"] == "a3s-agent"
    assert given["gen_ai.request.model"] == "fake-model"
    assert given["gen_ai.provider.name"] == "openai"
    assert given["gen_ai.conversation.id"] == session_id
    chats = sorted((s for s in spans if s.parent_span_id == invoke.span_id and s.name.startswith("chat")),
                   key=lambda s: s.start_time_unix_nano)  # fmt: skip
    tools = sorted(named([s for s in spans if s.parent_span_id == invoke.span_id], "execute_tool"),
                   key=lambda s: s.start_time_unix_nano)  # fmt: skip
    assert [s.name for s in chats] == ["chat fake-model"] * 6
    assert all(s.kind == Span.SPAN_KIND_CLIENT for s in chats)
    assert [s.name for s in tools] == [f"execute_tool {name}" for name in TOOL_NAMES]
    usages = fake.usages[-6:]
    for chat, usage in zip(chats, usages, strict=True):
        got = attributes(chat)
        assert got["gen_ai.operation.name"] == "chat"
        assert got["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert got["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert got["gen_ai.response.model"] == (fake.answering_model or "fake-model")
    assert [attributes(c)["gen_ai.response.finish_reasons"] for c in chats] == [["tool_calls"]] * 5 + [
        ["stop"]
    ]
    for tool, name in zip(tools, TOOL_NAMES, strict=True):
        got = attributes(tool)
        assert got["gen_ai.operation.name"] == "execute_tool"
        assert got["gen_ai.tool.name"] == name and got["gen_ai.tool.call.id"]
        assert got["a3s.tool.outcome"] == "success"
        if name in asked:  # the session's policy asks: someone confirmed it
            assert (got["a3s.permission.decision"], got["a3s.confirmation"]) == ("ask", "approved")
        else:
            assert got["a3s.permission.decision"] == "allow" and "a3s.confirmation" not in got
    assert attributes(tools[TOOL_NAMES.index("bash")])["a3s.tool.sandbox"] == "off"
    assert attributes(invoke)["gen_ai.usage.input_tokens"] == sum(u["prompt_tokens"] for u in usages)
    assert attributes(invoke)["gen_ai.response.finish_reasons"] == ["stop"]
    # Each model request carried its chat span's context to the model.
    sent = [r.headers.get("traceparent", "") for r in fake.requests[-6:]]
    assert sent == [f"00-{c.trace_id.hex()}-{c.span_id.hex()}-01" for c in chats]
    return invoke


def no_content(receiver: Receiver) -> None:
    """Neither the prompt nor the file's text nor a tool's output reached the collector."""
    everything = b"".join(receiver.bodies)
    assert b"swordfish" not in everything
    assert b"def greet" not in everything and b"hello " not in everything


async def test_a_task_over_grpc_is_one_trace_under_the_callers_traceparent(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served({**otel_env(receiver), "OTEL_RESOURCE_ATTRIBUTES": "service.version=ops-1"})
    script_task(fake)
    fake.answering_model = "fake-model-2026-01-01"  # the snapshot that answers, as OpenAI names it
    header, trace_id, client_span = traceparent()
    metadata = [("traceparent", header), ("baggage", "user.secret=swordfish-4711")]
    session_id = await generate(server, SECRET_PROMPT, metadata)
    assert all("baggage" not in r.headers for r in fake.requests)  # the caller's, not the model's
    spans = await eventually(lambda: complete(receiver, trace_id, "a3s.code"), "the task's trace")
    (rpc,) = [s for s in spans if s.name.endswith("/StreamGenerate")]
    assert rpc.parent_span_id == client_span and rpc.kind == Span.SPAN_KIND_SERVER
    assert attributes(rpc)["rpc.system"] == "grpc"
    check_generation(spans, rpc, fake, session_id)
    assert receiver.resources[0]["service.name"] == "agent-under-test"
    assert receiver.resources[0]["service.version"] == "ops-1"  # the operator's, not ours
    no_content(receiver)


async def test_anthropic_requests_carry_their_spans_context_and_tokens(
    receiver: Receiver, served: Any
) -> None:
    async with FakeAnthropic(api_key="sk-ant-test") as claude:
        claude.script(tool_call("read_file", {"path": "task.py"}, id="r1"), "It greets.")
        llm = {"A3S_LLM_PROVIDER": "anthropic", "A3S_LLM_BASE_URL": claude.base_url}
        server = await served({**otel_env(receiver), **llm, "A3S_LLM_API_KEY": "sk-ant-test"})
        header, trace_id, _ = traceparent()
        await generate(server, "what does it do?", [("traceparent", header)])
        spans = await eventually(lambda: complete(receiver, trace_id, "a3s.code", chats=2), "the trace")
        chats = sorted(named(spans, "chat"), key=lambda s: s.start_time_unix_nano)
        sent = [r.headers.get("traceparent") for r in claude.requests]
        assert sent == [f"00-{c.trace_id.hex()}-{c.span_id.hex()}-01" for c in chats]
        for chat, usage in zip(chats, claude.usages, strict=True):
            got = attributes(chat)
            assert got["gen_ai.provider.name"] == "anthropic"
            assert got["gen_ai.response.model"] == "fake-model"  # the message's own model
            assert got["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
            assert got["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
            for ours, theirs in (
                ("gen_ai.usage.cache_read.input_tokens", "cache_read_input_tokens"),
                ("gen_ai.usage.cache_creation.input_tokens", "cache_creation_input_tokens"),
            ):
                assert got.get(ours, 0) == usage.get(theirs, 0)


async def test_an_automatic_compaction_is_a_span_of_its_generation(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served(otel_env(receiver))
    fake.fallback = "Goal: the parser. Done so far: nothing."  # each summary, and the answer
    words = [" ".join(f"m{i}w{n}" for n in range(600)) for i in range(40)]
    roles = [pb.Message.ROLE_ASSISTANT if i % 2 else pb.Message.ROLE_USER for i in range(40)]
    history = [pb.Message(role=role, content=text) for role, text in zip(roles, words, strict=True)]
    header, trace_id, _ = traceparent()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        config = pb.SessionConfig(auto_compact=True, max_context_length=32_000)
        created = await stub.CreateSession(pb.CreateSessionRequest(config=config, initial_context=history))
        go = pb.GenerateRequest(session_id=created.session_id, messages=[user("go on")])
        [c async for c in stub.StreamGenerate(go, metadata=[("traceparent", header)])]

    def compacted() -> list[Span] | None:
        spans = receiver.trace(trace_id)
        return spans if named(spans, "compact_context") and named(spans, "invoke_agent") else None

    spans = await eventually(compacted, "the compaction's span")
    (compaction,) = named(spans, "compact_context")
    (invoke,) = named(spans, "invoke_agent")
    assert compaction.parent_span_id == invoke.span_id
    got = attributes(compaction)
    assert got["a3s.compaction.trigger"] == "threshold"
    assert got["a3s.context.tokens_after"] < got["a3s.context.tokens_before"]
    assert got["a3s.context.messages_after"] < got["a3s.context.messages_before"]


async def test_a_clients_compact_context_is_a_span_of_its_call(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served(otel_env(receiver))
    fake.fallback = "Goal: the parser. Done so far: nothing."
    history = [
        pb.Message(
            role=pb.Message.ROLE_ASSISTANT if i % 2 else pb.Message.ROLE_USER, content=f"turn {i} " * 50
        )
        for i in range(20)
    ]
    header, trace_id, client_span = traceparent()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        created = await stub.CreateSession(pb.CreateSessionRequest(initial_context=history))
        request = pb.CompactContextRequest(session_id=created.session_id)
        await stub.CompactContext(request, metadata=[("traceparent", header)])

    def compacted() -> list[Span] | None:
        spans = receiver.trace(trace_id)
        return spans if named(spans, "compact_context") and named(spans, "a3s.code") else None

    spans = await eventually(compacted, "the compaction's span")
    (rpc,) = named(spans, "a3s.code")
    assert rpc.name.endswith("/CompactContext") and rpc.parent_span_id == client_span
    (compaction,) = named(spans, "compact_context")
    assert compaction.parent_span_id == rpc.span_id
    got = attributes(compaction)
    assert got["a3s.compaction.trigger"] == "requested"
    assert got["gen_ai.conversation.id"] == created.session_id
    assert got["a3s.context.messages_after"] < got["a3s.context.messages_before"]


async def test_a_web_fetch_carries_its_spans_traceparent_through_a_redirect(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    seen: list[tuple[str, str]] = []

    async def page(request: web.Request) -> web.StreamResponse:
        seen.append((request.path, request.headers.get("traceparent", "")))
        if request.path == "/moved":
            raise web.HTTPFound("/page?key=sk-query-secret-1234")
        return web.Response(text="the page", content_type="text/plain")

    site = web.Application()
    site.router.add_get("/{name}", page)
    runner = web.AppRunner(site)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        server = await served({**otel_env(receiver), "A3S_FETCH_ALLOW_PRIVATE": "1"})
        fake.script(tool_call("web_fetch", {"url": f"http://127.0.0.1:{port}/moved"}, id="w1"), "read it")
        header, trace_id, _ = traceparent()
        await generate(server, "fetch it", [("traceparent", header)])
        spans = await eventually(lambda: complete(receiver, trace_id, "a3s.code", chats=2), "the trace")
    finally:
        await runner.cleanup()
    (tool,) = named(spans, "execute_tool web_fetch")
    assert attributes(tool)["a3s.tool.outcome"] == "success"
    (get,) = [s for s in spans if s.name == "GET" and s.parent_span_id == tool.span_id]
    assert get.kind == Span.SPAN_KIND_CLIENT
    assert attributes(get) == {
        "http.request.method": "GET",
        "server.address": "127.0.0.1",
        "http.response.status_code": 200,
    }
    expected = f"00-{trace_id.hex()}-{get.span_id.hex()}-01"
    assert seen == [("/moved", expected), ("/page", expected)]
    assert b"sk-query-secret" not in b"".join(receiver.bodies)


KEY_IN_PROMPT = "sk-proj-" + "Q7r2" * 8
KEY_IN_FILE = "ghp_" + "x9Lm" * 9


async def test_opted_in_content_is_recorded_with_secrets_redacted(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    content = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    server = await served({**otel_env(receiver), **content})
    (server.workspace / "notes.txt").write_text(f"deploy notes\nGITHUB_TOKEN={KEY_IN_FILE}\n")
    fake.script(tool_call("read_file", {"path": "notes.txt"}, id="r1"), "The notes name a token.")
    header, trace_id, _ = traceparent()
    await generate(server, f"read notes.txt; my key is {KEY_IN_PROMPT}", [("traceparent", header)])
    spans = await eventually(lambda: complete(receiver, trace_id, "a3s.code", chats=2), "the trace")
    first, second = sorted(named(spans, "chat"), key=lambda s: s.start_time_unix_nano)
    asked = json.loads(attributes(first)["gen_ai.input.messages"])
    assert asked[-1]["role"] == "user"
    assert asked[-1]["parts"] == [{"type": "text", "content": "read notes.txt; my key is [redacted]"}]
    assert json.loads(attributes(first)["gen_ai.system_instructions"])[0]["type"] == "text"
    (reply,) = json.loads(attributes(first)["gen_ai.output.messages"])
    assert reply["finish_reason"] == "tool_calls"
    assert [(p["type"], p["name"], json.loads(p["arguments"])) for p in reply["parts"]] == [
        ("tool_call", "read_file", {"path": "notes.txt"})
    ]
    (answer,) = json.loads(attributes(second)["gen_ai.output.messages"])
    assert answer["parts"] == [{"type": "text", "content": "The notes name a token."}]
    returned = json.loads(attributes(second)["gen_ai.input.messages"])[-1]
    assert returned["role"] == "tool" and "deploy notes" in returned["parts"][0]["response"]
    (read,) = named(spans, "execute_tool read_file")
    assert json.loads(attributes(read)["gen_ai.tool.call.arguments"]) == {"path": "notes.txt"}
    result = attributes(read)["gen_ai.tool.call.result"]
    assert "deploy notes" in result and "[redacted]" in result
    everything = b"".join(receiver.bodies)
    assert KEY_IN_PROMPT.encode() not in everything and KEY_IN_FILE.encode() not in everything
    # The model was sent both: only the collector's copy is redacted.
    assert KEY_IN_PROMPT in json.dumps(fake.requests[0].body)


async def test_a_denied_call_says_so_on_its_span(receiver: Receiver, served: Any, fake: FakeLLM) -> None:
    server = await served(otel_env(receiver))
    fake.script(tool_call("bash", {"command": "rm -rf build"}, id="b1"), "understood")
    header, trace_id, _ = traceparent()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
        policy = pb.PermissionPolicy(enabled=True, deny=[pb.PermissionRule(rule="Bash(rm:*)")])
        await stub.SetPermissionPolicy(pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy))
        go = pb.GenerateRequest(session_id=session_id, messages=[user("clean up")])
        [c async for c in stub.StreamGenerate(go, metadata=[("traceparent", header)])]
    spans = await eventually(lambda: complete(receiver, trace_id, "a3s.code", chats=2), "the trace")
    (call,) = named(spans, "execute_tool bash")
    got = attributes(call)
    assert (got["a3s.permission.decision"], got["a3s.tool.outcome"]) == ("deny", "error")
    assert "a3s.tool.sandbox" not in got  # nothing was spawned


async def test_an_acp_prompt_is_one_trace_under_its_meta_traceparent(
    receiver: Receiver, tmp_path: Path, fake: FakeLLM
) -> None:
    workspace = task_workspace(tmp_path / "editor")
    script_task(fake)
    header, trace_id, client_span = traceparent()
    editor = Editor(answers=["allow-once"] * 5)
    env = {**otel_env(receiver), "A3S_SANDBOX": "off"}
    async with acp_agent(editor, workspace, fake, tmp_path / "data", env=env) as conn:
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        prompt: list[PromptBlock] = [text_block(SECRET_PROMPT)]
        reply = await conn.prompt(session_id=session.session_id, prompt=prompt, traceparent=header)
    assert reply.stop_reason == "end_turn"
    spans = await eventually(lambda: complete(receiver, trace_id, "session/prompt"), "the prompt's trace")
    (request,) = named(spans, "session/prompt")
    assert request.parent_span_id == client_span and request.kind == Span.SPAN_KIND_SERVER
    # The editor's policy asks before edits and commands; the editor allowed each once.
    check_generation(spans, request, fake, session.session_id, frozenset({"edit_file", "bash", "write_file"}))
    no_content(receiver)


async def test_an_mcp_agent_task_is_one_trace_under_its_meta_traceparent(
    receiver: Receiver, tmp_path: Path, fake: FakeLLM
) -> None:
    workspace = task_workspace(tmp_path / "mcp")
    fake.script(tool_call("read_file", {"path": "task.py"}, id="r1"), "It greets.")
    command = stdio_command(workspace, tmp_path / "data", fake, "--mcp-tools", "agent_task")
    command.env = {**(command.env or {}), **otel_env(receiver), "A3S_SANDBOX": "off"}
    header, trace_id, client_span = traceparent()
    made_up, made_up_trace, _ = traceparent()
    other, other_trace, other_client_span = traceparent()
    async with Client(command) as client:
        listed = await client.list_tools(meta=cast(RequestParamsMeta, {"traceparent": other}))
        assert [tool.name for tool in listed.tools] == ["agent_task"]
        with pytest.raises(MCPError, match="unknown tool"):  # a name the caller made up is not a span's
            await client.call_tool("made-up-1234", {}, meta=cast(RequestParamsMeta, {"traceparent": made_up}))
        done = await client.call_tool(
            "agent_task", {"task": SECRET_PROMPT}, meta=cast(RequestParamsMeta, {"traceparent": header})
        )
    assert not done.is_error
    spans = await eventually(lambda: complete(receiver, trace_id, "tools/call", chats=2), "the call's trace")
    (call,) = named(spans, "tools/call agent_task")
    assert call.parent_span_id == client_span and call.kind == Span.SPAN_KIND_SERVER
    assert attributes(call)["mcp.method.name"] == "tools/call"
    (invoke,) = named(spans, "invoke_agent")
    assert invoke.parent_span_id == call.span_id
    (unknown,) = receiver.trace(made_up_trace)
    assert unknown.name == "tools/call" and "gen_ai.tool.name" not in attributes(unknown)
    (read,) = named(spans, "execute_tool read_file")
    assert read.parent_span_id == invoke.span_id
    # Its other requests are server spans too, under their own _meta's trace context.
    (listed_span,) = receiver.trace(other_trace)
    assert (listed_span.name, attributes(listed_span)["mcp.method.name"]) == ("tools/list", "tools/list")
    assert listed_span.parent_span_id == other_client_span and listed_span.kind == Span.SPAN_KIND_SERVER
    assert [s.name for s in receiver.spans if s.name in ("initialize", "server/discover")]  # the handshake
    no_content(receiver)


async def test_a_malformed_traceparent_starts_a_trace_of_our_own(receiver: Receiver, served: Any) -> None:
    server = await served(otel_env(receiver))
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        bad = [("traceparent", "00-" + "z" * 32 + "-" + "0" * 16 + "-01" + "x" * 4000)]
        session_id = (await stub.CreateSession(pb.CreateSessionRequest(), metadata=bad)).session_id
    assert session_id

    def created() -> list[Span]:
        return named(receiver.spans, "a3s.code.agent.v1.CodeAgentService/CreateSession")

    (span,) = await eventually(created, "CreateSession's span")
    assert span.parent_span_id == b"" and len(span.trace_id) == 16


async def test_a_task_over_http_is_one_trace_under_the_callers_traceparent(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served(otel_env(receiver))
    script_task(fake)
    header, trace_id, client_span = traceparent()
    base = f"http://127.0.0.1:{server.http_port}"
    async with aiohttp.ClientSession(base) as http:
        async with http.post("/sessions", json={}) as reply:
            assert reply.status == 201
            session_id = (await reply.json())["session_id"]
        body = {"messages": [{"role": "ROLE_USER", "content": SECRET_PROMPT}]}
        async with http.post(
            f"/sessions/{session_id}/generate", json=body, headers={"traceparent": header}
        ) as reply:
            assert reply.status == 200, await reply.text()
    spans = await eventually(lambda: complete(receiver, trace_id, "POST"), "the task's trace")
    (request,) = named(spans, "POST /sessions/{id}/generate")
    # A path no route matches, or a method HTTP does not have, names no span: the client made it up.
    made_up, made_up_trace, _ = traceparent()
    async with aiohttp.ClientSession(base) as http:
        for method, path in (("GET", "/made-up-1234"), ("PROPFIND", "/made-up-5678")):
            async with http.request(method, path, headers={"traceparent": made_up}) as reply:
                assert reply.status >= 400

    def strays_in() -> list[Span] | None:
        strays = receiver.trace(made_up_trace)
        return strays if len(strays) == 2 else None

    strays = await eventually(strays_in, "the made-up requests' spans")
    assert sorted(s.name for s in strays) == ["GET", "_OTHER"]
    assert all("http.route" not in attributes(s) for s in strays)
    assert request.parent_span_id == client_span and request.kind == Span.SPAN_KIND_SERVER
    assert attributes(request)["http.response.status_code"] == 200
    check_generation(spans, request, fake, session_id)
    no_content(receiver)


async def test_a_subagents_spans_are_under_its_task_call(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served(otel_env(receiver))
    task = {"agent": "explore", "description": "look", "prompt": "read task.py"}
    fake.script(
        tool_call("task", task, id="t1"),
        tool_call("read_file", {"path": "task.py"}, id="r1"),
        "The child read it.",
        "Done.",
    )
    header, trace_id, _ = traceparent()
    session_id = await generate(server, "delegate", [("traceparent", header)])
    spans = await eventually(
        lambda: complete(receiver, trace_id, "a3s.code", agents=2, chats=4), "both generations"
    )
    (parent,) = [s for s in named(spans, "invoke_agent") if attributes(s)["gen_ai.agent.name"] == "a3s-agent"]
    (call,) = named(spans, "execute_tool task")
    assert call.parent_span_id == parent.span_id and attributes(call)["gen_ai.tool.call.id"] == "t1"
    (child,) = named(spans, "invoke_agent explore")
    assert child.parent_span_id == call.span_id
    assert attributes(child)["gen_ai.conversation.id"] != session_id
    (read,) = named(spans, "execute_tool read_file")
    assert read.parent_span_id == child.span_id
    assert len([s for s in named(spans, "chat") if s.parent_span_id == child.span_id]) == 2


_THREADS_CHILD = """
import json, os, signal, sys, threading

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc


async def main() -> None:
    serving = serve()
    async with grpc.aio.insecure_channel("127.0.0.1:{port}") as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        await until_serving(stub)
        session = await stub.CreateSession(pb.CreateSessionRequest())
        await stub.ExecuteTool(pb.ExecuteToolRequest(session_id=session.session_id, tool_name="ls",
                                                     arguments="{{}}"))
        threads = [t.name for t in threading.enumerate()]
        sdk = "opentelemetry.sdk" in sys.modules
    os.kill(os.getpid(), signal.SIGTERM)
    code = await serving
    print(json.dumps({{"threads": threads, "sdk": sdk, "code": code}}))


asyncio.run(main())
"""


@pytest.mark.parametrize("endpoint", [False, True], ids=["off", "on"])
def test_off_the_sdk_is_never_imported_and_no_exporter_thread_runs(tmp_path: Path, endpoint: bool) -> None:
    # "on" (an endpoint nobody listens on) shows what the check would see if off were not off.
    env = {"OTEL_SERVICE_NAME": "agent-under-test"}
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    report, _ = run_fresh_server(_THREADS_CHILD, tmp_path, env, 120)
    exporting = [name for name in report["threads"] if name.startswith("Otel")]
    assert report["code"] == 0
    assert (report["sdk"], bool(exporting)) == (endpoint, endpoint), report["threads"]


async def test_with_the_sdk_disabled_the_receiver_gets_nothing(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served({**otel_env(receiver), "OTEL_SDK_DISABLED": "true"})
    script_task(fake)
    header, _, _ = traceparent()
    await generate(server, "go", [("traceparent", header)])
    assert all("traceparent" not in r.headers for r in fake.requests)
    assert server.proc is not None
    assert await asyncio.to_thread(server.stop) == 0  # the exporter, were there one, flushes at the stop
    assert receiver.bodies == []


def log_lines(output: str) -> list[dict[str, Any]]:
    """Every line the server wrote, each a JSON object (json.loads fails the test on any other)."""
    return [json.loads(line) for line in output.splitlines() if line.strip()]


async def test_json_log_lines_name_their_trace_span_session_and_replica(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served({**otel_env(receiver), "A3S_LOG_FORMAT": "json", "A3S_REPLICA_ID": "replica-7"})
    script_task(fake)
    header, trace_id, _ = traceparent()
    session_id = await generate(server, SECRET_PROMPT, [("traceparent", header)])
    spans = await eventually(lambda: complete(receiver, trace_id, "a3s.code"), "the task's trace")
    (rpc,) = [s for s in spans if s.name.endswith("/StreamGenerate")]
    async with grpc.aio.insecure_channel(server.address) as channel:  # a made-up id, as long as it likes
        with pytest.raises(grpc.aio.AioRpcError):
            await pb_grpc.CodeAgentServiceStub(channel).GetSession(
                pb.GetSessionRequest(session_id="z" * 5000)
            )
    assert await asyncio.to_thread(server.stop) == 0
    lines = log_lines(await asyncio.to_thread(server.output))
    (made_up,) = [line for line in lines if line["message"].startswith("rpc GetSession ")]
    assert made_up["session_id"] == "z" * 128
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert all(line["replica_id"] == "replica-7" for line in lines)
    (call,) = [line for line in lines if line["message"].startswith("rpc StreamGenerate ")]
    assert (call["level"], call["logger"]) == ("INFO", "a3s_agent.rpc")
    assert (call["trace_id"], call["span_id"]) == (trace_id.hex(), rpc.span_id.hex())
    assert call["session_id"] == session_id
    started = [line for line in lines if "exporting traces" in line["message"]]
    assert started and "trace_id" not in started[0] and "session_id" not in started[0]


async def test_json_log_lines_keep_the_refusals_rate_limit_and_no_token(tmp_path: Path) -> None:
    server = GuardedServer(tmp_path, env={"A3S_LOG_FORMAT": "json", "A3S_AUTH_TOKEN": TOKEN})
    await asyncio.to_thread(server.start)
    try:
        begun = time.monotonic()

        def refused_calls() -> None:
            with server.channel() as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                for n in range(3 * LINES_PER_WINDOW):
                    with pytest.raises(grpc.RpcError):
                        stub.CreateSession(
                            pb.CreateSessionRequest(), metadata=[("authorization", f"Bearer wrong-{n}-5678")]
                        )

        await asyncio.to_thread(refused_calls)
        windows = int((time.monotonic() - begun) // WINDOW_S) + 2
    finally:
        await asyncio.to_thread(server.kill)
    lines = log_lines(server.log())
    refusals = [line for line in lines if line["logger"] == "a3s_agent.security"]
    assert 0 < len(refusals) <= windows * (LINES_PER_WINDOW + 1)
    assert all(
        line["message"].startswith("refused /a3s.code.agent.v1.CodeAgentService/") for line in refusals
    )
    assert "wrong-" not in server.log() and TOKEN not in server.log()


def test_an_unknown_log_format_is_refused_at_start(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "a3s_agent",
        "serve",
        "--workspace",
        str(tmp_path),
        "--log-format",
        "xml",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--log-format (A3S_LOG_FORMAT) must be text or json, not 'xml'" in done.stderr


async def test_a_run_taken_over_by_another_replica_stays_in_its_trace(
    receiver: Receiver, tmp_path: Path, fake: FakeLLM, postgres_server: Any
) -> None:
    marker = f"60.{secrets.randbelow(10**6):06d}"  # seconds of sleep, the digits this test's own
    fake.script(tool_call("bash", {"command": f"sleep {marker}"}, id="b1"))
    workspace = task_workspace(tmp_path / "workspace")
    env = {
        **otel_env(receiver),
        "A3S_LEASE_TTL_S": "1",
        "A3S_SANDBOX": "off",
        "A3S_LLM_MODEL": "fake-model",
        "A3S_LLM_BASE_URL": fake.base_url,
        "A3S_LLM_API_KEY": "sk-test",
    }
    with fresh_database(postgres_server, "telemetry_takeover") as url:
        replicas = replica_servers(workspace, tmp_path, url, ("A", "B"), env)
        try:
            for replica in replicas.values():
                await asyncio.to_thread(replica.start)
            header, trace_id, client_span = traceparent()
            async with grpc.aio.insecure_channel(replicas["A"].address) as channel:
                stub = pb_grpc.CodeAgentServiceStub(channel)
                session_id = (await stub.CreateSession(pb.CreateSessionRequest())).session_id
                go = pb.GenerateRequest(session_id=session_id, messages=[user("sleep")])
                stream = stub.StreamGenerate(go, metadata=[("traceparent", header)])
                async for chunk in stream:
                    if chunk.type == pb.GenerateChunk.CHUNK_TYPE_TOOL_CALL:
                        break
                await eventually(lambda: processes_with(marker), "the command runs on A")
                replicas["A"].kill()  # mid-run: its lease expires, and B takes the run over
                stream.cancel()

            def taken() -> list[Span]:
                return [s for s in receiver.trace(trace_id) if s.name == "take_over_run"]

            (takeover,) = await eventually(taken, "B's takeover, in the run's trace", 60)
        finally:
            for replica in replicas.values():
                replica.kill()
            kill_leftovers(marker)
    got = attributes(takeover)
    assert got["a3s.replica.id"] == "B" and got["a3s.replica.previous_owner"] == "A"
    assert got["gen_ai.conversation.id"] == session_id and got["a3s.run.id"]
    # Under the span A's run was started in (A's call, never exported: A was killed), not a new root.
    assert takeover.parent_span_id not in (b"", client_span)
    (chat,) = named(receiver.trace(trace_id), "chat")  # what A exported before it was killed
    assert fake.requests[0].headers["traceparent"] == f"00-{trace_id.hex()}-{chat.span_id.hex()}-01"
