"""HTTPS_PROXY / HTTP_PROXY / NO_PROXY for the model provider, web_fetch and web_search, with a real
proxy: a small one written here (CONNECT tunnels and absolute-form requests) on 127.0.0.1, which
reaches made-up host names by its own table, as a real proxy would by its DNS. Names that must
resolve on this machine get their answers from the `resolver` fixture (there is no DNS here)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest

from a3s_agent.base.errors import FailedPrecondition
from a3s_agent.base.proxies import proxy_for
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text

from .conftest import LiveServer, agent_settings, new_session, running, user
from .security import test_web_fetch
from .security.sites import Site
from .security.test_web_fetch import REFUSED, Resolver, _certificate, execute

resolver = test_web_fetch.resolver  # the fixture: DNS answers set by the test

VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@dataclass
class Proxy:
    """An HTTP proxy: CONNECT host:port is tunnelled, an absolute-form request forwarded (one per
    connection). `hosts` maps the names it can reach to addresses; it records each request's
    method, target and Proxy-Authorization, and asks for `credentials` (user:password) if set."""

    hosts: dict[str, str]
    credentials: str | None = None
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            method, target, _ = head.split("\r\n", 1)[0].split(" ", 2)
            lines = [line.partition(":") for line in head.split("\r\n")[1:] if line]
            headers = {name.strip().lower(): value.strip() for name, _, value in lines}
            authorization = headers.get("proxy-authorization")
            self.requests.append((method, target, authorization))
            wanted = f"Basic {base64.b64encode((self.credentials or '').encode()).decode()}"
            if self.credentials is not None and authorization != wanted:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
                writer.write(b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n\r\n')
                return
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                upstream = await asyncio.open_connection(self.hosts[host], int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                url = urlsplit(target)
                upstream = await asyncio.open_connection(self.hosts[url.hostname or ""], url.port or 80)
                kept = [f"{n}:{v}" for n, _, v in lines if not n.lower().startswith(("proxy-", "connection"))]
                path = url.path + (f"?{url.query}" if url.query else "")
                forwarded = [f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""]
                upstream[1].write("\r\n".join(forwarded).encode("latin-1"))
            await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer))
        except (KeyError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof() if writer.can_write_eof() else writer.close()


@pytest.fixture(autouse=True)
def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("A3S_FETCH_ALLOW_PRIVATE", raising=False)


@contextlib.asynccontextmanager
async def proxying(hosts: dict[str, str], credentials: str | None = None) -> AsyncIterator[Proxy]:
    proxy = await Proxy(hosts, credentials).start()
    try:
        yield proxy
    finally:
        await proxy.stop()


# ---------------------------------------------------------------- which proxy, from the environment


def test_the_variables_are_read_as_curl_reads_them() -> None:
    env = {"HTTPS_PROXY": "http://upper:3128", "https_proxy": "http://lower:3128", "HTTP_PROXY": "plain:8080"}
    found = proxy_for("https://api.example.com/v1", env)
    assert found is not None and (found.url, found.variable) == ("http://lower:3128", "https_proxy")
    found = proxy_for("http://api.example.com/v1", env)
    assert found is not None and (found.url, found.shown) == ("http://plain:8080", "http://plain:8080")
    assert proxy_for("https://api.example.com", {"HTTP_PROXY": "http://p:1"}) is None  # per scheme


@pytest.mark.parametrize(
    ("url", "no_proxy", "direct"),
    [
        ("https://api.example.com/", "*", True),
        ("https://api.example.com/", "example.com", True),
        ("https://api.example.com/", ".example.com", True),
        ("https://api.example.com/", "*.example.com", True),
        ("https://example.com/", ".example.com", True),
        ("https://notexample.com/", "example.com", False),
        ("https://api.example.com/", "api.example.com:443", True),
        ("https://api.example.com/", "api.example.com:8443", False),
        ("http://10.1.2.3:8080/", "10.0.0.0/8", True),
        ("http://10.1.2.3:8080/", "10.1.2.3", True),
        ("http://11.1.2.3/", "10.0.0.0/8, other.org", False),
        ("http://[2001:db8::1]:8080/", "[2001:db8::1]:8080", True),
        ("http://[2001:db8::1]/", "2001:db8::/32", True),
        ("http://localhost:11434/", "", True),  # loopback: never proxied
        ("http://127.0.0.2/", "", True),
        ("http://[::1]/", "", True),
        ("http://ollama.localhost/", "", True),
        ("https://api.example.com/", " , ,", False),
    ],
)
def test_no_proxy(url: str, no_proxy: str, direct: bool) -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "HTTP_PROXY": "http://proxy:3128", "NO_PROXY": no_proxy}
    assert (proxy_for(url, env) is None) == direct


def test_a_proxy_that_is_not_http_is_refused_without_showing_its_credentials() -> None:
    for value in ("socks5://user:pa55word@socks:1080", "http://user:pa55word@proxy:notaport", "http://"):
        with pytest.raises(FailedPrecondition, match="not an http:// proxy") as refused:
            proxy_for("https://api.example.com/", {"HTTPS_PROXY": value})
        assert "pa55word" not in str(refused.value) and "user" not in str(refused.value)
    found = proxy_for("https://x.org/", {"HTTPS_PROXY": "http://user:pa55word@proxy:3128"})
    assert found is not None and found.shown == "http://proxy:3128" and found.password == "pa55word"


# ---------------------------------------------------------------- the model provider


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@contextlib.asynccontextmanager
async def server_for(
    workspace: Path, data: Path, fake: FakeLLM, host: str, retries: int = 2, scheme: str = "http"
) -> AsyncIterator[tuple[LiveServer, str]]:
    settings = agent_settings(workspace, data)
    settings.llm_retries = retries
    async with running(settings) as server:
        base_url = f"{scheme}://{host}:{fake.port}/v1"
        await server.stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(llm=pb.LLMConfig(model="fake-model", base_url=base_url))
            )
        )
        yield server, await new_session(server)


async def ask(server: LiveServer, session: str) -> pb.GenerateResponse:
    return await server.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("hi")]))


async def test_provider_calls_go_through_the_proxy_with_its_credentials(
    workspace: Path, tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with proxying({"llm.test": "127.0.0.1"}, credentials="me:s3cret-proxy-pass") as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://me:s3cret-proxy-pass@127.0.0.1:{proxy.port}")
        async with server_for(workspace, tmp_path / "data", fake, "llm.test") as (server, session):
            fake.script(text("through the proxy"))
            reply = await ask(server, session)
    assert reply.message.content == "through the proxy"
    auth = f"Basic {base64.b64encode(b'me:s3cret-proxy-pass').decode()}"
    assert proxy.requests == [("POST", f"http://llm.test:{fake.port}/v1/chat/completions", auth)]
    assert fake.requests[0].headers.get("proxy-authorization") is None  # for the proxy only


async def test_a_proxy_refusing_the_credentials_is_reported_without_them(
    workspace: Path, tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        proxying({"llm.test": "127.0.0.1"}, credentials="me:right") as proxy,
        server_for(workspace, tmp_path / "data", fake, "llm.test") as (server, session),
    ):
        # (set once the test's gRPC channel is connected: grpc's client reads http_proxy too)
        monkeypatch.setenv("http_proxy", f"http://me:wrong-pass-word@127.0.0.1:{proxy.port}")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ask(server, session)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        f"the proxy http://127.0.0.1:{proxy.port} (http_proxy) refused the request (HTTP 407 Proxy"
        " Authentication Required): check the credentials in http_proxy"
    )
    assert fake.requests == []


async def test_a_tunnel_the_proxy_refuses_is_reported_without_the_credentials(
    workspace: Path, tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """https:// goes through CONNECT; aiohttp's own message for a refused one shows the proxy URL
    with its credentials, so the provider words it itself."""
    async with (
        proxying({"llm.test": "127.0.0.1"}, credentials="me:right") as proxy,
        server_for(workspace, tmp_path / "data", fake, "llm.test", scheme="https") as (server, session),
    ):
        monkeypatch.setenv("https_proxy", f"http://me:pw@127.0.0.1:{proxy.port}")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ask(server, session)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        f"the proxy http://127.0.0.1:{proxy.port} (https_proxy) refused the request (HTTP 407 Proxy"
        " Authentication Required): check the credentials in https_proxy"
    )
    assert [request[:2] for request in proxy.requests] == [("CONNECT", f"llm.test:{fake.port}")]


async def test_an_unreachable_proxy_is_named_without_its_credentials(
    workspace: Path, tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = await Proxy({}).start()
    await proxy.stop()  # nothing listens on its port any more
    monkeypatch.setenv("HTTP_PROXY", f"http://me:gone-pass-word@127.0.0.1:{proxy.port}")
    async with server_for(workspace, tmp_path / "data", fake, "llm.test", retries=0) as (server, session):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ask(server, session)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    message = failed.value.details()
    assert f"through the proxy http://127.0.0.1:{proxy.port} (HTTP_PROXY)" in message
    assert "gone-pass-word" not in message and "me:" not in message


async def test_no_proxy_and_loopback_addresses_bypass_the_proxy(
    workspace: Path, tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch, resolver: Resolver
) -> None:
    resolver.answers["llm.test"] = lambda asked: "127.0.0.1"
    async with proxying({"llm.test": "127.0.0.1"}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "other.org,.test")
        async with server_for(workspace, tmp_path / "data", fake, "llm.test") as (server, session):
            fake.script(text("direct"))
            assert (await ask(server, session)).message.content == "direct"
        monkeypatch.delenv("NO_PROXY")
        async with server_for(workspace, tmp_path / "data2", fake, "127.0.0.1") as (server, session):
            fake.script(text("direct too"))
            assert (await ask(server, session)).message.content == "direct too"
    assert proxy.requests == []
    assert resolver.calls["llm.test"] >= 1


# ---------------------------------------------------------------- web_fetch and web_search


@pytest.fixture
async def site() -> AsyncIterator[tuple[Site, int]]:
    page = Site("a public page")
    port = await page.start("127.0.0.1", 0)
    yield page, port
    await page.stop()


async def test_web_fetch_checks_the_name_here_then_asks_the_proxy_by_name(
    live: LiveServer, site: tuple[Site, int], resolver: Resolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    page, port = site
    resolver.answers["public.test"] = lambda asked: "93.184.216.34"  # public: the check passes
    async with proxying({"public.test": "127.0.0.1"}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        result = await execute(live, "web_fetch", url=f"http://public.test:{port}/page", format="text")
    assert result.success, result.error
    assert result.output == "a public page"
    assert proxy.requests == [("GET", f"http://public.test:{port}/page", None)]
    assert [(hit["path"], hit["host"]) for hit in page.requests] == [("/page", f"public.test:{port}")]
    assert resolver.calls["public.test"] == 1


async def test_https_goes_through_a_connect_tunnel_and_tls_still_checks_the_name(
    live: LiveServer, resolver: Resolver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file, context = _certificate(tmp_path, "public.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    page = Site("over TLS, through the proxy")
    port = await page.start("127.0.0.1", 0, tls=context)
    resolver.answers["public.test"] = resolver.answers["impostor.test"] = lambda asked: "93.184.216.34"
    try:
        async with proxying({"public.test": "127.0.0.1", "impostor.test": "127.0.0.1"}) as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            good = await execute(live, "web_fetch", url=f"https://public.test:{port}/", format="text")
            impostor = await execute(live, "web_fetch", url=f"https://impostor.test:{port}/")
    finally:
        await page.stop()
    assert good.success, good.error
    assert good.output == "over TLS, through the proxy"
    assert [request[:2] for request in proxy.requests] == [
        ("CONNECT", f"public.test:{port}"),
        ("CONNECT", f"impostor.test:{port}"),
    ]
    assert page.server_names == ["public.test", "impostor.test"]
    assert not impostor.success and "certificate verify failed" in impostor.error


@pytest.mark.parametrize(
    ("url", "answer", "words"),
    [
        (
            "http://internal.test/",
            "10.0.0.5",
            "internal.test resolves to 10.0.0.5, a special-purpose address (IANA: 10.0.0.0/8, Private-Use)",
        ),
        ("http://metadata.test/", "169.254.169.254", "a link-local address"),
        ("http://169.254.169.254/latest/meta-data/", None, "169.254.169.254 is a link-local address"),
        ("https://[::ffff:10.0.0.1]/", None, "(IANA: 10.0.0.0/8, Private-Use) (10.0.0.1) inside"),
    ],
)
async def test_a_proxy_never_gets_a_request_for_a_private_address(
    live: LiveServer,
    resolver: Resolver,
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    answer: str | None,
    words: str,
) -> None:
    host = urlsplit(url).hostname or ""
    if answer is not None:
        resolver.answers[host] = lambda asked: answer
    async with proxying({host: "127.0.0.1"}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        result = await execute(live, "web_fetch", url=url)
    assert not result.success
    assert words in result.error and REFUSED in result.error
    assert proxy.requests == []


async def test_a_name_this_machine_cannot_resolve_is_refused_unless_private_addresses_are_allowed(
    live: LiveServer, site: tuple[Site, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name only the proxy knows could be anything behind it; A3S_FETCH_ALLOW_PRIVATE=1 leaves the
    proxy to decide."""
    _, port = site
    async with proxying({"only-the-proxy-knows.invalid": "127.0.0.1"}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        url = f"http://only-the-proxy-knows.invalid:{port}/"
        refused = await execute(live, "web_fetch", url=url)
        assert proxy.requests == []
        await live.stub.Initialize(pb.InitializeRequest(env={"A3S_FETCH_ALLOW_PRIVATE": "1"}))
        allowed = await execute(live, "web_fetch", url=url, format="text")
    assert (
        not refused.success
        and "could not resolve the host name only-the-proxy-knows.invalid" in refused.error
    )
    assert allowed.success, allowed.error
    assert allowed.output == "a public page" and [r[1] for r in proxy.requests] == [url]


async def test_web_fetch_no_proxy_goes_direct_to_the_checked_address(
    live: LiveServer, site: tuple[Site, int], resolver: Resolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port = site
    resolver.answers["intranet.corp.test"] = lambda asked: "127.0.0.1"
    async with proxying({}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("no_proxy", "corp.test")
        await live.stub.Initialize(pb.InitializeRequest(env={"A3S_FETCH_ALLOW_PRIVATE": "1"}))
        result = await execute(live, "web_fetch", url=f"http://intranet.corp.test:{port}/", format="text")
    assert result.success, result.error
    assert result.output == "a public page" and proxy.requests == []


async def test_web_fetch_through_a_proxy_asking_for_credentials(
    live: LiveServer, site: tuple[Site, int], resolver: Resolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port = site
    resolver.answers["public.test"] = lambda asked: "93.184.216.34"
    async with proxying({"public.test": "127.0.0.1"}, credentials="me:open-sesame-42") as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://me:open-sesame-42@127.0.0.1:{proxy.port}")
        monkeypatch.setenv("HTTP_PROXY", f"http://me:open-sesame-42@127.0.0.1:{proxy.port}")
        good = await execute(live, "web_fetch", url=f"http://public.test:{port}/", format="text")
        monkeypatch.setenv("HTTPS_PROXY", f"http://me:wrong-sesame-42@127.0.0.1:{proxy.port}")
        bad = await execute(live, "web_fetch", url=f"https://public.test:{port}/")
        monkeypatch.setenv("HTTPS_PROXY", "socks5://me:open-sesame-42@127.0.0.1:1080")
        socks = await execute(live, "web_fetch", url=f"https://public.test:{port}/")
    assert good.success and good.output == "a public page"
    assert not bad.success
    assert bad.error.startswith(
        f"could not reach public.test through the proxy http://127.0.0.1:{proxy.port} (HTTPS_PROXY)"
    )
    assert "407" in bad.error
    assert not socks.success and "HTTPS_PROXY is socks5://127.0.0.1:1080, not an http:// proxy" in socks.error
    for result in (bad, socks):
        assert "sesame" not in result.error and "me:" not in result.error


async def test_web_search_goes_through_the_proxy(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    results = Site(json.dumps({"results": [{"title": "A", "url": "https://a.example/", "content": "a"}]}))
    port = await results.start("127.0.0.1", 0)
    try:
        async with proxying({"search.test": "127.0.0.1"}) as proxy:
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            monkeypatch.setenv("A3S_SEARCH_URL", f"http://search.test:{port}")
            found = await execute(live, "web_search", query="proxies")
    finally:
        await results.stop()
    assert found.success, found.error
    assert "https://a.example/" in found.output
    assert [r[:2] for r in proxy.requests] == [
        ("GET", f"http://search.test:{port}/search?q=proxies&format=json")
    ]
