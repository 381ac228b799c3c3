"""web_search and web_fetch against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools import web as web_tools
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry

SEARCH_VARIABLES = (
    "A3S_SEARCH_PROVIDER",
    "A3S_SEARCH_URL",
    "A3S_SEARCH_API_KEY",
    "BRAVE_API_KEY",
    "TAVILY_API_KEY",
)

PARAGRAPH = (
    "<p>The quick brown fox jumps over the lazy dog near the "
    "<a href='https://example.org/river'>river bank</a> while the sun sets slowly behind the "
    "distant hills, and nobody in the valley notices anything at all.</p>"
)
ARTICLE = f"""<!doctype html><html><head><title>Fox story</title><script>var tracking = 1;</script></head>
<body><nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<article><h1>The fox</h1>{PARAGRAPH}<h2>Details</h2><ul><li>first point here</li><li>second point</li></ul>
<p>Later that evening the fox returned to its den, tired but satisfied with the long day.</p></article>
<footer>Copyright Footer Inc</footer></body></html>"""
IMAGE_ONLY = '<html><body><img src="diagram.png" alt="architecture diagram"></body></html>'

Call = Callable[..., Awaitable[ToolOutput]]


# ---------------------------------------------------------------- the test server


def _fixed(make: Callable[[], web.Response]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A handler answering every request with a fresh `make()`."""

    async def handler(request: web.Request) -> web.Response:
        return make()

    return handler


def _redirect_to(location: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        raise web.HTTPFound(location)

    return handler


async def _redirect_chain(request: web.Request) -> web.Response:
    left = int(request.match_info["left"])
    raise web.HTTPFound(f"/redirect/{left - 1}" if left > 0 else "/article")


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.Response(text="too late")


def _stream_forever(chunk: bytes, pause_s: float) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        while True:
            await response.write(chunk)
            await asyncio.sleep(pause_s)

    return handler


async def _searxng(request: web.Request) -> web.Response:
    query = request.query["q"]
    if request.query.get("format") != "json":
        return web.Response(status=403, text="format not allowed")
    results = [
        {"title": f"{query} result {n}", "url": f"https://example.com/{n}", "content": f"snippet {n}"}
        for n in range(1, 9)
    ]
    return web.json_response({"query": query, "results": results})


async def _brave(request: web.Request) -> web.Response:
    if request.headers.get("X-Subscription-Token") != "brave-key":
        return web.json_response({"error": {"detail": "invalid subscription token"}}, status=401)
    count = int(request.query["count"])
    results = [
        {
            "title": f"{request.query['q']} &amp; more {n}",
            "url": f"https://brave.example/{n}",
            "description": f"the <strong>best</strong> answer {n}",
        }
        for n in range(1, count + 1)
    ]
    return web.json_response({"type": "search", "web": {"results": results}})


async def _tavily(request: web.Request) -> web.Response:
    body = await request.json()
    if body.get("api_key") != "tavily-key":
        return web.json_response(
            {"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401
        )
    results = [
        {"title": f"Tavily {n}", "url": f"https://tavily.example/{n}", "content": body["query"]}
        for n in range(1, body["max_results"] + 1)
    ]
    return web.json_response({"query": body["query"], "results": results})


def _app() -> web.Application:
    app = web.Application()
    routes = app.router
    routes.add_get("/article", _fixed(lambda: web.Response(text=ARTICLE, content_type="text/html")))
    routes.add_get("/image-only", _fixed(lambda: web.Response(text=IMAGE_ONLY, content_type="text/html")))
    latin1 = "<html><body><p>Caf\u00e9 cr\u00e8me</p></body></html>".encode("latin-1")
    latin1_type = {"Content-Type": "text/html; charset=iso-8859-1"}
    routes.add_get("/latin1", _fixed(lambda: web.Response(body=latin1, headers=latin1_type)))
    routes.add_get("/plain", _fixed(lambda: web.Response(text="just <b>plain</b> text\n")))
    routes.add_get("/data.json", _fixed(lambda: web.json_response({"name": "a3s", "tags": ["x", "y"]})))
    png = b"\x89PNG\r\n\x1a\n" + bytes(64)
    routes.add_get("/logo.png", _fixed(lambda: web.Response(body=png, content_type="image/png")))
    routes.add_get("/redirect/{left}", _redirect_chain)
    routes.add_get("/loop", _redirect_to("/loop"))
    routes.add_get("/to-ftp", _redirect_to("ftp://example.com/file.txt"))
    routes.add_get("/boom", _fixed(lambda: web.Response(status=500, text="it broke")))
    routes.add_get("/slow{tail:.*}", _slow)
    routes.add_get("/drip", _stream_forever(b"x", 0.05))
    routes.add_get("/endless", _stream_forever(b"y" * 65536, 0))
    routes.add_get("/search", _searxng)
    routes.add_post("/search", _tavily)
    routes.add_get("/res/v1/web/search", _brave)
    routes.add_get("/not-json/search", _fixed(lambda: web.Response(text="<html>maintenance</html>")))
    routes.add_get("/endless/search", _stream_forever(b" " * 65536, 0))
    return app


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    test_server = TestServer(_app(), host="127.0.0.1", handler_cancellation=True)
    await test_server.start_server()
    yield test_server
    await test_server.close()


@pytest.fixture(autouse=True)
def _no_search_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's own environment must not leak a search backend into these tests."""
    for name in SEARCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def call(tmp_path: Path) -> Call:
    registry = ToolRegistry(web_tools.TOOLS)

    async def run(name: str, env: dict[str, str] | None = None, **args: Any) -> ToolOutput:
        # The test servers are on 127.0.0.1, which web_fetch refuses unless allowed.
        allowed = {"A3S_FETCH_ALLOW_PRIVATE": "1", **(env or {})}
        return await registry.run(name, json.dumps(args), ToolContext(workspace=tmp_path, env=allowed))

    return run


def url(server: TestServer, path: str) -> str:
    return str(server.make_url(path))


# ---------------------------------------------------------------- web_fetch: content


async def test_html_becomes_markdown_of_the_main_content(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/article"))
    assert result.success, result.error
    assert "# The fox" in result.output
    assert "[river bank](https://example.org/river)" in result.output
    assert "- first point here" in result.output
    assert "tracking" not in result.output and "Footer Inc" not in result.output
    assert result.metadata["status"] == 200
    assert result.metadata["content_type"].startswith("text/html")
    assert result.metadata["bytes"] == len(ARTICLE.encode())
    assert result.metadata["truncated"] is False


async def test_text_format_drops_markup(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/article"), format="text")
    assert result.success, result.error
    assert "river bank" in result.output
    assert "[river bank]" not in result.output and "#" not in result.output


async def test_html_format_returns_the_raw_page(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/article"), format="html")
    assert result.output == ARTICLE


async def test_page_trafilatura_finds_nothing_in_falls_back_to_markdownify(
    call: Call, server: TestServer
) -> None:
    result = await call("web_fetch", url=url(server, "/image-only"))
    assert result.success, result.error
    assert result.output == "![architecture diagram](diagram.png)"


async def test_charset_from_the_content_type_is_honoured(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/latin1"), format="text")
    assert result.output == "Caf\u00e9 cr\u00e8me"


@pytest.mark.parametrize("fmt", ["markdown", "text", "html"])
async def test_plain_text_is_returned_as_it_is(call: Call, server: TestServer, fmt: str) -> None:
    result = await call("web_fetch", url=url(server, "/plain"), format=fmt)
    assert result.output == "just <b>plain</b> text\n"


async def test_json_is_returned_as_text(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/data.json"))
    assert json.loads(result.output) == {"name": "a3s", "tags": ["x", "y"]}
    assert result.metadata["content_type"].startswith("application/json")


async def test_binary_content_is_refused(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/logo.png"))
    assert not result.success
    assert "image/png" in result.error and "cannot show" in result.error


async def _serve_raw(body: bytes) -> tuple[asyncio.Server, int]:
    """A server that answers every request with `body` and no Content-Type header."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    raw = await asyncio.start_server(answer, "127.0.0.1", 0)
    return raw, raw.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (ARTICLE.encode(), "# The fox"),
        (b"name,count\nfox,1\n", "name,count\nfox,1\n"),
    ],
)
async def test_a_body_without_content_type_is_sniffed(call: Call, body: bytes, expected: str) -> None:
    raw, port = await _serve_raw(body)
    async with raw:
        result = await call("web_fetch", url=f"http://127.0.0.1:{port}/")
    assert result.success, result.error
    assert expected in result.output


async def test_binary_body_without_content_type_is_refused(call: Call) -> None:
    raw, port = await _serve_raw(b"\x00\x01\x02binary")
    async with raw:
        result = await call("web_fetch", url=f"http://127.0.0.1:{port}/")
    assert not result.success and "binary" in result.error


# ---------------------------------------------------------------- web_fetch: limits


async def test_max_bytes_stops_reading_an_endless_body(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/endless"), max_bytes=50_000, timeout_ms=5000)
    assert result.success, result.error
    assert result.metadata["bytes"] == 50_000
    assert result.metadata["truncated"] is True
    assert result.output == "y" * 50_000 + "\n\n[body cut at max_bytes=50000; raise max_bytes to read more]"


async def test_a_slow_server_times_out(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/slow"), timeout_ms=200)
    assert not result.success
    assert result.error == f"fetching {url(server, '/slow')} timed out after 200 ms"


async def test_timeout_bounds_the_whole_download_not_each_read(call: Call, server: TestServer) -> None:
    started = time.monotonic()
    result = await call("web_fetch", url=url(server, "/drip"), timeout_ms=300)
    assert not result.success and "timed out after 300 ms" in result.error
    assert time.monotonic() - started < 2


# ---------------------------------------------------------------- web_fetch: redirects


async def test_redirects_are_followed(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/redirect/4"))
    assert result.success, result.error
    assert "# The fox" in result.output
    assert result.metadata["url"] == url(server, "/article")
    assert result.metadata["redirects"] == 5


async def test_more_than_five_redirects_fail(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/redirect/5"))
    assert not result.success and "more than 5 times" in result.error


async def test_a_redirect_loop_fails(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/loop"))
    assert not result.success and "redirected more than 5 times" in result.error


async def test_a_redirect_to_another_scheme_is_refused(call: Call, server: TestServer) -> None:
    result = await call("web_fetch", url=url(server, "/to-ftp"))
    assert not result.success
    assert result.error == (
        f"{url(server, '/to-ftp')!r} redirected to 'ftp://example.com/file.txt', which is not an http"
        " or https URL; only those can be fetched"
    )


# ---------------------------------------------------------------- web_fetch: errors


@pytest.mark.parametrize(
    ("path", "status", "words"), [("/missing", 404, "HTTP 404 Not Found"), ("/boom", 500, "HTTP 500")]
)
async def test_http_errors_name_the_status(
    call: Call, server: TestServer, path: str, status: int, words: str
) -> None:
    result = await call("web_fetch", url=url(server, path))
    assert not result.success
    assert result.error.startswith(words)
    assert result.metadata["status"] == status


@pytest.mark.parametrize("bad", ["file:///etc/passwd", "ftp://example.com/x", "example.com/page", "http://"])
async def test_only_http_urls_are_fetched(call: Call, bad: str) -> None:
    result = await call("web_fetch", url=bad)
    assert not result.success
    assert repr(bad) in result.error


async def test_unknown_host_is_reported(call: Call) -> None:
    result = await call("web_fetch", url="http://no-such-host.invalid/")
    assert not result.success and "could not resolve the host name" in result.error


async def test_refused_connection_is_reported(call: Call) -> None:
    with socket.socket() as bound_not_listening:
        bound_not_listening.bind(("127.0.0.1", 0))
        port = bound_not_listening.getsockname()[1]
        result = await call("web_fetch", url=f"http://127.0.0.1:{port}/")
    assert not result.success and "connection was refused" in result.error


@pytest.mark.parametrize(
    "args",
    [
        {"url": "http://x", "format": "pdf"},
        {"url": "http://x", "timeout_ms": 0},
        {"url": "http://x", "max_bytes": 20_000_001},
        {"url": "http://x", "follow": True},
        {},
    ],
)
async def test_bad_arguments_are_rejected(call: Call, args: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await call("web_fetch", **args)


# ---------------------------------------------------------------- web_search


async def test_searxng_is_used_when_only_its_url_is_set(call: Call, server: TestServer) -> None:
    result = await call(
        "web_search", env={"A3S_SEARCH_URL": url(server, "/")}, query="fox dens", max_results=3
    )
    assert result.success, result.error
    assert result.output == (
        "1. fox dens result 1\n   https://example.com/1\n   snippet 1\n\n"
        "2. fox dens result 2\n   https://example.com/2\n   snippet 2\n\n"
        "3. fox dens result 3\n   https://example.com/3\n   snippet 3"
    )
    assert result.metadata["provider"] == "searxng"
    assert result.metadata["count"] == 3
    assert result.metadata["results"][0] == {
        "title": "fox dens result 1",
        "url": "https://example.com/1",
        "snippet": "snippet 1",
    }


async def test_brave_sends_its_token_and_count(call: Call, server: TestServer) -> None:
    env = {"A3S_SEARCH_PROVIDER": "brave", "A3S_SEARCH_URL": url(server, ""), "BRAVE_API_KEY": "brave-key"}
    result = await call("web_search", env=env, query="grpc", max_results=2)
    assert result.success, result.error
    assert result.metadata["count"] == 2
    assert result.output.startswith("1. grpc & more 1\n   https://brave.example/1\n   the best answer 1")


async def test_a_rejected_key_is_reported_with_the_providers_answer(call: Call, server: TestServer) -> None:
    env = {"A3S_SEARCH_PROVIDER": "brave", "A3S_SEARCH_URL": url(server, ""), "A3S_SEARCH_API_KEY": "wrong"}
    result = await call("web_search", env=env, query="grpc")
    assert not result.success
    assert result.error.startswith("brave search answered HTTP 401 Unauthorized")
    assert "invalid subscription token" in result.error


async def test_tavily_posts_key_query_and_max_results(call: Call, server: TestServer) -> None:
    env = {
        "A3S_SEARCH_PROVIDER": "tavily",
        "A3S_SEARCH_URL": url(server, ""),
        "A3S_SEARCH_API_KEY": "tavily-key",
    }
    result = await call("web_search", env=env, query="pydantic v2", max_results=4)
    assert result.success, result.error
    assert [r["url"] for r in result.metadata["results"]] == [
        f"https://tavily.example/{n}" for n in range(1, 5)
    ]
    assert result.metadata["results"][0]["snippet"] == "pydantic v2"


async def test_the_servers_environment_is_read_after_the_sessions_env(
    call: Call, server: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A3S_SEARCH_URL", url(server, "/"))
    from_environment = await call("web_search", query="fox")
    assert from_environment.success and from_environment.metadata["provider"] == "searxng"
    overridden = await call("web_search", env={"A3S_SEARCH_URL": url(server, "/not-json")}, query="fox")
    assert not overridden.success and "not JSON" in overridden.error


async def test_not_configured_explains_how_to_configure(call: Call) -> None:
    result = await call("web_search", query="anything")
    assert not result.success
    assert result.error.startswith("web search is not configured")
    for name in SEARCH_VARIABLES:
        assert name in result.error


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"A3S_SEARCH_PROVIDER": "google"}, "must be one of: searxng, brave, tavily"),
        ({"A3S_SEARCH_PROVIDER": "searxng"}, "A3S_SEARCH_URL is not set"),
        ({"A3S_SEARCH_PROVIDER": "tavily"}, "set A3S_SEARCH_API_KEY or TAVILY_API_KEY"),
    ],
)
async def test_incomplete_configuration_says_what_is_missing(
    call: Call, env: dict[str, str], words: str
) -> None:
    result = await call("web_search", env=env, query="anything")
    assert not result.success and words in result.error


async def test_an_unreachable_backend_is_reported(call: Call) -> None:
    with socket.socket() as bound_not_listening:
        bound_not_listening.bind(("127.0.0.1", 0))
        port = bound_not_listening.getsockname()[1]
        result = await call("web_search", env={"A3S_SEARCH_URL": f"http://127.0.0.1:{port}"}, query="x")
    assert not result.success and "connection was refused" in result.error


async def test_a_slow_backend_times_out(
    call: Call, server: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_tools, "SEARCH_TIMEOUT_S", 0.2)
    result = await call("web_search", env={"A3S_SEARCH_URL": url(server, "/slow")}, query="x")
    assert not result.success and "did not answer within 0.2 s" in result.error


async def test_a_backend_reply_without_end_is_given_up_at_its_bound(call: Call, server: TestServer) -> None:
    result = await call("web_search", env={"A3S_SEARCH_URL": url(server, "/endless")}, query="x")
    assert not result.success
    assert f"answered more than {web_tools.MAX_SEARCH_REPLY_BYTES >> 20} MiB" in result.error


@pytest.mark.parametrize("args", [{"query": ""}, {"query": "x", "max_results": 21}, {"q": "x"}])
async def test_bad_search_arguments_are_rejected(call: Call, args: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await call("web_search", **args)


def test_tools_are_listed_as_web_queries() -> None:
    assert [(t.name, t.tags) for t in web_tools.TOOLS] == [
        ("web_search", ["web", "query"]),
        ("web_fetch", ["web", "query"]),
    ]
    assert web_tools.web_fetch.parameters_schema["properties"]["format"]["enum"] == [
        "markdown",
        "text",
        "html",
    ]


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("http://127.0.0.1:9/x", "127.0.0.1 is a loopback address"),
        ("http://localhost:9/", "localhost resolves to 127.0.0.1, a loopback address"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
        ("http://10.1.2.3/", "10.1.2.3 is a special-purpose address (IANA: 10.0.0.0/8, Private-Use)"),
        ("http://[::1]:9/", "::1 is a loopback address"),
    ],
)
async def test_private_addresses_are_refused_unless_allowed(call: Call, target: str, words: str) -> None:
    result = await call("web_fetch", {"A3S_FETCH_ALLOW_PRIVATE": "0"}, url=target)
    assert not result.success
    assert result.error == (
        f"{words}: only public addresses are fetched unless the server sets A3S_FETCH_ALLOW_PRIVATE=1"
    )
