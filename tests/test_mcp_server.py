"""The MCP server face with the `mcp` SDK's own client: over Streamable HTTP on the HTTP face (in
both protocol eras: the 2025 initialize handshake with MCP sessions, and 2026's one request per
POST) and over stdio against `a3s-agent mcp` as a subprocess; the agent behind agent_task talks to
the fake LLM over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from a3s_agent.app import Application
from a3s_agent.base.models import LLMConfig
from a3s_agent.config import ConfigError, Settings, check_serving, settings_from
from a3s_agent.faces.http import HttpListener, start_http
from a3s_agent.faces.mcp import McpHttp
from a3s_agent.runtime import Runtime
from a3s_agent.runtime.initialization import InitializeRequest
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call
from a3s_agent.tools.builtin import builtin_registry

from .conftest import ServerProcess, alive, eventually, host_pid, wait_serving

TOKEN = "mcp-test-token"
MODES = ["legacy", "2026-07-28"]
"""The 2025 handshake era (MCP sessions, notifications/cancelled) and the 2026 one (a request per POST)."""
PROSE = "alpha\nneedle in a haystack\nomega\n"
INITIALIZE = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "test", "version": "1"},
}


@dataclass
class McpServer:
    app: Application
    url: str
    port: int
    workspace: Path


@asynccontextmanager
async def mcp_server(
    workspace: Path, data: Path, fake: FakeLLM, allowed: list[str] | None = None
) -> AsyncIterator[McpServer]:
    """The HTTP face with /mcp, behind a token, over a runtime whose model is the fake LLM."""
    runtime = Runtime(
        Settings(workspace=workspace, data_dir=data, auth_token=TOKEN, llm_timeout_s=2.0, llm_retries=0),
        registry=builtin_registry(),
    )
    await runtime.start()
    app = Application(runtime)
    await app.lifecycle.initialize(
        InitializeRequest(llm=LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url))
    )
    mcp = McpHttp(app, allowed or [])
    listener: HttpListener = await start_http(app, "127.0.0.1:0", extra_routes=mcp.routes())
    try:
        yield McpServer(app, f"http://127.0.0.1:{listener.port}/mcp", listener.port, workspace)
    finally:
        await listener.stop()
        await mcp.stop()
        await runtime.close()


@pytest.fixture
async def served(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[McpServer]:
    (workspace / "prose.txt").write_text(PROSE)
    async with mcp_server(workspace, tmp_path / "data", fake) as server:
        yield server


@asynccontextmanager
async def client_of(url: str, mode: str, token: str = TOKEN, **options: Any) -> AsyncIterator[Client]:
    """The SDK's client at `mode`; `options`: more of its settings (an elicitation_callback...)."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, **options) as client,
    ):
        yield client


def texts(result: types.CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, types.TextContent)]


# --- tools ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_lists_the_tools_with_their_schemas_and_runs_them_in_the_workspace(
    served: McpServer, mode: str
) -> None:
    async with client_of(served.url, mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert {"read_file", "grep", "bash", "agent_task"} <= set(tools)
        assert "todo" not in tools  # a session's list: these calls run in none
        assert "ask_user" not in tools  # a question for the host of a run: these calls have none
        assert "task" not in tools  # a subagent of a run: agent_task runs the agent itself
        assert tools["read_file"].input_schema["properties"]["path"]
        assert tools["read_file"].annotations and tools["read_file"].annotations.read_only_hint
        assert tools["agent_task"].input_schema["required"] == ["task"]

        read = await client.call_tool("read_file", {"path": "prose.txt"})
        assert not read.is_error and "needle in a haystack" in texts(read)[0]
        found = await client.call_tool("grep", {"pattern": "needle"})
        assert not found.is_error and "prose.txt" in texts(found)[0]

        missing = await client.call_tool("read_file", {"path": "absent.txt"})
        assert missing.is_error and "absent.txt" in texts(missing)[0]
        wrong = await client.call_tool("read_file", {"nonsense": 1})
        assert wrong.is_error and texts(wrong)[0].startswith("INVALID_ARGUMENT")


# --- agent_task -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_agent_task_runs_a_generation_with_tools_and_reports_progress(
    served: McpServer, fake: FakeLLM, mode: str
) -> None:
    fake.script(tool_call("read_file", {"path": "prose.txt"}), text("The needle is on line 2."))
    reported: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append((progress, message))

    async with client_of(served.url, mode) as client:
        result = await client.call_tool(
            "agent_task", {"task": "where is the needle?"}, progress_callback=on_progress
        )
    assert not result.is_error, texts(result)
    assert texts(result)[0] == "The needle is on line 2."
    done = result.structured_content
    assert (
        done["answer"] == "The needle is on line 2."
        and done["finish_reason"] == "stop"
        and done["turns"] == 2
    )
    # the model read the tool's result, and the session keeps the whole exchange
    assert "needle in a haystack" in fake.requests[1].messages[-1]["content"]
    history = await served.app.sessions.history(done["session_id"])
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert [message for _, message in reported] == [
        "calling read_file",
        "model turn 1 finished (tool_calls)",
        "read_file done",
        "model turn 2 finished (stop)",
    ]
    assert [step for step, _ in reported] == [1, 2, 3, 4]


@pytest.mark.parametrize("mode", MODES)
async def test_agent_task_names_the_checkpoint_that_undoes_it(
    served: McpServer, fake: FakeLLM, mode: str
) -> None:
    """Rewinding the session to the checkpoint the result names, as soon as it is answered, takes
    back the files the task changed and its turn."""
    fake.script(text("first"), tool_call("bash", {"command": "echo new > made.txt"}), text("made"))
    async with client_of(served.url, mode) as client:
        first = await client.call_tool("agent_task", {"task": "one"})
        session_id = first.structured_content["session_id"]
        made = await client.call_tool("agent_task", {"task": "make it", "session_id": session_id})
    checkpoint = made.structured_content["checkpoint"]
    assert checkpoint > first.structured_content["checkpoint"] > 0
    assert (served.workspace / "made.txt").exists()
    rewound = await served.app.checkpoints.rewind(session_id, checkpoint)
    assert not (served.workspace / "made.txt").exists()
    assert rewound.messages == 2  # the first task's question and answer


async def test_agent_task_goes_on_in_the_session_it_is_given(served: McpServer, fake: FakeLLM) -> None:
    fake.script(text("first"), text("second"))
    async with client_of(served.url, "legacy") as client:
        first = await client.call_tool("agent_task", {"task": "one"})
        session_id = first.structured_content["session_id"]
        second = await client.call_tool("agent_task", {"task": "two", "session_id": session_id})
        assert second.structured_content["session_id"] == session_id
        unknown = await client.call_tool("agent_task", {"task": "three", "session_id": "no-such-session"})
        malformed = await client.call_tool("agent_task", {"tsk": "four"})
    assert texts(second)[0] == "second"
    assert [m["content"] for m in fake.requests[1].messages if m["role"] == "user"] == ["one", "two"]
    assert unknown.is_error and texts(unknown)[0].startswith("NOT_FOUND")
    assert malformed.is_error and "task: Field required" in texts(malformed)[0]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("mode", MODES)
async def test_cancelling_agent_task_stops_the_run_and_its_tool(
    served: McpServer, fake: FakeLLM, mode: str
) -> None:
    """2025: the client's notifications/cancelled; 2026: the client ends the request."""
    marker = served.workspace / "pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    running = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message == "calling bash":
            running.set()

    async with client_of(served.url, mode) as client:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(
                    lambda: client.call_tool("agent_task", {"task": "x"}, progress_callback=on_progress)
                )
                await running.wait()
                pid = host_pid(
                    int(
                        await eventually(
                            lambda: marker.exists() and marker.read_text().strip(), "the tool runs"
                        )
                    )
                )
                scope.cancel()
        await eventually(lambda: not alive(pid), "the tool's process is gone")
        listed = await client.list_tools()  # the connection goes on
    assert listed.tools
    assert len(fake.requests) == 1  # the model was not called again
    [session] = (await served.app.sessions.page(None, 10)).sessions

    async def cancellation_written() -> bool:  # the run writes it once its tool has stopped
        history = await served.app.sessions.history(session.id)
        return history[-1].content == "[the run was cancelled by the client]"

    await eventually(cancellation_written, "the cancellation in the history")
    history = await served.app.sessions.history(session.id)
    assert "cancelled" in history[-2].content  # the open call answered


# --- what an outsider tries -----------------------------------------------------------------


async def test_without_the_token_or_from_a_foreign_page_mcp_is_refused(served: McpServer) -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}
    accept = {"Accept": "application/json, text/event-stream"}
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with http.post(served.url, json=initialize, headers={**accept, **headers}) as response:
                assert response.status == 401
        token = {"Authorization": f"Bearer {TOKEN}"}
        foreign = {**accept, **token, "Origin": "https://evil.example"}
        async with http.post(served.url, json=initialize, headers=foreign) as response:
            assert response.status == 403
        rebound = {**accept, **token, "Host": f"evil.example:{served.port}"}
        async with http.post(served.url, json=initialize, headers=rebound) as response:
            assert response.status == 421
        async with http.post(
            served.url, data="{}", headers={**accept, **token, "Content-Type": "text/plain"}
        ) as response:
            assert response.status == 415
        async with http.get(served.url, headers={**accept, **token}) as response:
            assert response.status == 405  # no standalone stream: everything comes on the POST's
        async with http.post(served.url, json=initialize, headers={**accept, **token}) as response:
            assert response.status == 200 and response.headers["Mcp-Session-Id"]


async def test_only_the_allowed_tools_are_offered_and_callable(
    workspace: Path, tmp_path: Path, fake: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    (workspace / "prose.txt").write_text(PROSE)
    async with (
        mcp_server(workspace, tmp_path / "data", fake, allowed=["read_file", "grep", "raed_file"]) as server,
        client_of(server.url, "legacy") as client,
    ):
        assert "does not offer (now): raed_file" in caplog.text
        assert sorted(tool.name for tool in (await client.list_tools()).tools) == ["grep", "read_file"]
        for name, arguments in (("bash", {"command": "touch pwned"}), ("agent_task", {"task": "x"})):
            with pytest.raises(MCPError, match="unknown tool") as refused:
                await client.call_tool(name, arguments)
            assert refused.value.code == types.INVALID_PARAMS
        # a tool the server's Initialize disables is neither offered nor run, even when allowed
        await server.app.lifecycle.initialize(InitializeRequest(disabled_tools=["grep"]))
        assert [tool.name for tool in (await client.list_tools(cache_mode="refresh")).tools] == ["read_file"]
        with pytest.raises(MCPError, match="unknown tool"):
            await client.call_tool("grep", {"pattern": "needle"})
    assert not (workspace / "pwned").exists()
    assert fake.requests == []


# --- stdio: `a3s-agent mcp` -----------------------------------------------------------------


def stdio_command(workspace: Path, data: Path, fake: FakeLLM, *flags: str) -> StdioServerParameters:
    env = {
        **os.environ,
        "A3S_LLM_BASE_URL": fake.base_url,
        "A3S_LLM_MODEL": "fake-model",
        "A3S_LLM_API_KEY": "sk-test",
        "A3S_LLM_RETRIES": "0",
    }
    argv = ["-m", "a3s_agent", "mcp", "--workspace", str(workspace), "--data-dir", str(data), *flags]
    return StdioServerParameters(command=sys.executable, args=argv, env=env)


async def test_stdio_serves_the_allowed_tools_and_agent_task_with_progress(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    (workspace / "prose.txt").write_text(PROSE)
    fake.script(tool_call("grep", {"pattern": "needle"}), text("prose.txt has it."))
    command = stdio_command(workspace, tmp_path / "data", fake, "--mcp-tools", "read_file,agent_task")
    reported: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append(message)

    async with Client(command) as client:
        assert sorted(tool.name for tool in (await client.list_tools()).tools) == ["agent_task", "read_file"]
        read = await client.call_tool("read_file", {"path": "prose.txt"})
        assert "needle in a haystack" in texts(read)[0]
        with pytest.raises(MCPError, match="unknown tool"):
            await client.call_tool("grep", {"pattern": "needle"})
        # the agent itself has the server's tools: --mcp-tools narrows what the caller runs directly
        done = await client.call_tool("agent_task", {"task": "which file?"}, progress_callback=on_progress)
    assert texts(done)[0] == "prose.txt has it."
    assert reported == [
        "calling grep",
        "model turn 1 finished (tool_calls)",
        "grep done",
        "model turn 2 finished (stop)",
    ]


async def test_stdio_cancellation_stops_the_run(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    marker = workspace / "pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    running = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message == "calling bash":
            running.set()

    async with Client(stdio_command(workspace, tmp_path / "data", fake)) as client:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(
                    lambda: client.call_tool("agent_task", {"task": "x"}, progress_callback=on_progress)
                )
                await running.wait()
                pid = host_pid(
                    int(
                        await eventually(
                            lambda: marker.exists() and marker.read_text().strip(), "the tool runs"
                        )
                    )
                )
                scope.cancel()
        await eventually(lambda: not alive(pid), "the tool's process is gone")
        assert (await client.call_tool("read_file", {"path": "pid"})).content  # the server goes on
    assert len(fake.requests) == 1


async def test_sigterm_stops_the_stdio_server_and_its_runs_and_stdout_is_only_protocol(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    marker = workspace / "pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    command = stdio_command(workspace, tmp_path / "data", fake)
    proc = await asyncio.create_subprocess_exec(
        command.command, *command.args, env=command.env, stdin=PIPE, stdout=PIPE, stderr=PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        for message in (
            {"id": 1, "method": "initialize", "params": INITIALIZE},
            {"method": "notifications/initialized"},
            {"id": 2, "method": "tools/call", "params": {"name": "agent_task", "arguments": {"task": "x"}}},
        ):
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        await proc.stdin.drain()
        pid = host_pid(
            int(await eventually(lambda: marker.exists() and marker.read_text().strip(), "the tool runs"))
        )
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert not alive(pid)
        lines = (await proc.stdout.read()).splitlines()
        assert [json.loads(line)["jsonrpc"] for line in lines] == ["2.0"]  # the initialize result, no more
        assert b"runtime ready" in await proc.stderr.read()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# --- `a3s-agent serve --mcp-http` -----------------------------------------------------------


async def test_serve_offers_mcp_behind_its_token_and_a_stop_ends_a_running_task(
    tmp_path: Path, fake: FakeLLM
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    marker = workspace / "pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    env = {
        **(stdio_command(workspace, tmp_path, fake).env or {}),
        "A3S_AUTH_TOKEN": TOKEN,
        "A3S_MCP_HTTP": "1",
    }
    server = ServerProcess(workspace, tmp_path / "data", env={**env, "A3S_GRACE_SECONDS": "0.5"})
    proc = server.proc = subprocess.Popen(  # noqa: ASYNC220 (a ServerProcess holds a Popen)
        server.command(), env=server.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{server.http_port}"
    try:
        async with aiohttp.ClientSession(base_url=base) as http:

            async def ready() -> bool:
                assert proc.poll() is None, "the server exited"
                try:
                    async with http.get("/health/ready") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await eventually(ready, "the server is ready", within_s=20)
            async with http.post("/mcp", json={}) as response:
                assert response.status == 401
        async with client_of(f"{base}/mcp", "legacy") as client, anyio.create_task_group() as group:
            assert (await client.call_tool("list_files", {"path": "."})).content

            async def task() -> None:
                with pytest.raises(MCPError):
                    await client.call_tool("agent_task", {"task": "x"})

            group.start_soon(task)
            pid = host_pid(
                int(await eventually(lambda: marker.exists() and marker.read_text().strip(), "the tool runs"))
            )
            assert await anyio.to_thread.run_sync(server.stop) == 0
        assert not alive(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_serve_warns_once_of_every_name_it_will_not_offer(tmp_path: Path, fake: FakeLLM) -> None:
    """A typo and the tools the MCP server never offers (todo, ask_user) are named in one warning."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = ServerProcess(workspace, tmp_path / "data", env=stdio_command(workspace, tmp_path, fake).env)
    flags = ["--mcp-http", "--mcp-tools", "read_file,grpe", "--mcp-tools", "todo,ask_user"]
    proc = server.proc = subprocess.Popen(  # noqa: ASYNC220 (a ServerProcess holds a Popen)
        [*server.command(), *flags],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        await anyio.to_thread.run_sync(wait_serving, server.address, 20.0, proc)
        async with client_of(f"http://127.0.0.1:{server.http_port}/mcp", "legacy") as client:
            assert [tool.name for tool in (await client.list_tools()).tools] == ["read_file"]
        assert await anyio.to_thread.run_sync(server.stop) == 0
        warnings = [line for line in server.output().splitlines() if "--mcp-tools" in line]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(warnings) == 1, warnings
    assert warnings[0].endswith("does not offer (now): ask_user, grpe, todo"), warnings


def test_serve_says_that_mcp_tools_does_nothing_without_mcp_http(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = ServerProcess(workspace, tmp_path / "data")
    proc = server.proc = subprocess.Popen(
        [*server.command(), "--mcp-tools", "read_file"],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_serving(server.address, 20.0, proc)
        assert server.stop() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    warnings = [line for line in server.output().splitlines() if "--mcp-tools" in line]
    assert len(warnings) == 1 and "does nothing without --mcp-http" in warnings[0], warnings


def test_the_flags_and_their_environment() -> None:
    settings = settings_from(
        mcp_tools=["read_file"], env={"A3S_MCP_HTTP": "1", "A3S_MCP_TOOLS": "grep, bash"}
    )
    assert settings.mcp_http and settings.mcp_tools == ["read_file", "grep", "bash"]
    with pytest.raises(ConfigError, match="--mcp-http"):
        check_serving(settings_from(http_listen="off", mcp_http=True, env={}))
