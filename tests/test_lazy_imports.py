"""What the server leaves unimported until it is used: httpx (whose import loads its command line,
and with it rich and pygments when they are installed) waits for the first web_fetch, web_search or
http skill call. Checked in a fresh process running `a3s-agent serve`'s own `run`, since pytest's
process has imported everything already."""

from __future__ import annotations

from pathlib import Path

from .conftest import run_fresh_server

WATCHED = ("httpx", "rich", "pygments", "click")

_CHILD = """
import json, os, signal, sys

from aiohttp import web

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

WATCHED = {watched!r}


async def main() -> None:
    serving = serve()
    page = web.Application()
    page.router.add_get("/", lambda request: web.Response(text="fetched through httpx"))
    runner = web.AppRunner(page)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    async with grpc.aio.insecure_channel("127.0.0.1:{port}") as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        await until_serving(stub)
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
    report, _ = run_fresh_server(_CHILD, tmp_path, {"A3S_FETCH_ALLOW_PRIVATE": "1"}, 120, watched=WATCHED)
    assert report["idle"] == [], f"imported while idle: {report['idle']}"
    assert report["used"] and "fetched through httpx" in report["output"] and report["code"] == 0
