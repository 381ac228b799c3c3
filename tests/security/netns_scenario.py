"""A small internet inside a private network namespace, for tests/security/test_web_fetch.py.

Run by that test as `unshare -n -m sh -c '...; python -m tests.security.netns_scenario OUT'`,
with 1.2.3.4 (a public address) added to the namespace's loopback and /etc/resolv.conf pointing
at 127.0.0.1. It serves:

- a public site on 1.2.3.4:8080: /page, and redirects to the internal service;
- an internal service on 127.0.0.1:8080 (think cloud metadata), recording every request;
- a DNS server on 127.0.0.1:53: public.test -> 1.2.3.4, internal.test -> 127.0.0.1, and
  rebind.test -> 1.2.3.4 for the first A query, 127.0.0.1 for every later one (TTL 0).

Then it attacks the real agent server in this process over gRPC: web_fetch through ExecuteTool,
a skill's http tool through LoadSkill and Generate (the fake LLM calls it). It writes what every
attack returned, and what the internal service and the DNS server saw, as JSON to OUT; the test
asserts on it. Nothing here leaves the namespace.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import sys
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from aiohttp import web

from a3s_agent.config import Settings
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from ..conftest import agent_settings, initialize, new_session, running, user

PUBLIC = "1.2.3.4"
INTERNAL = "127.0.0.1"
PORT = 8080
INTERNAL_SECRET = "INTERNAL-METADATA-SECRET"
PUBLIC_PAGE = "a page on the public site"

WEB_FETCH_URLS = {
    "control": f"http://public.test:{PORT}/page",
    "control_by_address": f"http://{PUBLIC}:{PORT}/page",
    "redirect_to_loopback": f"http://public.test:{PORT}/to/127.0.0.1",
    "redirect_to_decimal": f"http://public.test:{PORT}/to/2130706433",
    "redirect_to_mapped": f"http://public.test:{PORT}/to/[::ffff:127.0.0.1]",
    "redirect_to_name": f"http://public.test:{PORT}/to/internal.test",
    "name_of_loopback": f"http://internal.test:{PORT}/secret",
    "rebinding": f"http://rebind.test:{PORT}/page",
}
SKILL = f"""---
name: site-reader
description: Reads pages of a site.
tools:
  - name: read_site
    parameters:
      type: object
      properties: {{host: {{type: string}}, path: {{type: string}}}}
      required: [host, path]
    http: "http://${{host}}:{PORT}/${{path}}"
---
Read pages with read_site.
"""
SKILL_CALLS = {
    "control": {"host": "public.test", "path": "page"},
    "redirect_to_loopback": {"host": "public.test", "path": "to-loopback"},
    "name_of_loopback": {"host": "internal.test", "path": "secret"},
    "rebinding": {"host": "rebind.test", "path": "page"},
}


# ---------------------------------------------------------------- the sites


def public_site() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PUBLIC_PAGE)

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://{request.match_info['host']}:{PORT}/secret")

    async def to_loopback(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://{INTERNAL}:{PORT}/secret")

    app = web.Application()
    app.router.add_get("/page", page)
    app.router.add_get("/to/{host}", redirect)
    app.router.add_get("/to-loopback", to_loopback)
    return app


def internal_service(hits: list[dict[str, str]]) -> web.Application:
    async def anything(request: web.Request) -> web.Response:
        hits.append({"path": request.path, "host": request.headers.get("Host", "")})
        return web.Response(text=INTERNAL_SECRET)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


# ---------------------------------------------------------------- the DNS server


class Dns(asyncio.DatagramProtocol):
    """Answers A queries for the three names above; AAAA and anything else get no address."""

    def __init__(self) -> None:
        self.queries: list[str] = []  # "A rebind.test", "AAAA public.test"...
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def answer_for(self, name: str) -> str | None:
        if name == "public.test":
            return PUBLIC
        if name == "internal.test":
            return INTERNAL
        if name == "rebind.test":
            return PUBLIC if self.queries.count("A rebind.test") == 1 else INTERNAL
        return None

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        query_id, flags = struct.unpack("!HH", data[:4])
        labels, offset = [], 12
        while data[offset]:
            labels.append(data[offset + 1 : offset + 1 + data[offset]].decode())
            offset += 1 + data[offset]
        question = data[12 : offset + 5]
        name = ".".join(labels).lower()
        qtype = struct.unpack("!H", data[offset + 1 : offset + 3])[0]
        self.queries.append(f"{'A' if qtype == 1 else 'AAAA' if qtype == 28 else qtype} {name}")
        known = name in {"public.test", "internal.test", "rebind.test"}
        address = self.answer_for(name) if qtype == 1 else None
        answer = b""
        if address is not None:
            rdata = bytes(int(part) for part in address.split("."))
            answer = struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + rdata
        reply_flags = 0x8180 | (flags & 0x0100) | (0 if known else 3)
        header = struct.pack("!HHHHHH", query_id, reply_flags, 1, 1 if answer else 0, 0, 0)
        assert self.transport is not None
        self.transport.sendto(header + question + answer, addr)


# ---------------------------------------------------------------- the attacks


async def web_fetch(server: Any, url: str) -> dict[str, Any]:
    reply = await server.stub.ExecuteTool(
        pb.ExecuteToolRequest(tool_name="web_fetch", arguments=json.dumps({"url": url, "timeout_ms": 10_000}))
    )
    return {"success": reply.result.success, "output": reply.result.output, "error": reply.result.error}


async def skill_call(
    server: Any, fake: FakeLLM, session_id: str, arguments: dict[str, str]
) -> dict[str, Any]:
    fake.script(tool_call("read_site", arguments), text("done"))
    result = await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("read")]))
    called = result.tool_calls[0].result
    return {"success": called.success, "output": called.output, "error": called.error}


async def attack(workdir: Path) -> dict[str, Any]:
    hits: list[dict[str, str]] = []
    runners = []
    for app, host in ((public_site(), PUBLIC), (internal_service(hits), INTERNAL)):
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, host, PORT).start()
        runners.append(runner)
    dns = Dns()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: dns, local_addr=("127.0.0.1", 53)
    )
    workspace = workdir / "workspace"
    workspace.mkdir()
    settings: Settings = agent_settings(workspace, workdir / "data")
    results: dict[str, Any] = {"web_fetch": {}, "skill": {}}
    try:
        async with FakeLLM() as fake, running(settings) as server:
            await initialize(server, fake)
            for case, url in WEB_FETCH_URLS.items():
                results["web_fetch"][case] = await web_fetch(server, url)
            results["rebind_a_queries"] = dns.queries.count("A rebind.test")
            session_id = await new_session(server)
            await server.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_content=SKILL))
            for case, arguments in SKILL_CALLS.items():
                dns.queries.clear()  # each rebinding attack starts from a fresh name
                results["skill"][case] = await skill_call(server, fake, session_id, arguments)
    finally:
        transport.close()
        for runner in runners:
            await runner.cleanup()
    results["internal_hits"] = hits
    return results


def main() -> None:
    out = Path(sys.argv[1])
    assert "A3S_FETCH_ALLOW_PRIVATE" not in os.environ
    with TemporaryDirectory() as workdir:
        results = asyncio.run(attack(Path(workdir)))
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
