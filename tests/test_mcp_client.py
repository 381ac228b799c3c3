"""The MCP client against real MCP servers: a stdio server written with the `mcp` SDK
(tests/mcp_fixture.py), the published `mcp-server-git` from PyPI (the test extra installs it), and
the fixture over Streamable HTTP in a subprocess; the model is the fake LLM, over the real gRPC
server."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.base.errors import FailedPrecondition, InvalidArgument
from a3s_agent.core.skills.skill import parse_skill
from a3s_agent.core.store.session import SessionSettings
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.runtime.initialization import Initialization
from a3s_agent.testing.fake_llm import FakeLLM, call, text, tool_call, tool_calls
from a3s_agent.tools.mcp.config import StdioServer, parse_servers, refuse_commands
from a3s_agent.tools.mcp.tools import tool_name

from .conftest import (
    LiveServer,
    agent_settings,
    alive,
    eventually,
    fixture_readable,
    free_port,
    host_pid,
    initialize,
    new_session,
    running,
    user,
)
from .test_http import serving

FIXTURE = str(Path(__file__).with_name("mcp_fixture.py"))


def stdio_server(log: Path, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [FIXTURE, "stdio"],
        "env": {"MCP_FIXTURE_LOG": str(log)},
        **extra,
    }


def config_file(tmp_path: Path, servers: dict[str, Any]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@asynccontextmanager
async def mcp_agent(
    workspace: Path, tmp_path: Path, fake: FakeLLM, servers: dict[str, Any] | None = None, **settings: Any
) -> AsyncIterator[LiveServer]:
    base = fixture_readable(agent_settings(workspace, tmp_path / "data"), tmp_path)
    mcp_config = config_file(tmp_path, servers) if servers else None
    async with running(replace(base, mcp_config=mcp_config, **settings)) as server:
        await initialize(server, fake)
        yield server


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def session_metadata(servers: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return (("a3s-mcp-servers", json.dumps({"mcpServers": servers})),)


async def generate(server: LiveServer, session_id: str, prompt: str = "go") -> pb.GenerateResponse:
    return await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user(prompt)]))


# --- the model calls an MCP server's tools ----------------------------------------------------


async def test_the_model_calls_a_stdio_servers_tools_in_a_generation(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    async with mcp_agent(workspace, tmp_path, fake, {"fx": stdio_server(log)}) as server:
        assert lines(log) == []  # lazily: nothing runs before something needs the tools
        fake.script(
            tool_calls([call("mcp__fx__echo", {"text": "hi"}), call("mcp__fx__picture", {})]),
            tool_call("read_mcp_resource", {"server": "fx", "uri": "note://hello"}),
            text("done"),
        )
        session_id = await new_session(server)
        reply = await generate(server, session_id)

        assert reply.message.content == "done"
        echo, picture, resource = reply.tool_calls
        assert echo.result.success and echo.result.output == "echo: hi"
        assert picture.result.success and "image/png" in picture.result.output
        assert resource.result.output == "[resource note://hello]\nhello from a resource"
        offered = {t["function"]["name"]: t["function"] for t in fake.requests[0].tools or []}
        assert offered["mcp__fx__add"]["parameters"]["required"] == ["a", "b"]
        assert {"read_file", "list_mcp_resources", "read_mcp_resource", "list_mcp_prompts"} <= set(offered)
        assert "echo: hi" in [m["content"] for m in fake.requests[1].messages if m["role"] == "tool"]
        history = await server.runtime.sessions.history(session_id)
        [image] = [a for m in history if m.role == "tool" for a in m.attachments]
        assert (
            image.kind == "image" and image.mime_type == "image/png" and image.content.startswith(b"\x89PNG")
        )

        listed = (await server.stub.ListTools(pb.ListToolsRequest())).tools
        add = next(t for t in listed if t.name == "mcp__fx__add")
        assert json.loads(add.parameters_schema)["properties"]["a"]["type"] == "integer"
        assert list(add.tags) == ["mcp", "execute"]
        capabilities = await server.stub.GetCapabilities(pb.GetCapabilitiesRequest())
        assert "mcp__fx__echo" in {t.name for t in capabilities.tools}
        prompts = await server.stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name="list_mcp_prompts", arguments="{}")
        )
        assert prompts.result.output == "fx: review(path): Ask for a review of a file."
        assert len([line for line in lines(log) if line.startswith("started")]) == 1  # one process, shared


async def test_the_published_git_server_from_pypi(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    subprocess.run(["git", "init", "-q", "-b", "main", str(workspace)], check=True)
    (workspace / "new.txt").write_text("x\n")
    git = {"command": "mcp-server-git", "args": ["--repository", "."]}
    async with mcp_agent(workspace, tmp_path, fake, {"git": git}) as server:
        fake.script(tool_call("mcp__git__git_status", {"repo_path": str(workspace)}), text("clean enough"))
        reply = await generate(server, await new_session(server))
        result = reply.tool_calls[0].result
        assert result.success, result.error
        assert "On branch main" in result.output and "new.txt" in result.output
        # Its confinement holds: a path outside --repository is the server's error, as a failed call.
        fake.script(tool_call("mcp__git__git_status", {"repo_path": str(tmp_path)}), text("ok"))
        reply = await generate(server, await new_session(server))
        assert not reply.tool_calls[0].result.success
        assert "outside the allowed repository" in reply.tool_calls[0].result.error


async def test_a_streamable_http_server_given_for_one_session(
    workspace: Path, tmp_path: Path, fake: FakeLLM, http_fixture: str
) -> None:
    async with mcp_agent(workspace, tmp_path, fake) as server:
        servers = {"web": {"url": http_fixture, "headers": {"X-Trace": "1"}}}
        reply = await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=session_metadata(servers))
        guarded = reply.session_id
        # The session's URL is the API caller's: the request guard refuses a loopback address...
        refused = await server.stub.ExecuteTool(
            pb.ExecuteToolRequest(session_id=guarded, tool_name="list_mcp_resources", arguments="{}")
        )
        assert not refused.result.success
        assert "127.0.0.1 is a loopback address" in refused.result.error
        # ... unless the host allows private addresses, as for web_fetch.
        await server.stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(
                    llm=pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url)
                ),
                env={"A3S_FETCH_ALLOW_PRIVATE": "1"},
            )
        )
        session_id = (
            await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=session_metadata(servers))
        ).session_id
        fake.script(tool_call("mcp__web__add", {"a": 2, "b": 40}), text("42"))
        reply = await generate(server, session_id)
        assert reply.tool_calls[0].result.output == "42"
        other = await new_session(server)  # the servers are that session's only
        assert not [
            t
            for t in (await server.stub.ListTools(pb.ListToolsRequest(session_id=other))).tools
            if t.name.startswith("mcp__")
        ]
    # After a restart (Initialize's env restored): the servers are stored with the session.
    async with running(fixture_readable(agent_settings(workspace, tmp_path / "data"), tmp_path)) as server:
        tools = (await server.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools
        assert "mcp__web__add" in {t.name for t in tools}


async def test_the_http_face_takes_a_sessions_servers_from_the_same_header(
    workspace: Path, tmp_path: Path, fake: FakeLLM, http_fixture: str
) -> None:
    async with mcp_agent(workspace, tmp_path, fake) as server, serving(server) as http:
        await server.stub.Initialize(pb.InitializeRequest(env={"A3S_FETCH_ALLOW_PRIVATE": "1"}))
        header = {"a3s-mcp-servers": json.dumps({"web": {"url": http_fixture}})}
        created = await http.client.post("/sessions", json={}, headers=header)
        assert created.status == 201, await created.text()
        session_id = (await created.json())["session_id"]
        listed = await http.client.post("/rpc/ListTools", json={"session_id": session_id})
        assert "mcp__web__echo" in {tool["name"] for tool in (await listed.json())["tools"]}
        cleared = await http.client.post(
            "/rpc/ConfigureSession", json={"session_id": session_id}, headers={"a3s-mcp-servers": "{}"}
        )
        assert cleared.status == 200
        listed = await http.client.post("/rpc/ListTools", json={"session_id": session_id})
        assert not [t for t in (await listed.json())["tools"] if t["name"].startswith("mcp__")]


# --- failures ---------------------------------------------------------------------------------


async def test_a_server_that_crashes_mid_call_fails_the_call_and_the_session_goes_on(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    async with mcp_agent(workspace, tmp_path, fake, {"fx": stdio_server(log)}) as server:
        session_id = await new_session(server)
        fake.script(tool_call("mcp__fx__crash"), text("it broke"))
        reply = await generate(server, session_id)
        crashed = reply.tool_calls[0].result
        assert not crashed.success
        assert "closed the connection during the call of 'crash'" in crashed.error
        assert "exited with code 3" in crashed.error
        assert reply.message.content == "it broke"
        # The next call starts the server again.
        fake.script(tool_call("mcp__fx__echo", {"text": "again"}), text("fine"))
        reply = await generate(server, session_id)
        assert reply.tool_calls[0].result.output == "echo: again"
        assert len([line for line in lines(log) if line.startswith("started")]) == 2


async def test_a_server_that_is_down_is_a_quick_tool_error_never_a_hang(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    port = free_port()  # nothing listens there
    exits = {
        "command": sys.executable,
        "args": ["-c", "import sys; sys.stderr.write('no config'); sys.exit(2)"],
    }
    missing = {"command": "no-such-mcp-server"}
    servers = {"gone": {"url": f"http://127.0.0.1:{port}/mcp"}, "broken": exits, "missing": missing}
    async with mcp_agent(workspace, tmp_path, fake, servers) as server:
        started = asyncio.get_running_loop().time()
        tools = (await server.stub.ListTools(pb.ListToolsRequest())).tools
        assert not [t for t in tools if t.name.startswith("mcp__")]
        for name in ("gone", "broken"):
            reply = await server.stub.ExecuteTool(
                pb.ExecuteToolRequest(tool_name="list_mcp_resources", arguments=json.dumps({"server": name}))
            )
            assert not reply.result.success
            assert f"MCP server {name!r} is unavailable" in reply.result.error
        errors = {}
        for name in ("gone", "broken"):
            reply = await server.stub.ExecuteTool(
                pb.ExecuteToolRequest(tool_name="list_mcp_prompts", arguments=json.dumps({"server": name}))
            )
            errors[name] = reply.result.error
        assert "the connection was refused" in errors["gone"]
        assert "next attempt in" in errors["gone"]  # waited out, not tried again at once
        assert "exited with code 2; it last wrote: no config" in errors["broken"]
        reply = await server.stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name="list_mcp_prompts", arguments='{"server": "missing"}')
        )
        assert "cannot run no-such-mcp-server: no such program beside" in reply.result.error
        fake.script(text("no tools, fine"))
        reply = await generate(server, await new_session(server))
        assert reply.message.content == "no tools, fine"
        assert asyncio.get_running_loop().time() - started < 10


async def test_a_server_that_hangs_at_start_is_given_up_after_its_startup_timeout(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    hangs = {
        "command": sys.executable,
        "args": ["-c", "import time; time.sleep(60)"],
        "startup_timeout_ms": 500,
    }
    async with mcp_agent(workspace, tmp_path, fake, {"hangs": hangs}) as server:
        started = asyncio.get_running_loop().time()
        reply = await server.stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name="list_mcp_resources", arguments='{"server": "hangs"}')
        )
        assert "it did not start within 0.5 s" in reply.result.error
        assert asyncio.get_running_loop().time() - started < 5


async def test_a_hostile_server_cannot_make_the_agent_buffer_without_end(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    endless = "import sys, time; sys.stdout.write('x' * (40 << 20)); sys.stdout.flush(); time.sleep(60)"
    servers = {
        "endless": {"command": sys.executable, "args": ["-c", endless]},
        "fx": stdio_server(tmp_path / "fixture.log"),
    }
    async with mcp_agent(workspace, tmp_path, fake, servers) as server:
        reply = await server.stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name="list_mcp_prompts", arguments='{"server": "endless"}')
        )
        assert "sent a message over 33554432 bytes; the connection was closed" in reply.result.error
        # An image is shown only when its bytes are one: a server's word for it is not enough.
        fake.script(tool_call("mcp__fx__not_a_picture"), text("ok"))
        session_id = await new_session(server)
        reply = await generate(server, session_id)
        assert "not an image this agent can show" in reply.tool_calls[0].result.output
        history = await server.runtime.sessions.history(session_id)
        assert not [a for m in history for a in m.attachments]


async def test_permission_rules_cover_a_servers_tools_by_prefix(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    async with mcp_agent(workspace, tmp_path, fake, {"fx": stdio_server(log)}) as server:
        session_id = await new_session(server)
        await server.stub.AddPermissionRule(
            pb.AddPermissionRuleRequest(session_id=session_id, rule_type="deny", rule="mcp__fx__*")
        )
        fake.script(
            tool_calls(
                [
                    call("mcp__fx__echo", {"text": "no"}),
                    call("read_mcp_resource", {"server": "fx", "uri": "note://hello"}),
                ]
            ),
            text("denied"),
        )
        reply = await generate(server, session_id)
        denied, allowed = reply.tool_calls
        assert denied.result.error == "denied by policy: mcp__fx__*"
        assert allowed.result.success  # the rule is about the server's tools only
        check = await server.stub.CheckPermission(
            pb.CheckPermissionRequest(session_id=session_id, tool_name="mcp__fx_other__echo", arguments="{}")
        )
        assert check.decision == pb.PERMISSION_DECISION_ALLOW  # `mcp__fx__` is not a prefix of it


async def test_cancelling_a_call_sends_the_mcp_cancellation(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    async with mcp_agent(workspace, tmp_path, fake, {"fx": stdio_server(log)}) as server:
        session_id = await new_session(server)
        fake.script(tool_call("mcp__fx__slow", {"seconds": 60}, id="call_slow"), text("carried on"))
        running_generation = asyncio.ensure_future(generate(server, session_id))
        await eventually(lambda: "slow started" in lines(log), "the slow call reached the server")
        reply = await server.stub.Cancel(pb.CancelRequest(session_id=session_id, operation_id="call_slow"))
        assert reply.success
        result = await running_generation
        assert result.tool_calls[0].result.error == "cancelled by the client"
        assert result.message.content == "carried on"
        await eventually(lambda: "slow cancelled" in lines(log), "the server saw notifications/cancelled")


# --- security ---------------------------------------------------------------------------------


async def test_a_session_cannot_run_a_command_unless_the_operator_allows_it(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    metadata = session_metadata({"fx": stdio_server(log)})
    async with mcp_agent(workspace, tmp_path, fake) as server:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--allow-api-mcp-commands" in (err.value.details() or "")
        session_id = await new_session(server)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.ConfigureSession(
                pb.ConfigureSessionRequest(session_id=session_id), metadata=metadata
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.Initialize(
                pb.InitializeRequest(config=pb.AgentConfig(custom={"mcp_servers": metadata[0][1]}))
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        bad = (("a3s-mcp-servers", '{"x": {"command": "a", "args": "not a list"}}'),)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "a3s-mcp-servers: mcpServers.x.args: must be a list" in (err.value.details() or "")
    assert lines(log) == []  # nothing ever ran
    async with mcp_agent(workspace, tmp_path, fake, allow_api_mcp_commands=True) as server:
        session_id = (
            await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata)
        ).session_id
        fake.script(tool_call("mcp__fx__where"), text("ok"))
        reply = await generate(server, session_id)
        shown_pid, cwd = reply.tool_calls[0].result.output.split()
        pid = host_pid(int(shown_pid))  # what the sandbox's PID namespace calls it, on this machine
        assert cwd == str(workspace)  # a session's stdio server runs in its workspace
        # It stops with the session: DestroySession ends its process.
        await server.stub.DestroySession(pb.DestroySessionRequest(session_id=session_id))
        await eventually(lambda: not alive(pid), "the session's MCP server stopped")


async def test_secrets_reach_a_server_only_when_its_config_names_them(
    workspace: Path, tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", "s3cret")
    log = tmp_path / "fixture.log"
    plain = stdio_server(log)
    declared = stdio_server(log, env={"MCP_FIXTURE_LOG": str(log), "SERVICE_API_KEY": "${SERVICE_API_KEY}"})
    async with mcp_agent(workspace, tmp_path, fake, {"plain": plain, "declared": declared}) as server:

        async def seen(server_name: str) -> str:
            reply = await server.stub.ExecuteTool(
                pb.ExecuteToolRequest(
                    tool_name=f"mcp__{server_name}__environment", arguments='{"name": "SERVICE_API_KEY"}'
                )
            )
            assert reply.result.success, reply.result.error
            return reply.result.output

        assert await seen("plain") == "(unset)"
        assert await seen("declared") == "s3cret"  # the operator's file may name it: ${VAR}


async def test_a_repositorys_skill_brings_no_servers_unless_trusted(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    skill = workspace / ".a3s" / "skills" / "fixture"
    skill.mkdir(parents=True)
    frontmatter = json.dumps({"name": "fixture", "mcp-servers": {"fx": stdio_server(log)}})
    (skill / "SKILL.md").write_text(f"---\n{frontmatter}\n---\nUse the fixture.\n")
    for trusted in (False, True):
        async with mcp_agent(workspace, tmp_path, fake, trust_workspace_skills=trusted) as server:
            session_id = await new_session(server)
            await server.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="fixture"))
            names = {
                t.name
                for t in (await server.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools
            }
            assert ("mcp__fx__echo" in names) is trusted
            await server.stub.UnloadSkill(pb.UnloadSkillRequest(session_id=session_id, skill_name="fixture"))
            names = {
                t.name
                for t in (await server.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools
            }
            assert "mcp__fx__echo" not in names
    assert len([line for line in lines(log) if line.startswith("started")]) == 1


async def test_a_skill_sent_over_the_api_may_bring_only_urls(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    frontmatter = json.dumps({"name": "fixture", "mcp-servers": {"fx": stdio_server(log)}})
    async with mcp_agent(workspace, tmp_path, fake) as server:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.LoadSkill(pb.LoadSkillRequest(skill_content=f"---\n{frontmatter}\n---\nx\n"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_server_wide_servers_from_initialize_replace_and_stop(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    servers = json.dumps({"mcpServers": {"fx": stdio_server(log)}})
    async with mcp_agent(workspace, tmp_path, fake, allow_api_mcp_commands=True) as server:

        async def initialize_with(custom: dict[str, str]) -> None:
            llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=fake.base_url)
            await server.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm, custom=custom)))

        await initialize_with({"mcp_servers": servers})
        where = await server.stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name="mcp__fx__where", arguments="{}")
        )
        pid = host_pid(int(where.result.output.split()[0]))
        stored = await server.runtime.store.load_initialization()
        assert stored is not None and "fx" in stored["mcp_servers"]
        await initialize_with({})  # a new Initialize without them: the server stops
        await eventually(lambda: not alive(pid), "the server-wide MCP server stopped")
        names = {t.name for t in (await server.stub.ListTools(pb.ListToolsRequest())).tools}
        assert not [name for name in names if name.startswith("mcp__")]


async def test_the_server_stops_its_mcp_servers_when_it_stops(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    log = tmp_path / "fixture.log"
    async with mcp_agent(workspace, tmp_path, fake, {"fx": stdio_server(log)}) as server:
        where = await server.stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name="mcp__fx__where", arguments="{}")
        )
        pid = host_pid(int(where.result.output.split()[0]))
    assert not alive(pid)


# --- configuration --------------------------------------------------------------------------


def test_config_errors_name_the_source_server_and_field() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_servers(
            {"mcpServers": {"a": {"command": "x", "env": {"OK": 1}}, "b": {"url": "ftp://x"}, "c": {}}},
            "f.json",
        )
    assert str(err.value).splitlines() == [
        "f.json: mcpServers.a.env.OK: must be a string, not int",
        "f.json: mcpServers.b.url: 'ftp://x' is not an http:// or https:// URL",
        "f.json: mcpServers.c: give command (a server run over stdio) or url (Streamable HTTP)",
    ]
    with pytest.raises(InvalidArgument, match="SSE transport"):
        parse_servers({"s": {"type": "sse", "url": "http://x/sse"}}, "f")
    with pytest.raises(InvalidArgument, match="must be 1-40 letters"):
        parse_servers({"no spaces": {"url": "http://x"}}, "f")
    servers = parse_servers(
        {"off": {"command": "x", "disabled": True}, "on": {"url": "http://x", "timeout": 5}}, "f"
    )
    assert list(servers) == ["on"] and servers["on"].timeout_ms == 5  # Gemini CLI's `timeout`, in ms
    # ${VAR} is filled only where an environment is given: the operator's file.
    kept = parse_servers({"a": {"command": "${HOME}"}}, "api")["a"]
    assert isinstance(kept, StdioServer) and kept.command == "${HOME}"
    filled = parse_servers(
        {"a": {"command": "${NOPE:-x}", "args": ["${V}"]}}, "file", environ={"V": "v"}.get
    )["a"]
    assert isinstance(filled, StdioServer) and (filled.command, filled.args) == ("x", ["v"])
    with pytest.raises(InvalidArgument, match=r"\$\{NOPE\} is not set"):
        parse_servers({"a": {"command": "${NOPE}"}}, "file", environ=lambda name: None)
    with pytest.raises(FailedPrecondition):
        refuse_commands(servers | parse_servers({"c": {"command": "x"}}, "f"), "api", allowed=False)


def test_credentials_never_reach_the_store() -> None:
    servers: dict[str, dict[str, Any]] = {
        "open": {"url": "https://a.example/mcp"},
        "token": {"url": "https://b.example/mcp", "headers": {"Authorization": "Bearer x"}},
        "key": {"command": "x", "env": {"GITHUB_TOKEN": "y"}},
        "apikey": {"url": "https://c.example/mcp", "headers": {"X-Api-Key": "z"}},
    }
    assert list(SessionSettings(mcp_servers=servers).to_json()["mcp_servers"]) == ["open"]
    stored = Initialization(mcp_servers=servers).to_storable(frozenset())
    assert list(stored["mcp_servers"]) == ["open"] and stored["mcp_servers_withheld"] == [
        "apikey",
        "key",
        "token",
    ]


def test_tool_names_are_what_model_apis_accept() -> None:
    assert tool_name("git", "git_status") == "mcp__git__git_status"
    assert tool_name("fs", "read.file/v2") == "mcp__fs__read_file_v2"
    long = tool_name("server", "x" * 100)
    assert len(long) == 64 and long.startswith("mcp__server__xxx") and long != tool_name("server", "x" * 99)


def test_a_skills_mcp_servers_are_checked_like_the_file() -> None:
    skill = parse_skill(
        "---\nname: s\nmcp-servers:\n  git: {command: mcp-server-git, args: [--repository, .]}\n---\nx",
        source="s.md",
    )
    git = skill.mcp_servers["git"]
    assert isinstance(git, StdioServer) and git.args == ["--repository", "."]
    assert "mcp-servers" not in skill.metadata
    with pytest.raises(InvalidArgument, match=r"s.md: mcp-servers: mcpServers.git.args: must be a list"):
        parse_skill("---\nname: s\nmcp-servers:\n  git: {command: x, args: y}\n---\nx", source="s.md")


@pytest.mark.parametrize(
    "command", [["serve"], ["acp"], ["mcp"], ["coven", "--gateway", "127.0.0.1:1"]], ids=lambda c: c[0]
)
def test_a_bad_operator_file_stops_the_start(tmp_path: Path, command: list[str]) -> None:
    """Every command that runs the agent reads the operator's file first (the flag for serve, the
    environment for all): a fault is exit 2 with the reason, never a traceback."""
    path = tmp_path / "mcp.yaml"
    path.write_text("mcpServers:\n  git:\n    command: [not, a, string]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "a3s_agent", *command, "--workspace", str(tmp_path)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={**os.environ, "A3S_MCP_CONFIG": str(path)},
    )  # fmt: skip
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2
    assert f"--mcp-config (A3S_MCP_CONFIG): {path}: mcpServers.git.command: must be a string" in proc.stderr


# --- the Streamable HTTP fixture ----------------------------------------------------------------


@pytest.fixture
def http_fixture(tmp_path: Path) -> Iterator[str]:
    """The fixture server over Streamable HTTP in a subprocess; its /mcp URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, FIXTURE, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MCP_FIXTURE_LOG": str(tmp_path / "http.log")},
    )
    try:
        _wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the HTTP fixture exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the HTTP fixture did not listen")
