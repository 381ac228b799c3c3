"""`--sandbox-network allow:host,...` through the real interface: a server whose commands reach
the allowed hosts only through its proxy, under bwrap (the proxy's listener handed into each
command's network namespace), refused at start under Landlock; and the network an operator gives
an MCP server or a skill of its own.

The allowed hosts here are loopback HTTP servers of the test, named by address (there is no DNS),
which the operator allows the proxy to reach with A3S_FETCH_ALLOW_PRIVATE=1."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest

from a3s_agent.config import SandboxSettings, Settings, parse_sandbox_network
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.tools.sandbox import bwrap, narrowed

from ..conftest import MCP_FIXTURE, WITHIN_S, LiveServer, fixture_readable, new_session, running
from .test_sandbox import loopback_http

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(bwrap.problem() is not None, reason=f"bwrap does not work here: {bwrap.problem()}"),
]

second_http = loopback_http  # another loopback server: one the list does not name

FETCH_CODE = (
    "import sys, urllib.request as u\n"
    "try: print(u.urlopen(sys.argv[1], timeout=20).read().decode())\n"
    "except Exception as e: print(e); sys.exit(1)"
)
FETCH = f'{sys.executable} -I -S -c "{FETCH_CODE}" '
"""A command that fetches its argument's URL, through the proxy its environment names."""
DIRECT = FETCH.replace("u.urlopen(", "u.build_opener(u.ProxyHandler({})).open(")
"""The same, ignoring the proxy."""


@pytest.fixture(autouse=True)
def _private_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A3S_FETCH_ALLOW_PRIVATE", "1")  # the test's sites are on 127.0.0.1


@pytest.fixture
async def allowing(workspace: Path, tmp_path: Path, loopback_http: int) -> AsyncIterator[LiveServer]:
    """A server under bwrap whose commands may reach the first loopback site only."""
    settings = Settings(
        listen="127.0.0.1:0",
        workspace=workspace,
        data_dir=tmp_path / "data",
        sandbox=SandboxSettings(
            mechanism="bwrap", network="allow", allowed_hosts=(f"127.0.0.1:{loopback_http}",)
        ),
    )
    async with running(settings) as live:
        yield live


async def bash(live: LiveServer, command: str) -> pb.ToolResult:
    reply = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": command}))
    )
    return reply.result


async def test_a_command_reaches_an_allowed_host_through_the_proxy_and_nothing_else(
    allowing: LiveServer, loopback_http: int, second_http: int
) -> None:
    reached = await bash(allowing, FETCH + f"http://127.0.0.1:{loopback_http}/")
    assert reached.success and reached.output == "reached\n", reached.error
    assert reached.metadata["sandbox"] == "bwrap"
    assert reached.metadata["sandbox_network"] == f"allow:127.0.0.1:{loopback_http}"
    # The launcher that made the proxy reachable left the command nothing of its own: no
    # descriptor, no listen() (the seccomp program is loaded), no capability.
    inside = await bash(allowing, "ls /proc/self/fd; grep -E '^(Seccomp|CapEff):' /proc/self/status")
    assert inside.output.split() == ["0", "1", "2", "3", "CapEff:", "0000000000000000", "Seccomp:", "2"]
    listen = await bash(
        allowing, f"{sys.executable} -I -S -c 'import socket; socket.create_server((\"127.0.0.1\", 0))'"
    )
    assert not listen.success and "Operation not permitted" in listen.output
    # Around the proxy: nothing is reachable from the command's own network namespace.
    direct = await bash(allowing, DIRECT + f"http://127.0.0.1:{loopback_http}/")
    assert not direct.success and "Connection refused" in direct.output
    # Another port of the same address: the proxy refuses it, and the model is told why.
    other = await bash(allowing, FETCH + f"http://127.0.0.1:{second_http}/")
    assert not other.success and "reached" not in other.output
    assert (
        f"the sandbox's network proxy refused GET 127.0.0.1:{second_http}: 127.0.0.1 is allowed on port"
        f" {loopback_http}, not {second_http}" in other.error
    )


async def test_a_calls_credential_ends_with_the_call(allowing: LiveServer, loopback_http: int) -> None:
    said = await bash(allowing, "echo $HTTPS_PROXY")
    url = urlsplit(said.output.strip())
    assert url.hostname == "127.0.0.1" and url.port and url.password, said.output
    reader, writer = await asyncio.open_connection("127.0.0.1", url.port)
    credentials = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
    writer.write(
        f"GET http://127.0.0.1:{loopback_http}/ HTTP/1.1\r\nProxy-Authorization: Basic {credentials}\r\n\r\n".encode()
    )
    async with asyncio.timeout(WITHIN_S):
        answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 407 ") and b"reached" not in answer


async def test_initialize_narrows_the_allowed_hosts_and_ports_never_widens_them(
    allowing: LiveServer, loopback_http: int, second_http: int
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await allowing.stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(custom={"sandbox_network": f"allow:127.0.0.1:{second_http}"})
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"127.0.0.1:{second_http}: not within the operator's" in (err.value.details() or "")
    await allowing.stub.Initialize(
        pb.InitializeRequest(
            config=pb.AgentConfig(custom={"sandbox_network": f"allow:127.0.0.1:{loopback_http}"})
        )
    )
    reached = await bash(allowing, FETCH + f"http://127.0.0.1:{loopback_http}/")
    assert reached.success and reached.output == "reached\n", reached.error


def serve_under_landlock(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`a3s-agent serve` forced to Landlock with `env` (stopped after a minute should it start)."""
    return subprocess.run(
        [sys.executable, "-m", "a3s_agent", "serve", "--listen", "127.0.0.1:0", "--http-listen", "off"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "A3S_SANDBOX": "landlock", "A3S_DATA_DIR": str(tmp_path / "data"), **env},
    )


def test_allow_under_landlock_is_refused_at_start(tmp_path: Path) -> None:
    """Landlock's TCP rules know ports only: a command could reach any address on the proxy's port."""
    done = serve_under_landlock(tmp_path, A3S_SANDBOX_NETWORK="allow:pypi.org")
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stderr
    assert "--sandbox-network (A3S_SANDBOX_NETWORK): the network allow:pypi.org needs bwrap" in said
    assert "Landlock's TCP rules know ports, not addresses" in said
    assert "user namespaces" in said and "--sandbox-network on" in said and " or off" in said


async def test_under_landlock_initialize_cannot_narrow_on_to_a_list(workspace: Path, tmp_path: Path) -> None:
    settings = Settings(
        listen="127.0.0.1:0",
        workspace=workspace,
        data_dir=tmp_path / "data",
        sandbox=SandboxSettings(mechanism="landlock", network="on"),
    )
    async with running(settings) as live:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await live.stub.Initialize(
                pb.InitializeRequest(config=pb.AgentConfig(custom={"sandbox_network": "allow:pypi.org"}))
            )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.custom.sandbox_network: the network allow:pypi.org needs bwrap" in (
        err.value.details() or ""
    )


@pytest.mark.parametrize(
    ("operator", "wanted", "given"),
    [
        ("*.example.com", "a.example.com,*.b.example.com", "allow:a.example.com,*.b.example.com"),
        ("host.test:8443,host.test", "host.test:443", "allow:host.test:443"),
        ("*", "pypi.org", "allow:pypi.org"),
        ("Pypi.org.", "pypi.org", "allow:pypi.org"),
        ("pypi.org", "off", "off"),
    ],
)
def test_what_an_initialize_may_narrow_to(operator: str, wanted: str, given: str) -> None:
    mode, hosts = parse_sandbox_network(f"allow:{operator}")
    settings = SandboxSettings(network=mode, allowed_hosts=hosts)
    assert narrowed(settings, wanted if wanted == "off" else f"allow:{wanted}") == given


@pytest.mark.parametrize(
    ("operator", "wanted", "wider"),
    [
        ("*.example.com", "example.com", "example.com"),
        ("*.example.com", "*", "*"),
        ("host.test", "host.test:8443", "host.test:8443"),
        ("a.example.com", "*.example.com", "*.example.com"),
        ("pypi.org", "on", "'on' is wider"),
    ],
)
def test_what_an_initialize_may_not_widen_to(operator: str, wanted: str, wider: str) -> None:
    mode, hosts = parse_sandbox_network(f"allow:{operator}")
    settings = SandboxSettings(network=mode, allowed_hosts=hosts)
    with pytest.raises(ValueError, match=re.escape(wider)):
        narrowed(settings, wanted if wanted == "on" else f"allow:{wanted}")


def test_sandbox_check_tries_the_proxy_with_entries_of_every_form() -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "a3s_agent", "sandbox", "check", "--sandbox", "bwrap"),
            *("--sandbox-network", "allow:registry.local:8443,*.npmjs.org,[2001:db8::1]:443"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        lines[0].startswith("mechanism: bwrap")
        and "allow:registry.local:8443,*.npmjs.org,[2001:db8::1]" in lines[0]
    )
    assert any(line.startswith("pass reach the network proxy, which refuses") for line in lines)


# --- a network the operator gives an MCP server or a skill of its own ------------------------------


def fetching_server(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(MCP_FIXTURE), "stdio"], **extra}


def fetching_skill(network: str) -> str:
    """A skill whose tool fetches its `url` argument (through the proxy its environment names)."""
    frontmatter = {
        "name": "fetcher",
        "tools": [
            {
                "name": "fetch_url",
                "parameters": {"type": "object", "properties": {"url": {"type": "string"}}},
                "binary": [sys.executable, "-I", "-S", "-c", FETCH_CODE, "${url}"],
            }
        ],
    }
    if network:
        frontmatter["sandbox-network"] = network
    return f"---\n{json.dumps(frontmatter)}\n---\nFetch things.\n"


@pytest.fixture
async def operator_configured(
    workspace: Path, tmp_path: Path, loopback_http: int
) -> AsyncIterator[LiveServer]:
    """A server with the network off for commands, whose operator gives one MCP server and one
    skill the first loopback site."""
    allowed = f"allow:127.0.0.1:{loopback_http}"
    mcp_config = tmp_path / "mcp.json"
    servers = {"net": fetching_server(sandbox_network=allowed), "plain": fetching_server()}
    mcp_config.write_text(json.dumps({"mcpServers": servers}))
    skills = tmp_path / "skills" / "fetcher"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text(fetching_skill(allowed))
    settings = fixture_readable(
        Settings(
            listen="127.0.0.1:0",
            workspace=workspace,
            data_dir=tmp_path / "data",
            mcp_config=mcp_config,
            skill_dirs=[tmp_path / "skills"],
            allow_api_mcp_commands=True,
        ),
        tmp_path,
    )
    settings = replace(settings, sandbox=replace(settings.sandbox, mechanism="bwrap"))
    async with running(settings) as live:
        yield live


async def call_tool(
    live: LiveServer, name: str, arguments: dict[str, Any], session_id: str = ""
) -> pb.ToolResult:
    reply = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=session_id, tool_name=name, arguments=json.dumps(arguments))
    )
    return reply.result


async def test_an_mcp_server_gets_the_network_the_operators_config_gives_it(
    operator_configured: LiveServer, loopback_http: int, second_http: int
) -> None:
    site = f"http://127.0.0.1:{loopback_http}/"
    assert (await call_tool(operator_configured, "mcp__net__fetch", {"url": site})).output == "reached"
    other = await call_tool(
        operator_configured, "mcp__net__fetch", {"url": f"http://127.0.0.1:{second_http}/"}
    )
    assert "not one of the hosts" not in other.output and f"allowed on port {loopback_http}" in other.output
    plain = await call_tool(operator_configured, "mcp__plain__fetch", {"url": site})
    assert plain.output.startswith("failed:") and "reached" not in plain.output  # the server's network: off
    bash = await call_tool(operator_configured, "bash", {"command": FETCH + site})
    assert not bash.success and "reached" not in bash.output


async def test_an_operators_skill_gets_the_network_it_names(
    operator_configured: LiveServer, loopback_http: int
) -> None:
    site = f"http://127.0.0.1:{loopback_http}/"
    session_id = await new_session(operator_configured)
    await operator_configured.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="fetcher"))
    fetched = await call_tool(operator_configured, "fetch_url", {"url": site}, session_id)
    assert fetched.success and fetched.output == "reached\n", fetched.error
    assert fetched.metadata["sandbox_network"] == f"allow:127.0.0.1:{loopback_http}"


async def test_only_the_operator_gives_a_network(
    operator_configured: LiveServer, workspace: Path, loopback_http: int, caplog: pytest.LogCaptureFixture
) -> None:
    allowed = f"allow:127.0.0.1:{loopback_http}"
    site = f"http://127.0.0.1:{loopback_http}/"
    # A client's MCP server, for a session or server-wide, and a client's skill: refused.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await operator_configured.stub.CreateSession(
            pb.CreateSessionRequest(),
            metadata=(("a3s-mcp-servers", json.dumps({"mine": fetching_server(sandbox_network=allowed)})),),
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "mine name a sandbox_network; only the operator's configuration" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await operator_configured.stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(
                    custom={"mcp_servers": json.dumps({"mine": fetching_server(sandbox_network="on")})}
                )
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await operator_configured.stub.LoadSkill(pb.LoadSkillRequest(skill_content=fetching_skill(allowed)))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "names a sandbox-network; only the operator's skills" in (err.value.details() or "")
    # The repository's own skill of another name: loaded, without the network it names.
    planted = workspace / ".a3s" / "skills" / "planted"
    planted.mkdir(parents=True)
    (planted / "SKILL.md").write_text(
        fetching_skill(allowed).replace("fetch_url", "planted_fetch").replace('"fetcher"', '"planted"')
    )
    session_id = await new_session(operator_configured)
    with caplog.at_level("WARNING"):
        await operator_configured.stub.LoadSkill(
            pb.LoadSkillRequest(session_id=session_id, skill_name="planted")
        )
    assert any("names a sandbox network" in r.getMessage() for r in caplog.records)
    fetched = await call_tool(operator_configured, "planted_fetch", {"url": site}, session_id)
    assert not fetched.success and "reached" not in fetched.output
    assert fetched.metadata["sandbox_network"] == "off"


def test_an_mcp_servers_allow_under_landlock_is_refused_at_start(tmp_path: Path) -> None:
    mcp_config = tmp_path / "mcp.json"
    mcp_config.write_text(
        json.dumps({"mcpServers": {"net": fetching_server(sandbox_network="allow:pypi.org")}})
    )
    done = serve_under_landlock(tmp_path, A3S_MCP_CONFIG=str(mcp_config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "--mcp-config: mcpServers.net.sandbox_network: the network allow:pypi.org needs bwrap" in done.stderr
    )


async def test_our_own_rg_and_git_run_with_the_network_off(allowing: LiveServer, workspace: Path) -> None:
    """They never need it, and so never pay for reaching the proxy."""
    subprocess.run(["git", "init", "-q", str(workspace)], check=True, timeout=60)
    (workspace / "notes.txt").write_text("needle\n")
    for tool, arguments in (("grep", {"pattern": "needle"}), ("git_status", {})):
        result = await call_tool(allowing, tool, arguments)
        assert result.success, result.error
        assert result.metadata["sandbox"] == "bwrap" and result.metadata["sandbox_network"] == "off", tool
