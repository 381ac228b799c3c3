"""What the server leaves unimported until it is used: httpx (whose import loads its command line,
and with it rich and pygments when they are installed) waits for the first web_fetch, web_search or
http skill call. Checked in a fresh process running `a3s-agent serve`'s own `run`, since pytest's
process has imported everything already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import free_port

WATCHED = ("httpx", "rich", "pygments", "click")

_CHILD = """
import asyncio, json, os, signal, sys
from pathlib import Path

import grpc
from aiohttp import web

from a3s_agent import server
from a3s_agent.config import Settings
from a3s_agent.proto import code_agent_pb2 as pb, code_agent_pb2_grpc as pb_grpc

WATCHED = {watched!r}


async def main() -> None:
    settings = Settings(
        listen="127.0.0.1:{port}", http_listen="127.0.0.1:{http_port}",
        workspace=Path({workspace!r}), data_dir=Path({data!r}),
    )
    serving = asyncio.create_task(server.run(settings))
    page = web.Application()
    page.router.add_get("/", lambda request: web.Response(text="fetched through httpx"))
    runner = web.AppRunner(page)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    async with grpc.aio.insecure_channel("127.0.0.1:{port}") as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        while True:
            try:
                if (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=0.5)).status == 1:
                    break
            except grpc.RpcError:
                await asyncio.sleep(0.05)
        await stub.ListSessions(pb.ListSessionsRequest())
        idle = [name for name in WATCHED if name in sys.modules]
        url = f"http://127.0.0.1:{{runner.addresses[0][1]}}/"
        reply = await stub.ExecuteTool(
            pb.ExecuteToolRequest(tool_name="web_fetch", arguments=json.dumps({{"url": url}}))
        )
        used = "httpx" in sys.modules
    await runner.cleanup()
    os.kill(os.getpid(), signal.SIGTERM)
    code = await serving
    print(json.dumps({{"idle": idle, "used": used, "output": reply.result.output, "code": code}}))


asyncio.run(main())
"""


def test_the_serving_server_has_not_imported_httpx_until_a_tool_fetches(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    child = _CHILD.format(
        watched=WATCHED,
        port=free_port(),
        http_port=free_port(),
        workspace=str(workspace),
        data=str(tmp_path / "data"),
    )
    env = {**os.environ, "A3S_FETCH_ALLOW_PRIVATE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["idle"] == [], f"imported while idle: {report['idle']}"
    assert report["used"] and "fetched through httpx" in report["output"] and report["code"] == 0
