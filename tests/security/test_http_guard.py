"""The HTTP face refuses what a web page can make a browser send, and bad input never answers 500.

Each test attacks the real HTTP listener (in this process, next to the real gRPC server) with a
real aiohttp client or raw sockets, sending what a browser would: a rebound `Host`, a foreign
`Origin`, `Sec-Fetch-Site: cross-site`, a form body, a preflight.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from a3s_agent.app import Application
from a3s_agent.config import Settings
from a3s_agent.faces.http import HttpBindError, connections, start_http
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text

from ..conftest import LiveServer, new_session, running
from ..test_http import JSON, Http, error_of, serving, sse
from ..test_spaces_http import spaces_server
from .test_listeners import _self_signed

pytestmark = pytest.mark.security

ATTACKER = "rebind.attacker.example"
APP = "https://app.example"
TOKEN = "tok-http-guard-0123456789abcdef"


@asynccontextmanager
async def face(
    tmp_path: Path, address: str = "127.0.0.1:0", trust: ssl.SSLContext | None = None, **settings: Any
) -> AsyncIterator[Http]:
    """The gRPC server and its HTTP face with these settings, and a client to the HTTP face."""
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    config = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data", **settings)
    async with running(config) as server, serving(server, address, trust) as http:
        yield http


async def session_ids(server: LiveServer) -> set[str]:
    return {s.session_id for s in (await server.stub.ListSessions(pb.ListSessionsRequest())).sessions}


# --- 1. Host: DNS rebinding ------------------------------------------------------------------


async def test_a_host_that_does_not_name_the_server_is_misdirected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="a3s_agent.security")
    async with face(tmp_path, allowed_hosts=["agent.example", "proxy.example:8443"]) as http:
        client, port = http.client, http.port
        # A rebinding page: the attacker's name now resolves to 127.0.0.1, so its requests arrive here.
        for host in (
            ATTACKER,
            f"{ATTACKER}:{port}",
            "localhost.attacker.example",
            "127.0.0.2",
            "proxy.example",
        ):
            message = await error_of(
                await client.get("/sessions", headers={"Host": host}), 421, "PERMISSION_DENIED"
            )
            assert "--allowed-host" in message
        created = await client.post("/sessions", json={"session_id": "rebound"}, headers={"Host": ATTACKER})
        await error_of(created, 421, "PERMISSION_DENIED")
        assert await session_ids(http.server) == set()
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect("/ws", headers={"Host": ATTACKER})
        assert refused.value.status == 421
        # Our own names on any port (a port forward changes it), and the allowed ones.
        ours = ["localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LocalHost.:8080"]
        for host in [*ours, "agent.example", "agent.example:1234", "proxy.example:8443"]:
            assert (await client.get("/sessions", headers={"Host": host})).status == 200, host
        # Load balancers probe with a Host of their own.
        assert (await client.get("/healthz", headers={"Host": "10.1.2.3:4089"})).status == 200
    assert f"refused GET /sessions from 127.0.0.1: Host '{ATTACKER}'" in caplog.text


async def test_a_wildcard_listener_answers_to_the_machines_names_only(tmp_path: Path) -> None:
    async with face(tmp_path, "0.0.0.0:0") as http:
        name = socket.gethostname()
        for host in (name, f"{name}:{http.port}", "127.0.0.1", "localhost:1"):
            assert (await http.client.get("/sessions", headers={"Host": host})).status == 200, host
        await error_of(
            await http.client.get("/sessions", headers={"Host": ATTACKER}), 421, "PERMISSION_DENIED"
        )


# --- 2. Origin and Fetch Metadata ----------------------------------------------------------


async def test_a_foreign_origin_is_refused_on_every_route_and_the_websocket(tmp_path: Path) -> None:
    async with face(tmp_path) as http:
        session = await new_session(http.server)
        pwned = http.server.workspace / "pwned.txt"
        attempts = [
            ("GET", "/healthz", None),
            ("GET", "/sessions", None),
            ("GET", "/capabilities", None),
            ("POST", "/sessions", {"session_id": "from-a-page"}),
            ("DELETE", f"/sessions/{session}", None),
            ("POST", f"/sessions/{session}/tools/write_file", {"path": "pwned.txt", "content": "x"}),
            ("POST", "/rpc/execute_tool", {"session_id": session, "tool_name": "bash", "arguments": "{}"}),
            ("GET", "/v1/spaces/any", None),
        ]
        for origin in ("https://attacker.example", "null", "http://127.0.0.1:1"):
            for method, path, body in attempts:
                reply = await http.client.request(method, path, json=body, headers={"Origin": origin})
                message = await error_of(reply, 403, "PERMISSION_DENIED")
                assert "--allowed-origin" in message and "Access-Control-Allow-Origin" not in reply.headers
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.client.ws_connect("/ws", headers={"Origin": origin})
            assert refused.value.status == 403
        assert await session_ids(http.server) == {session} and not pwned.exists()
        # Without an Origin (curl, SDKs) all is well.
        assert (await http.client.get(f"/sessions/{session}")).status == 200


async def test_a_cross_site_no_cors_get_starts_no_generation(agent: LiveServer, fake: FakeLLM) -> None:
    """`<img src="http://127.0.0.1:4089/sessions/<id>/generate/stream?content=...">` sends no Origin."""
    async with serving(agent) as http:
        session = await new_session(agent)
        image = {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
        for site in ("cross-site", "same-site", "Cross-Site"):
            reply = await http.client.get(
                f"/sessions/{session}/generate/stream",
                params={"content": "run rm -rf ~"},
                headers={**image, "Sec-Fetch-Site": site},
            )
            assert "--allowed-origin" in await error_of(reply, 403, "PERMISSION_DENIED")
        assert fake.requests == []  # the model was never asked: nothing ran
        fake.script(text("pong"))  # typed into the address bar: Sec-Fetch-Site none
        events = await sse(
            await http.client.get(
                f"/sessions/{session}/generate/stream",
                params={"content": "ping"},
                headers={"Sec-Fetch-Site": "none"},
            )
        )
        assert events[-1] == ("done", {})


# --- 3. JSON bodies only ---------------------------------------------------------------------


async def test_a_body_that_is_not_json_never_reaches_a_handler(tmp_path: Path) -> None:
    async with face(tmp_path) as http:
        session = await new_session(http.server)
        simple_requests = [
            ("text/plain", b'{"session_id": "simple"}'),
            ("text/plain;charset=UTF-8", b'{"session_id": "simple"}'),
            ("application/x-www-form-urlencoded", b"session_id=simple"),
            (
                "multipart/form-data; boundary=x",
                b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--x--',
            ),
            (None, b'{"session_id": "simple"}'),
            (None, b""),
            ("application/json; charset=iso-8859-1", b'{"session_id": "simple"}'),
            ("application/jsonx", b'{"session_id": "simple"}'),
        ]
        for path in ("/sessions", "/rpc/create_session", f"/sessions/{session}/tools/write_file"):
            for content_type, body in simple_requests:
                headers = {"Content-Type": content_type} if content_type else {}
                reply = await http.client.post(
                    path, data=body, headers=headers, skip_auto_headers=["Content-Type"]
                )
                message = await error_of(reply, 415, "INVALID_ARGUMENT")
                assert "Content-Type: application/json" in message, message
        assert await session_ids(http.server) == {session}
        for content_type in ("application/json; charset=UTF-8", "Application/JSON"):
            reply = await http.client.post("/sessions", data=b"{}", headers={"Content-Type": content_type})
            assert reply.status == 201, content_type
        assert (await http.client.post("/sessions", headers=JSON)).status == 201  # empty JSON body: {}
        # A route that does not exist says so, whatever the body.
        await error_of(await http.client.put("/healthz", data=b"x"), 405, "UNIMPLEMENTED")


# --- 4. CORS for the allowed origins -------------------------------------------------------


async def test_an_allowed_origin_gets_cors_and_nothing_else_does(tmp_path: Path) -> None:
    async with face(tmp_path, allowed_origins=["https://App.example:443/"], auth_token=TOKEN) as http:
        client = http.client
        ask = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        preflight = await client.options("/sessions", headers={"Origin": APP, **ask})  # carries no token
        assert preflight.status == 204
        assert preflight.headers["Access-Control-Allow-Origin"] == APP
        assert {"GET", "POST", "DELETE"} <= set(preflight.headers["Access-Control-Allow-Methods"].split(", "))
        assert {"authorization", "content-type"} <= set(
            preflight.headers["Access-Control-Allow-Headers"].split(", ")
        )
        assert int(preflight.headers["Access-Control-Max-Age"]) > 0 and "Origin" in preflight.headers["Vary"]
        for origin in (
            "https://attacker.example",
            "http://app.example",
            "https://app.example.attacker.example",
        ):
            refused = await client.options("/sessions", headers={"Origin": origin, **ask})
            await error_of(refused, 403, "PERMISSION_DENIED")
            assert "Access-Control-Allow-Origin" not in refused.headers
        await error_of(await client.options("/sessions", headers=ask), 403, "PERMISSION_DENIED")

        auth = {"Authorization": f"Bearer {TOKEN}"}
        browser = {"Origin": APP, "Sec-Fetch-Site": "cross-site"}
        created = await client.post("/sessions", json={"session_id": "app"}, headers={**browser, **auth})
        assert created.status == 201 and created.headers["Access-Control-Allow-Origin"] == APP
        assert "Origin" in created.headers["Vary"]
        missing = await client.get("/sessions/ghost", headers={**browser, **auth})  # errors are readable too
        assert missing.status == 404 and missing.headers["Access-Control-Allow-Origin"] == APP
        unauthenticated = await client.get("/sessions", headers=browser)
        assert unauthenticated.status == 401 and unauthenticated.headers["Access-Control-Allow-Origin"] == APP
        async with client.ws_connect("/ws", headers={**browser, **auth}) as ws:
            await ws.send_json({"method": "get_session", "params": {"session_id": "app"}, "id": 1})
            assert (await ws.receive_json(timeout=5))["result"]["session"]["session_id"] == "app"
        plain = await client.get("/sessions", headers=auth)  # not a browser: no CORS headers at all
        assert "Access-Control-Allow-Origin" not in plain.headers
        every_header = [preflight.headers, created.headers, missing.headers, unauthenticated.headers]
        assert all(h.get("Access-Control-Allow-Origin") != "*" for h in every_header)


async def test_an_origin_that_is_not_an_origin_cannot_be_allowed(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data")
    async with running(settings) as server:
        for wrong in ("app.example", "https://app.example/ui", "*"):
            server.runtime.settings.allowed_origins = [wrong]
            with pytest.raises(HttpBindError, match="is not an origin"):
                await start_http(Application(server.runtime), "127.0.0.1:0")


# --- 5. TLS ----------------------------------------------------------------------------------


async def test_tls_serves_https_and_wss_and_nothing_in_plain_text(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    async with face(tmp_path, trust=trust, tls_cert=cert, tls_key=key) as http:
        assert (await http.client.get("/healthz")).status == 200
        created = await http.client.post("/sessions", json={"session_id": "secure"})
        assert created.status == 201
        async with http.client.ws_connect("/ws") as ws:  # wss://, from the https base URL
            await ws.send_json({"method": "health_check", "id": 1})
            assert (await ws.receive_json(timeout=5))["result"]["status"] == "STATUS_HEALTHY"
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientError):
                await plain.get(f"http://127.0.0.1:{http.port}/healthz")
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await plain.get(f"https://127.0.0.1:{http.port}/healthz")  # not trusting the certificate


# --- 6. the connection cap and the header timeout (in process; the flood is test_http_flood) --


async def _closed_by_server(reader: asyncio.StreamReader, within_s: float = 10.0) -> bytes:
    """Everything the server sent until it closed the connection; fails if it never does."""
    received = b""
    try:
        async with asyncio.timeout(within_s):
            while chunk := await reader.read(65536):
                received += chunk
    except ConnectionResetError:
        pass
    return received


async def test_connections_over_the_cap_are_turned_away_until_idle_ones_time_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="a3s_agent.security")
    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 1.0)
    async with face(tmp_path, max_http_connections=3) as http:
        idle = [await asyncio.open_connection("127.0.0.1", http.port) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
        turned_away = await _closed_by_server(reader)
        writer.close()
        assert turned_away.startswith(b"HTTP/1.1 503 ") and b'"code":"UNAVAILABLE"' in turned_away
        for idle_reader, idle_writer in idle:  # closed by the server for sending no request
            assert await _closed_by_server(idle_reader) == b""
            idle_writer.close()
        assert (await http.client.get("/healthz")).status == 200
    assert "refused HTTP connection from 127.0.0.1: 3 HTTP connections are open" in caplog.text
    assert "no complete request headers within 1 s" in caplog.text


async def test_slow_headers_are_cut_off_but_a_quiet_websocket_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 0.5)
    async with face(tmp_path) as http:
        reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for _ in range(200):  # slowloris: a byte of one more header line every 50 ms, for 10 s at most
            try:
                writer.write(b"X")
                await writer.drain()
                closed = await asyncio.wait_for(reader.read(1), 0.05) == b""
            except TimeoutError:
                continue
            except ConnectionError:
                closed = True
            if closed:
                break
        writer.close()
        assert closed, "a connection trickling its headers was never closed"
        async with http.client.ws_connect("/ws") as ws:
            await asyncio.sleep(1.0)  # quiet for twice the header timeout: it sent its headers long ago
            await ws.send_json({"method": "health_check", "id": 1})
            assert (await ws.receive_json(timeout=5))["result"]["status"] == "STATUS_HEALTHY"


async def test_tls_handshakes_count_against_the_cap_and_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 1.0)
    cert, key = _self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    async with face(tmp_path, trust=trust, tls_cert=cert, tls_key=key, max_http_connections=2) as http:
        silent = [await asyncio.open_connection("127.0.0.1", http.port) for _ in range(2)]  # no handshake
        with pytest.raises(aiohttp.ClientError):
            await http.client.get("/healthz")
        for reader, writer in silent:
            assert await _closed_by_server(reader) == b""
            writer.close()
        assert (await http.client.get("/healthz")).status == 200


# --- 7. bad input never answers 500 -----------------------------------------------------------

HOSTILE_BODIES = {
    "100,000 [": b"[" * 100_000,
    "100,000 {": b'{"a":' * 100_000,
    "nested just below the parser's limit": b'{"path":' + b"[" * 900 + b"]" * 900 + b"}",
    "a lone surrogate": b'{"session_id":"\\ud800"}',
    "a lone surrogate as a key": b'{"\\udc00":"x"}',
    "a lone surrogate deep inside": b'{"messages":[{"role":"ROLE_USER","content":"ok \\udfff"}]}',
    "not UTF-8": b'{"session_id":"\xff\xfe"}',
    "surrogate bytes": b'{"session_id":"\xed\xa0\x80"}',
}


async def test_hostile_json_is_a_400_on_every_json_route(tmp_path: Path) -> None:
    async with face(tmp_path) as http:
        session = await new_session(http.server)
        routes = [
            "/sessions",
            f"/sessions/{session}/generate",
            f"/sessions/{session}/generate/stream",
            f"/sessions/{session}/tools/read_file",
            "/rpc/create_session",
            "/rpc/stream_generate",
            "/rpc/check_permission",
        ]
        for route in routes:
            for name, body in HOSTILE_BODIES.items():
                reply = await http.client.post(route, data=body, headers=JSON)
                assert reply.status == 400, (route, name, await reply.text())
                await error_of(reply, 400, "INVALID_ARGUMENT")
        assert await session_ids(http.server) == {session}


async def test_hostile_json_on_the_websocket_is_an_error_reply_and_the_socket_stays(tmp_path: Path) -> None:
    async with face(tmp_path) as http, http.client.ws_connect("/ws") as ws:
        frames = [
            "[" * 100_000,
            '{"method":"create_session","params":' + "[" * 100_000,
            '{"method":"create_session","params":{"session_id":"\\ud800"},"id":1}',
            '{"method":"health_check","id":"\\udc00"}',
            '{"method":"create_session","params":{"config":{"system_prompt":"'
            + "\\ud83d" * 3
            + '"}},"id":2}',
        ]
        for frame in frames:
            await ws.send_str(frame)
            reply = await ws.receive_json(timeout=10)
            assert reply["error"]["code"] == "INVALID_ARGUMENT", reply
            await ws.send_json({"method": "health_check", "id": "next"})
            answer = await ws.receive_json(timeout=10)
            assert answer["id"] == "next" and answer["result"]["status"] == "STATUS_HEALTHY"
        assert await session_ids(http.server) == set()


async def test_hostile_json_is_a_400_on_the_spaces_routes(workspace: Path, tmp_path: Path) -> None:
    async with spaces_server(workspace, tmp_path / "data") as served:
        async with served.http.post("/v1/spaces", json={"policy": "standard"}) as reply:
            space = (await reply.json())["spaceId"]
        hostile = {
            **HOSTILE_BODIES,
            "a lone surrogate in a file's content": b'{"protocolVersion":"1.0","operations":'
            b'[{"type":"createFile","id":"a","path":"x.txt","content":"\\ud800"}]}',
        }
        for route in ("/v1/spaces", f"/v1/spaces/{space}/runs"):
            for name, body in hostile.items():
                async with served.http.post(route, data=body, headers=JSON) as reply:
                    if name == "nested just below the parser's limit":  # valid JSON: /v1/spaces ignores it
                        assert reply.status < 500, (route, name, await reply.text())
                        continue
                    assert reply.status == 400, (route, name, await reply.text())
                    await error_of(reply, 400, "INVALID_ARGUMENT")
        assert not (workspace / "x.txt").exists()


async def test_an_allowed_origin_may_send_and_read_the_a3s_call_metadata(tmp_path: Path) -> None:
    """The a3s-* request headers (budget, paging, ...) pass a preflight, and a page's script may read
    the a3s-* reply headers; a foreign origin gets neither."""
    async with face(tmp_path, allowed_origins=["https://App.example:443/"], auth_token=TOKEN) as http:
        ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "a3s-token-budget"}
        preflight = await http.client.options("/sessions", headers={"Origin": APP, **ask})
        allowed = set(preflight.headers["Access-Control-Allow-Headers"].split(", "))
        assert {"a3s-token-budget", "a3s-page-size", "a3s-page-token", "a3s-config-mode"} <= allowed
        browser = {"Origin": APP, "Sec-Fetch-Site": "cross-site", "Authorization": f"Bearer {TOKEN}"}
        created = await http.client.post(
            "/sessions", json={"session_id": "budgeted"}, headers={**browser, "a3s-token-budget": "5000"}
        )
        assert created.status == 201
        exposed = {name.lower() for name in created.headers["Access-Control-Expose-Headers"].split(", ")}
        assert "a3s-token-budget" in exposed and created.headers["a3s-token-budget"] == "5000"
        foreign = await http.client.get(
            "/sessions/budgeted", headers={**browser, "Origin": "https://attacker.example"}
        )
        assert "Access-Control-Expose-Headers" not in foreign.headers
