"""HealthCheck, GetCapabilities, Initialize and Shutdown through a real client."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent import __version__
from a3s_agent.config import Settings
from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import LiveServer, running


async def test_health_check_reports_version_uptime_sessions_workspace_and_store(live: LiveServer) -> None:
    await live.stub.CreateSession(pb.CreateSessionRequest())
    reply = await live.stub.HealthCheck(pb.HealthCheckRequest())
    assert reply.status == pb.HealthCheckResponse.STATUS_HEALTHY
    assert reply.details["version"] == __version__
    assert float(reply.details["uptime_s"]) >= 0
    assert reply.details["active_sessions"] == "1"
    assert reply.details["workspace"] == str(live.workspace.resolve())
    assert reply.details["store"] == "sqlite"


async def test_capabilities_describe_the_agent_and_enforced_limits(live: LiveServer) -> None:
    reply = await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert reply.info.name == "a3s-agent"
    assert reply.info.version == __version__
    assert reply.info.license and reply.info.homepage and reply.info.description
    assert {"lifecycle", "sessions", "persistent_sessions", "skills", "events", "permissions"} <= set(
        reply.features
    )
    assert [t.name for t in reply.tools] == [t.name for t in live.runtime.registry.enabled()]
    assert reply.limits.max_concurrent_sessions == live.runtime.settings.max_sessions
    assert reply.limits.max_context_tokens == live.runtime.settings.max_context_tokens
    assert reply.limits.max_tools_per_request == live.runtime.settings.max_tools_per_request


async def test_session_limit_is_enforced(live: LiveServer) -> None:
    live.runtime.sessions._max_sessions = 2
    for _ in range(2):
        await live.stub.CreateSession(pb.CreateSessionRequest())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.CreateSession(pb.CreateSessionRequest())
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_initialize_sets_workspace_llm_and_env(live: LiveServer, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    reply = await live.stub.Initialize(
        pb.InitializeRequest(
            workspace=str(other),
            config=pb.AgentConfig(
                llm=pb.LLMConfig(provider="openai", model="gpt-test", api_key="sk-init-secret"),
                log=pb.LogConfig(level=pb.LogConfig.LEVEL_WARN),
            ),
            env={"FOO": "bar"},
        )
    )
    assert reply.success and reply.info.name == "a3s-agent"
    health = await live.stub.HealthCheck(pb.HealthCheckRequest())
    assert health.details["workspace"] == str(other.resolve())
    created = await live.stub.CreateSession(pb.CreateSessionRequest())
    assert created.session.config.workspace == str(other.resolve())
    caps = await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert [(m.provider, m.model) for m in caps.models] == [("openai", "gpt-test")]
    assert live.runtime.llm_for().api_key == "sk-init-secret"
    assert live.runtime.tool_context(None).env == {"FOO": "bar"}
    # Calling it again re-initialises.
    await live.stub.Initialize(pb.InitializeRequest(workspace=str(live.workspace)))
    health = await live.stub.HealthCheck(pb.HealthCheckRequest())
    assert health.details["workspace"] == str(live.workspace.resolve())
    assert live.runtime.tool_context(None).env == {}


@pytest.mark.parametrize("bad", ["does-not-exist", "a-file"])
async def test_initialize_refuses_a_workspace_that_is_not_a_directory(
    live: LiveServer, tmp_path: Path, bad: str
) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.Initialize(pb.InitializeRequest(workspace=str(tmp_path / bad)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "workspace" in err.value.details()
    health = await live.stub.HealthCheck(pb.HealthCheckRequest())
    assert health.details["workspace"] == str(live.workspace.resolve())


async def test_initialize_refuses_unknown_tool_names(live: LiveServer) -> None:
    request = pb.InitializeRequest(
        config=pb.AgentConfig(tools=pb.ToolsConfig(disabled_tools=["no_such_tool"]))
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.Initialize(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no_such_tool" in err.value.details()


async def test_shutdown_answers_then_health_reports_not_serving(live: LiveServer) -> None:
    health = health_pb2_grpc.HealthStub(live.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
    first = await watch.read()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    reply = await live.stub.Shutdown(pb.ShutdownRequest())
    assert reply.success
    assert live.runtime.shutdown_requested.is_set()
    await live.server.stop(1)  # what the serve loop does once Shutdown is requested
    update = await watch.read()
    assert update.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_reflection_v1_lists_services_for_clients_that_know_only_the_address(live: LiveServer) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    call = live.channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    reply = await call.read()
    await call.done_writing()
    names = {s.name for s in reply.list_services_response.service}
    assert "a3s.code.agent.v1.CodeAgentService" in names


async def test_one_log_line_per_rpc_without_secrets(
    live: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="a3s_agent")
    await live.stub.CreateSession(
        pb.CreateSessionRequest(
            session_id="logged",
            config=pb.SessionConfig(llm=pb.LLMConfig(api_key="sk-never-log-me")),
            initial_context=[pb.Message(role=pb.Message.ROLE_USER, content="private words")],
        )
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await live.stub.GetSession(pb.GetSessionRequest(session_id="missing"))
    lines = [r.getMessage() for r in caplog.records if r.name == "a3s_agent.rpc"]
    assert lines[0].startswith("rpc CreateSession session=logged status=OK duration_ms=")
    assert lines[1].startswith("rpc GetSession session=missing status=NOT_FOUND duration_ms=")
    assert len(lines) == 2
    assert "sk-never-log-me" not in caplog.text and "private words" not in caplog.text


def restart_settings(workspace: Path, tmp_path: Path) -> Settings:
    """Settings of a server on the `live` fixture's workspace and data dir (a restart of it)."""
    return Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data")


async def test_a_later_initialize_replaces_the_stored_one(live: LiveServer, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    await live.stub.Initialize(
        pb.InitializeRequest(
            workspace=str(other),
            config=pb.AgentConfig(tools=pb.ToolsConfig(enabled_tools=["read_file", "bash"])),
            env={"FOO": "bar"},
        )
    )
    await live.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=pb.LLMConfig(model="m2"))))
    await live.server.stop(0)
    await live.runtime.close()
    async with running(restart_settings(live.workspace, tmp_path)) as again:
        caps = await again.stub.GetCapabilities(pb.GetCapabilitiesRequest())
        health = await again.stub.HealthCheck(pb.HealthCheckRequest())
        env = again.runtime.tool_context(None).env
    assert len(caps.tools) == 21  # the second Initialize named no tool list: all enabled
    assert [m.model for m in caps.models] == ["m2"]
    assert health.details["workspace"] == str(other.resolve())  # chosen once, kept until changed
    assert env == {}


async def test_restore_fails_closed_when_stored_tools_or_workspace_are_gone(
    live: LiveServer, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    await live.stub.Initialize(
        pb.InitializeRequest(
            workspace=str(other), config=pb.AgentConfig(tools=pb.ToolsConfig(enabled_tools=["read_file"]))
        )
    )
    await live.server.stop(0)
    await live.runtime.close()
    other.rmdir()
    # A later version no longer has the one tool the host enabled: none may be enabled, not all.
    with closing(sqlite3.connect(tmp_path / "data" / "sessions.db")) as db, db:
        (data,) = db.execute("SELECT data FROM initialization").fetchone()
        stored = json.loads(data)
        db.execute(
            "UPDATE initialization SET data = ?",
            (json.dumps({**stored, "enabled_tools": ["tool_removed_since"]}),),
        )
    async with running(restart_settings(live.workspace, tmp_path)) as again:
        caps = await again.stub.GetCapabilities(pb.GetCapabilitiesRequest())
        health = await again.stub.HealthCheck(pb.HealthCheckRequest())
    assert stored["enabled_tools"] == ["read_file"]
    assert [t.name for t in caps.tools] == []
    assert health.details["workspace"] == str(live.workspace.resolve())


async def test_an_llm_whose_base_url_carries_credentials_is_not_stored(
    live: LiveServer, tmp_path: Path
) -> None:
    url = "https://user:pw-SECRET@llm.example/v1?key=q-SECRET"
    await live.stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(llm=pb.LLMConfig(model="m", base_url=url)))
    )
    await live.server.stop(0)
    await live.runtime.close()
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert b"SECRET" not in on_disk
    async with running(restart_settings(live.workspace, tmp_path)) as again:
        caps = await again.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert list(caps.models) == []  # the server's own (none here) until the host sends it again
