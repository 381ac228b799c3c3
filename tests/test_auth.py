"""The optional bearer token on both faces."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from a3s_agent.app import Application
from a3s_agent.config import Settings
from a3s_agent.faces.http import start_http
from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import running

TOKEN = "s3cret-token"
GOOD = (("authorization", f"Bearer {TOKEN}"),)


async def test_grpc_calls_need_the_token_but_probes_do_not(workspace: Path, tmp_path: Path) -> None:
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "d", auth_token=TOKEN)
    async with running(settings) as server:
        for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in err.value.details()
        stream = server.stub.SubscribeEvents(pb.SubscribeEventsRequest())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream.read()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        created = await server.stub.CreateSession(pb.CreateSessionRequest(), metadata=GOOD)
        assert created.session_id
        health = health_pb2_grpc.HealthStub(server.channel)
        reply = await health.Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_http_routes_need_the_token_but_healthz_does_not(workspace: Path, tmp_path: Path) -> None:
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "d", auth_token=TOKEN)
    async with running(settings) as server:
        listener = await start_http(Application(server.runtime), "127.0.0.1:0")
        base = f"http://127.0.0.1:{listener.port}"
        try:
            async with aiohttp.ClientSession() as client:
                async with client.get(f"{base}/healthz") as reply:
                    assert reply.status == 200
                async with client.get(f"{base}/sessions") as reply:
                    assert reply.status == 401
                    assert (await reply.json())["error"]["code"] == "UNAUTHENTICATED"
                async with client.get(
                    f"{base}/sessions", headers={"Authorization": f"Bearer {TOKEN}"}
                ) as reply:
                    assert reply.status == 200
        finally:
            await listener.stop()
