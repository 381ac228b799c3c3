"""The sandbox's allow-list proxy (--sandbox-network allow:...), attacked through real clients: curl
and Python run with a grant's environment, as a sandboxed command is, and raw sockets for what
no polite client sends. Real servers listen on 127.0.0.1; made-up names get their addresses from
the `resolver` fixture (this process's resolver, which the proxy uses; there is no DNS here).
Loopback is refused by the address check, so the tests that reach a site allow private addresses
explicitly, as an operator would with A3S_FETCH_ALLOW_PRIVATE=1."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import random
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from a3s_agent.base.allow_list import AllowList
from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools.sandbox.proxy import Grant, ProxyLimits, SandboxProxy

from ..conftest import WITHIN_S, eventually
from ..test_proxies import Proxy as UpstreamProxy
from . import test_web_fetch
from .sites import Site
from .test_web_fetch import Resolver, _certificate

pytestmark = pytest.mark.security

resolver = test_web_fetch.resolver  # the fixture: DNS answers set by the test

LOOPBACK = "127.0.0.1"
PUBLIC = "93.184.215.14"  # an address the check lets through (nothing is dialled there)
CURL = shutil.which("curl")
needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed")


# ---------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("A3S_FETCH_ALLOW_PRIVATE", raising=False)


@pytest.fixture
async def proxies() -> AsyncIterator[Callable[..., SandboxProxy]]:
    made: list[SandboxProxy] = []

    def make(allowed: str, *, allow_private: bool = False, **limits: Any) -> SandboxProxy:
        proxy = SandboxProxy(
            AllowList.parse(allowed), allow_private=allow_private, limits=ProxyLimits(**limits)
        )
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        await proxy.close()


@pytest.fixture
async def site() -> AsyncIterator[tuple[Site, int]]:
    served = Site()
    port = await served.start()
    yield served, port
    await served.stop()


@pytest.fixture
async def tls_site(tmp_path: Path) -> AsyncIterator[tuple[Site, int, Path]]:
    ca_file, context = _certificate(tmp_path, "allowed.test")
    served = Site()
    port = await served.start(tls=context)
    yield served, port, ca_file
    await served.stop()


@contextlib.asynccontextmanager
async def tcp_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any],
) -> AsyncIterator[int]:
    server = await asyncio.start_server(handle, LOOPBACK, 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Sends back what it reads, and closes at the client's end of data."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def run(argv: list[str], env: Mapping[str, str]) -> tuple[int, str, str]:
    """A real client process with `env` (a grant's, as a sandboxed command gets it)."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        env={"PATH": os.environ.get("PATH", os.defpath), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def curl(env: Mapping[str, str], *args: str) -> tuple[int, str, str]:
    assert CURL is not None
    return await run([CURL, "-sS", "--max-time", "30", *args], env)


def credentials(grant: Grant) -> str:
    password = urlsplit(grant.url).password or ""
    return "Proxy-Authorization: Basic " + base64.b64encode(f"a3s:{password}".encode()).decode()


async def connect(proxy: SandboxProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert proxy.port is not None
    return await asyncio.open_connection(LOOPBACK, proxy.port)


async def ask(proxy: SandboxProxy, head: str) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a request head (CRLF lines, without the blank line) on a new connection; the proxy's
    answer head, and the connection (for a tunnel)."""
    reader, writer = await connect(proxy)
    writer.write(head.replace("\n", "\r\n").encode() + b"\r\n\r\n")
    async with asyncio.timeout(WITHIN_S):
        answer = await reader.readuntil(b"\r\n\r\n")
    return answer, reader, writer


async def answered(proxy: SandboxProxy, data: bytes) -> bytes:
    """Everything the proxy sends back to `data`, up to its close."""
    reader, writer = await connect(proxy)
    writer.write(data)
    async with asyncio.timeout(WITHIN_S):
        answer = await reader.read()
    writer.close()
    return answer


# ---------------------------------------------------------------- what it lets through


@needs_curl
async def test_a_command_reaches_an_allowed_host_over_plain_http(
    proxies: Callable[..., SandboxProxy], site: tuple[Site, int], resolver: Resolver
) -> None:
    served, port = site
    resolver.answers["allowed.test"] = lambda asked: LOOPBACK
    proxy = proxies(f"allowed.test:{port}", allow_private=True)
    assert proxy.port is None  # nothing listens before a call needs it
    grant = proxy.grant("session s1")
    code, out, err = await curl(grant.env(), "-d", "the body", f"http://allowed.test:{port}/page?q=1")
    assert (code, out) == (0, "POST /page?q=1 the body"), err
    (seen,) = served.requests
    assert seen["host"] == f"allowed.test:{port}" and seen["connection"] == "close"
    assert "proxy-authorization" not in seen  # the credential stops at the proxy
    assert resolver.calls["allowed.test"] == 1


@needs_curl
async def test_a_command_reaches_an_allowed_https_host_through_a_tunnel(
    proxies: Callable[..., SandboxProxy], tls_site: tuple[Site, int, Path], resolver: Resolver
) -> None:
    served, port, ca_file = tls_site
    resolver.answers["allowed.test"] = lambda asked: LOOPBACK
    grant = proxies(f"allowed.test:{port}", allow_private=True).grant("session s1")
    code, out, err = await curl(grant.env(), "--cacert", str(ca_file), f"https://allowed.test:{port}/secure")
    assert (code, out) == (0, "GET /secure "), err
    assert served.server_names == ["allowed.test"]  # TLS end to end, with the name's certificate


async def test_a_tunnel_carries_bytes_both_ways_intact_and_passes_on_the_end(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    resolver.answers["echo.test"] = lambda asked: LOOPBACK
    payload = random.Random(7).randbytes(6 * 1024 * 1024 + 123)
    async with tcp_server(echo) as port:
        proxy = proxies(f"echo.test:{port}", allow_private=True)
        grant = proxy.grant("session s1")
        answer, reader, writer = await ask(proxy, f"CONNECT echo.test:{port} HTTP/1.1\n{credentials(grant)}")
        assert answer.startswith(b"HTTP/1.1 200 ")

        async def send() -> None:
            for start in range(0, len(payload), 100_000):
                writer.write(payload[start : start + 100_000])
                await writer.drain()
            writer.write_eof()  # the echo server closes at this end, and the proxy passes that on

        async with asyncio.timeout(60):
            _, received = await asyncio.gather(send(), reader.read())
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()


async def test_a_reader_that_stops_reading_holds_the_sender_back(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    """Backpressure: a destination sending without end to a client that reads nothing gets only
    as far as the buffers on the way, never the whole stream into the proxy's memory."""
    total, chunk = 256 * 1024 * 1024, bytes(1024 * 1024)
    sent = [0]

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while sent[0] < total:
                writer.write(chunk)
                await writer.drain()
                sent[0] += len(chunk)
        writer.close()

    resolver.answers["firehose.test"] = lambda asked: LOOPBACK
    async with tcp_server(firehose) as port:
        proxy = proxies(f"firehose.test:{port}", allow_private=True)
        grant = proxy.grant("session s1")
        answer, _, writer = await ask(proxy, f"CONNECT firehose.test:{port} HTTP/1.1\n{credentials(grant)}")
        assert answer.startswith(b"HTTP/1.1 200 ")
        seen = [-1]

        async def stalled() -> bool:
            before, seen[0] = seen[0], sent[0]
            await asyncio.sleep(0.3)
            return sent[0] == before == seen[0] and sent[0] > 0

        await eventually(stalled, "the sender to stall", within_s=60)
        assert sent[0] < total // 2, f"{sent[0]} bytes went into the proxy for a client that read none"
        writer.close()


# ---------------------------------------------------------------- what it refuses


@needs_curl
async def test_a_host_not_on_the_list_is_refused_with_403_naming_it(
    proxies: Callable[..., SandboxProxy],
    site: tuple[Site, int],
    resolver: Resolver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    served, port = site
    for name in ("allowed.test", "other.test"):
        resolver.answers[name] = lambda asked: LOOPBACK
    grant = proxies(f"allowed.test:{port}", allow_private=True).grant("session s1")
    with caplog.at_level(logging.WARNING, logger="a3s_agent.security"):
        code, out, err = await curl(grant.env(), "-w", " %{http_code}", f"http://other.test:{port}/")
        assert code == 0 and out.endswith(" 403"), err
        assert "other.test is not one of the hosts the sandbox allows" in out
        code, out, err = await curl(grant.env(), f"https://other.test:{port}/")
        assert code != 0 and "403" in err  # curl does not show a CONNECT answer's body
    assert served.requests == []
    assert list(grant.refused) == [
        f"GET other.test:{port}: other.test is not one of the hosts the sandbox allows",
        f"CONNECT other.test:{port}: other.test is not one of the hosts the sandbox allows",
    ]
    assert f"sandbox proxy refused CONNECT other.test:{port} of session s1" in caplog.text


async def test_a_python_client_is_told_why_it_was_refused(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    """pip and requests show the status line of a refused CONNECT: it carries the reason."""
    grant = proxies("allowed.test").grant("session s1")
    fetch = "import urllib.request; urllib.request.urlopen('https://other.test/', timeout=30)"
    code, _, err = await run([sys.executable, "-I", "-c", fetch], grant.env())
    assert code != 0 and "Tunnel connection failed: 403 other.test is not one of the hosts" in err


@pytest.mark.parametrize(
    ("allowed", "target", "reason"),
    [
        ("allowed.test", "allowed.test:22", "allowed.test is allowed on port 80, 443, not 22"),
        ("allowed.test:8443", "allowed.test:443", "allowed.test is allowed on port 8443, not 443"),
        ("*.example.test", "example.test:443", "example.test is not one of the hosts"),
        ("*.example.test", "evilexample.test:443", "evilexample.test is not one of the hosts"),
        ("example.test", "api.example.test:443", "api.example.test is not one of the hosts"),
    ],
)
async def test_connect_outside_the_list_is_refused(
    proxies: Callable[..., SandboxProxy], allowed: str, target: str, reason: str
) -> None:
    proxy = proxies(allowed, allow_private=True)
    grant = proxy.grant("session s1")
    answer = await answered(proxy, f"CONNECT {target} HTTP/1.1\r\n{credentials(grant)}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403 ") and reason.encode() in answer


async def test_a_session_narrows_the_operators_list_and_cannot_widen_it(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    resolver.answers["a.test"] = lambda asked: PUBLIC
    proxy = proxies("a.test,b.test")
    narrowed = proxy.grant("session s1", AllowList.parse("b.test,c.test"))
    for host in ("a.test", "c.test"):
        answer = await answered(
            proxy, f"CONNECT {host}:443 HTTP/1.1\r\n{credentials(narrowed)}\r\n\r\n".encode()
        )
        assert answer.startswith(b"HTTP/1.1 403 ") and f"{host} is not one of the hosts".encode() in answer


async def test_names_of_private_loopback_or_metadata_addresses_are_refused(
    proxies: Callable[..., SandboxProxy], site: tuple[Site, int], resolver: Resolver
) -> None:
    served, port = site
    resolver.answers["metadata.test"] = lambda asked: "169.254.169.254"
    resolver.answers["internal.test"] = lambda asked: LOOPBACK
    resolver.answers["corp.test"] = lambda asked: "10.1.2.3"
    proxy = proxies(f"metadata.test,internal.test:{port},corp.test,127.0.0.1:{port}")
    grant = proxy.grant("session s1")
    for request, why in [
        ("CONNECT metadata.test:443", "metadata.test resolves to 169.254.169.254, a link-local address"),
        (f"GET http://internal.test:{port}/", f"internal.test resolves to {LOOPBACK}, a loopback address"),
        ("CONNECT corp.test:443", "corp.test resolves to 10.1.2.3, a special-purpose address"),
        (f"CONNECT 127.0.0.1:{port}", "127.0.0.1 is a loopback address"),
    ]:
        answer = await answered(proxy, f"{request} HTTP/1.1\r\n{credentials(grant)}\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 403 ") and why.encode() in answer, answer
        assert b"A3S_FETCH_ALLOW_PRIVATE=1" in answer
    assert served.requests == []


@needs_curl
async def test_the_connection_goes_to_the_address_that_was_checked(
    proxies: Callable[..., SandboxProxy], site: tuple[Site, int], resolver: Resolver
) -> None:
    """DNS rebinding: the name is public when checked and loopback when asked again; the proxy
    never asks again, so the connection goes to the public address (which does not answer here)."""
    served, port = site
    resolver.answers["rebind.test"] = lambda asked: PUBLIC if asked == 0 else LOOPBACK
    grant = proxies(f"rebind.test:{port}", connect_timeout_s=3).grant("session s1")
    code, out, err = await curl(grant.env(), "-w", "%{http_code}", f"http://rebind.test:{port}/")
    assert code == 0 and out.endswith(("502", "504")), (out, err)
    assert served.requests == [] and resolver.calls["rebind.test"] == 1


@needs_curl
async def test_only_a_live_grants_credential_gets_in(
    proxies: Callable[..., SandboxProxy],
    site: tuple[Site, int],
    resolver: Resolver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    served, port = site
    resolver.answers["allowed.test"] = lambda asked: LOOPBACK
    proxy = proxies(f"allowed.test:{port}", allow_private=True)
    grant, other = proxy.grant("session s1"), proxy.grant("session s2")
    url = f"http://allowed.test:{port}/"
    without = f"http://127.0.0.1:{proxy.port}"
    wrong = f"http://a3s:not-the-token@127.0.0.1:{proxy.port}"
    with caplog.at_level(logging.WARNING, logger="a3s_agent.security"):
        for proxy_url in (without, wrong):
            code, out, err = await curl({}, "-x", proxy_url, "-w", " %{http_code}", url)
            assert code == 0 and out.endswith(" 407"), err
        grant.close()
        code, out, err = await curl(grant.env(), "-w", " %{http_code}", url)
        assert code == 0 and out.endswith(" 407"), err
        code, out, err = await curl(other.env(), url)
        assert (code, out) == (0, "GET / "), err
    assert len(served.requests) == 1
    assert f"refused GET {url} of a client without valid credentials" in caplog.text
    answer = await answered(proxy, f"GET {url} HTTP/1.1\r\n\r\n".encode())
    assert b'\r\nProxy-Authenticate: Basic realm="a3s-agent sandbox"\r\n' in answer


async def test_oversized_request_heads_are_refused(proxies: Callable[..., SandboxProxy]) -> None:
    proxy = proxies("allowed.test", head_bytes=8192)
    grant = proxy.grant("session s1")
    head = f"CONNECT allowed.test:443 HTTP/1.1\r\n{credentials(grant)}\r\nX-Big: {'a' * 20000}\r\n\r\n"
    answer = await answered(proxy, head.encode())
    assert answer.startswith(b"HTTP/1.1 431 ") and b"longer than 8192 bytes" in answer


async def test_a_slow_client_is_closed_after_the_head_timeout(proxies: Callable[..., SandboxProxy]) -> None:
    """Slowloris: a byte of the head now and then never keeps the connection open past the timeout."""
    proxy = proxies("allowed.test", head_timeout_s=0.5)
    proxy.grant("session s1")
    reader, writer = await connect(proxy)
    writer.write(b"GET http://allowed.test/ HTTP/1.1\r\nX-Slow: ")

    async def dribble() -> None:
        with contextlib.suppress(OSError):
            while True:
                writer.write(b"a")
                await writer.drain()
                await asyncio.sleep(0.05)

    dribbling = asyncio.create_task(dribble())
    try:
        async with asyncio.timeout(WITHIN_S):
            answer = await reader.read()
    finally:
        dribbling.cancel()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive in time" in answer


@pytest.mark.parametrize(
    ("request_line", "more", "reason"),
    [
        (b"GET /page HTTP/1.1", b"", b"send http://host/path requests"),
        (b"GET https://allowed.test/ HTTP/1.1", b"", b"use CONNECT for https"),
        (b"CONNECT allowed.test HTTP/1.1", b"", b"CONNECT needs host:port"),
        (b"CONNECT allowed.test:99999 HTTP/1.1", b"", b"CONNECT needs host:port"),
        (b"CONNECT allowed.test%00.evil:443 HTTP/1.1", b"", b"CONNECT needs host:port"),
        (b"GET http://allowed.test:x/ HTTP/1.1", b"", b"the URL's port is not a number"),
        (b"GET http://a_b c/ HTTP/1.1", b"", b"the request line is not"),
        (b"GET http://allowed.test/ HTTP/2", b"", b"the request line is not"),
        (b"GET http://allowed.test/ HTTP/1.1", b"\r\n folded: header", b"a header line is malformed"),
        (b"GET http://allowed.test/ HTTP/1.1", b"\r\nBad\nHeader: x", b"a header line is malformed"),
    ],
)
async def test_malformed_requests_get_400(
    proxies: Callable[..., SandboxProxy], request_line: bytes, more: bytes, reason: bytes
) -> None:
    proxy = proxies("allowed.test")
    grant = proxy.grant("session s1")
    answer = await answered(proxy, request_line + b"\r\n" + credentials(grant).encode() + more + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and reason in answer


async def test_connections_are_capped_in_all_and_per_grant(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    resolver.answers["echo.test"] = lambda asked: LOOPBACK
    async with tcp_server(echo) as port:
        proxy = proxies(f"echo.test:{port}", allow_private=True, connections=3, connections_per_grant=2)
        first, second = proxy.grant("session s1"), proxy.grant("session s2")
        connect_to = f"CONNECT echo.test:{port} HTTP/1.1\n"
        tunnels = [await ask(proxy, connect_to + credentials(first)) for _ in range(2)]
        over, *_ = await ask(proxy, connect_to + credentials(first))
        assert over.startswith(b"HTTP/1.1 503 ") and b"2 connections of this command" in over
        tunnels.append(await ask(proxy, connect_to + credentials(second)))
        assert all(answer.startswith(b"HTTP/1.1 200 ") for answer, _, _ in tunnels)
        over, *_ = await ask(proxy, connect_to + credentials(second))
        assert over.startswith(b"HTTP/1.1 503 ") and b"3 connections are open already" in over
        tunnels[0][2].close()

        async def admitted() -> bool:
            answer, _, writer = await ask(proxy, connect_to + credentials(second))
            writer.close()
            return answer.startswith(b"HTTP/1.1 200 ")

        await eventually(admitted, "a connection to be admitted once one closed")
        for _, _, writer in tunnels:
            writer.close()


async def test_the_default_caps_keep_the_proxy_within_the_servers_reserve_of_open_files(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    """32 connections in all (64 open files of the 256 the server keeps beside its listeners), 16
    per grant."""
    resolver.answers["echo.test"] = lambda asked: LOOPBACK
    async with tcp_server(echo) as port:
        proxy = proxies(f"echo.test:{port}", allow_private=True)
        grants = [proxy.grant(f"session s{n}") for n in range(3)]
        connect_to = f"CONNECT echo.test:{port} HTTP/1.1\n"
        tunnels = [await ask(proxy, connect_to + credentials(grants[0])) for _ in range(16)]
        over, *_ = await ask(proxy, connect_to + credentials(grants[0]))
        assert over.startswith(b"HTTP/1.1 503 ") and b"16 connections of this command" in over
        tunnels += [await ask(proxy, connect_to + credentials(grants[1])) for _ in range(16)]
        assert all(answer.startswith(b"HTTP/1.1 200 ") for answer, _, _ in tunnels)
        over, *_ = await ask(proxy, connect_to + credentials(grants[2]))
        assert over.startswith(b"HTTP/1.1 503 ") and b"32 connections are open already" in over
        for _, _, writer in tunnels:
            writer.close()


async def test_an_idle_tunnel_is_closed(proxies: Callable[..., SandboxProxy], resolver: Resolver) -> None:
    resolver.answers["echo.test"] = lambda asked: LOOPBACK
    async with tcp_server(echo) as port:
        proxy = proxies(f"echo.test:{port}", allow_private=True, idle_timeout_s=0.5)
        grant = proxy.grant("session s1")
        answer, reader, writer = await ask(proxy, f"CONNECT echo.test:{port} HTTP/1.1\n{credentials(grant)}")
        assert answer.startswith(b"HTTP/1.1 200 ")
        writer.write(b"ping")
        async with asyncio.timeout(WITHIN_S):
            assert await reader.readexactly(4) == b"ping"
            assert await reader.read() == b""  # then nothing moves, and the proxy closes it
        writer.close()


async def test_closing_a_grant_or_the_proxy_ends_its_connections(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    resolver.answers["echo.test"] = lambda asked: LOOPBACK
    async with tcp_server(echo) as port:
        proxy = proxies(f"echo.test:{port}", allow_private=True)
        first, second = proxy.grant("session s1"), proxy.grant("session s2")
        connect_to = f"CONNECT echo.test:{port} HTTP/1.1\n"
        _, first_reader, _ = await ask(proxy, connect_to + credentials(first))
        _, second_reader, second_writer = await ask(proxy, connect_to + credentials(second))
        first.close()
        async with asyncio.timeout(WITHIN_S):
            assert await first_reader.read() == b""
        second_writer.write(b"still here")
        async with asyncio.timeout(WITHIN_S):
            assert await second_reader.readexactly(10) == b"still here"
        await proxy.close()
        async with asyncio.timeout(WITHIN_S):
            assert await second_reader.read() == b""
        with pytest.raises(ConnectionRefusedError):
            await connect(proxy)


async def test_a_socket_handed_over_is_served_with_the_same_rules(
    proxies: Callable[..., SandboxProxy], resolver: Resolver
) -> None:
    """A listening socket made elsewhere (e.g. inside a sandbox's network namespace) and handed to
    the proxy: its connections need a grant's credential and reach only allowed hosts, as on its port."""
    resolver.answers["echo.test"] = lambda asked: LOOPBACK
    async with tcp_server(echo) as port:
        proxy = proxies(f"echo.test:{port}", allow_private=True)
        grant = proxy.grant("session s1")
        listening = socket.create_server((LOOPBACK, 0))
        handed = listening.getsockname()[1]
        await proxy.serve(listening)
        for head, status in [
            (f"CONNECT echo.test:{port} HTTP/1.1\r\n{credentials(grant)}", b"200"),
            (f"CONNECT echo.test:{port} HTTP/1.1", b"407"),
            (f"CONNECT other.test:443 HTTP/1.1\r\n{credentials(grant)}", b"403"),
        ]:
            reader, writer = await asyncio.open_connection(LOOPBACK, handed)
            writer.write(head.encode() + b"\r\n\r\n")
            async with asyncio.timeout(WITHIN_S):
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 " + status)
            writer.close()


# ---------------------------------------------------------------- through the server's own proxy


@needs_curl
async def test_the_servers_own_proxy_carries_the_traffic_with_its_credentials(
    proxies: Callable[..., SandboxProxy],
    tls_site: tuple[Site, int, Path],
    site: tuple[Site, int],
    resolver: Resolver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served, tls_port, ca_file = tls_site
    plain, port = site
    resolver.answers["allowed.test"] = lambda asked: PUBLIC  # checked here; the upstream proxy reaches it
    upstream = await UpstreamProxy({"allowed.test": LOOPBACK}, credentials="me:up-s3cret").start()
    try:
        monkeypatch.setenv("HTTPS_PROXY", f"http://me:up-s3cret@127.0.0.1:{upstream.port}")
        monkeypatch.setenv("HTTP_PROXY", f"http://me:up-s3cret@127.0.0.1:{upstream.port}")
        proxy = proxies(f"allowed.test:{tls_port},allowed.test:{port}")
        grant = proxy.grant("session s1")
        code, out, err = await curl(
            grant.env(), "--cacert", str(ca_file), f"https://allowed.test:{tls_port}/a"
        )
        assert (code, out) == (0, "GET /a "), err
        code, out, err = await curl(grant.env(), f"http://allowed.test:{port}/b")
        assert (code, out) == (0, "GET /b "), err
        upstream_credentials = "Basic " + base64.b64encode(b"me:up-s3cret").decode()
        assert upstream.requests == [
            ("CONNECT", f"allowed.test:{tls_port}", upstream_credentials),
            ("GET", f"http://allowed.test:{port}/b", upstream_credentials),
        ]
        assert "proxy-authorization" not in plain.requests[0] and served.server_names == ["allowed.test"]

        resolver.answers["allowed.test"] = lambda asked: "10.0.0.7"  # still checked before the upstream
        code, out, err = await curl(grant.env(), "-w", " %{http_code}", f"http://allowed.test:{port}/c")
        assert out.endswith(" 403") and "10.0.0.7" in out and len(upstream.requests) == 2, err

        resolver.answers["allowed.test"] = lambda asked: PUBLIC
        monkeypatch.setenv("HTTPS_PROXY", f"http://me:wrong-pass@127.0.0.1:{upstream.port}")
        answer = await answered(
            proxy, f"CONNECT allowed.test:{tls_port} HTTP/1.1\r\n{credentials(grant)}\r\n\r\n".encode()
        )
        assert answer.startswith(b"HTTP/1.1 502 ")
        assert f"the proxy http://127.0.0.1:{upstream.port} (HTTPS_PROXY) refused".encode() in answer
        assert b"407" in answer and b"wrong-pass" not in answer
    finally:
        await upstream.stop()


# ---------------------------------------------------------------- the operator's list


@pytest.mark.parametrize(
    ("text", "host", "ports"),
    [
        ("Example.COM.", "example.com", {80, 443}),
        ("example.com:8443, example.com", "example.com", {80, 443, 8443}),
        ("*.example.com", "a.b.example.com", {80, 443}),
        ("*.example.com", "example.com", set()),
        ("*", "anything.test", {80, 443}),
        ("[2001:DB8::1]:8080", "2001:db8::1", {8080}),
        ("192.0.2.1", "192.0.2.1", {80, 443}),
        ("example.com", "192.0.2.1", set()),
    ],
)
def test_allow_list_entries(text: str, host: str, ports: set[int]) -> None:
    assert AllowList.parse(text).ports(host) == ports


@pytest.mark.parametrize(
    "text",
    [
        "",
        " , ",
        "a b.com",
        "http://x.com",
        "2001:db8::1",
        "*.192.0.2.1",
        "x.com:0",
        "x.com:99999",
        "*x.com",
        "a..b",
    ],
)
def test_a_bad_allow_list_entry_is_named(text: str) -> None:
    with pytest.raises(InvalidArgument, match="the sandbox's allowed hosts") as refused:
        AllowList.parse(text)
    assert text.strip(" ,") in str(refused.value)
