"""JSON from outside nested too deeply or too long, through the real interfaces: call metadata and
HTTP headers (`a3s-mcp-servers`), Initialize's `config.custom.mcp_servers`, request fields, the
model's tool-call arguments and the model server's own chunks. Each is a clear error naming where
the JSON came from (INVALID_ARGUMENT / 400, a tool error, UNAVAILABLE), never INTERNAL / 500."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_llm import FakeLLM, Raw, text, tool_call

from ..conftest import LiveServer, agent_settings, new_session, running, user
from ..test_anthropic import KEY, initialize
from ..test_http import serving

pytestmark = pytest.mark.security

DEEP = "[" * 1000 + "]" * 1000
"""Deeper than Python's parser can go (it raised RecursionError at about 1,000 levels)."""
TOO_DEEP = "nested too deeply (more than 100 levels)"


def nested(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


async def test_deep_mcp_server_configs_name_where_they_came_from(agent: LiveServer) -> None:
    deep = (("a3s-mcp-servers", DEEP),)
    session = await new_session(agent)
    for call in [
        agent.stub.CreateSession(pb.CreateSessionRequest(), metadata=deep),
        agent.stub.ConfigureSession(pb.ConfigureSessionRequest(session_id=session), metadata=deep),
    ]:
        error = await refused(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details() == f"a3s-mcp-servers: not valid JSON: {TOO_DEEP}"
    error = await refused(
        agent.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(custom={"mcp_servers": DEEP})))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert error.details() == f"config.custom.mcp_servers: not valid JSON: {TOO_DEEP}"
    async with serving(agent) as http:
        for path, body in [("/sessions", {}), ("/rpc/ConfigureSession", {"session_id": session})]:
            answer = await http.client.post(path, json=body, headers={"a3s-mcp-servers": DEEP})
            assert answer.status == 400, await answer.text()
            assert (await answer.json())["error"]["message"] == f"a3s-mcp-servers: not valid JSON: {TOO_DEEP}"
    # The server is as it was: the session has no servers, Initialize changed nothing.
    assert (
        await agent.stub.HealthCheck(pb.HealthCheckRequest())
    ).status == pb.HealthCheckResponse.STATUS_HEALTHY


async def test_an_mcp_server_config_longer_than_its_bound_is_refused(agent: LiveServer) -> None:
    padded = json.dumps({"docs": {"url": "https://mcp.example/mcp", "headers": {"X-Pad": "x" * 300_000}}})
    error = await refused(
        agent.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(custom={"mcp_servers": padded})))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert error.details() == "config.custom.mcp_servers: longer than 262,144 characters"


async def test_json_fields_nest_at_most_a_hundred_levels(agent: LiveServer) -> None:
    """JSON that parses but nests past the bound is refused before anything walks it."""
    session = await new_session(agent)

    def check(arguments: str) -> Awaitable[pb.CheckPermissionResponse]:
        return agent.stub.CheckPermission(
            pb.CheckPermissionRequest(session_id=session, tool_name="bash", arguments=arguments)
        )

    await check(nested(100))  # 100 objects, one in the other
    for arguments in (nested(101), nested(900), DEEP):
        error = await refused(check(arguments))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details() == f"arguments: not valid JSON: {TOO_DEEP}"


async def test_the_models_deep_tool_arguments_are_a_tool_error_and_the_run_goes_on(
    workspace: Path, tmp_path: Path
) -> None:
    """Anthropic's API takes the arguments back as an object in the next request: they were
    parsed again there, past the depth Python's parser can go."""
    async with (
        FakeAnthropic(api_key=KEY) as claude,
        running(agent_settings(workspace, tmp_path / "data")) as live,
    ):
        await initialize(live, claude)
        claude.script(tool_call("bash", '{"command": ' + DEEP + "}"), text("done"))
        session = await new_session(live)
        reply = await live.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("go")]))
    [call] = reply.tool_calls
    assert not call.result.success
    assert call.result.error == f"arguments for bash: not valid JSON: {TOO_DEEP}"
    assert reply.message.content == "done"  # the model was told, and went on


async def test_a_model_server_sending_deep_json_is_unavailable(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(Raw(f"data: {DEEP}\n\n".encode()))
    session = await new_session(agent)
    error = await refused(agent.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("go")])))
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert "the LLM provider sent a malformed chunk" in (error.details() or "")
