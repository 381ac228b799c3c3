"""Web tools: searching through a configured backend, and fetching pages as markdown, text or HTML.

web_search reads its backend from the session's env, then the server's environment:
A3S_SEARCH_PROVIDER (searxng | brave | tavily), A3S_SEARCH_URL (the backend's base URL;
required for SearXNG, a proxy or test endpoint for the others) and A3S_SEARCH_API_KEY
(or BRAVE_API_KEY / TAVILY_API_KEY). web_fetch requests pages through tools/checked_fetch.py, which
fetches only public addresses and connects to exactly the address it checked. Both go through the
proxy the server's environment names (HTTPS_PROXY, HTTP_PROXY, NO_PROXY: base/proxies.py).
"""

from __future__ import annotations

import asyncio
import html
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..base.jsontext import model_json
from ..base.secrets import withheld
from .fetcher import USER_AGENT, connection_problem, decode, private_allowed, tool_proxy
from .registry import RuleSubject, Tool, ToolContext, ToolFailure, ToolOutput, tool

if TYPE_CHECKING:
    import httpx

SEARCH_TIMEOUT_S = 20.0
MAX_SEARCH_REPLY_BYTES = 4 << 20
"""A search backend's reply read beyond this is not read on: its results are the first few KiB."""

# ---------------------------------------------------------------- web_search

SearchProvider = Literal["searxng", "brave", "tavily"]

_DEFAULT_BASE_URLS: dict[SearchProvider, str] = {
    "brave": "https://api.search.brave.com",
    "tavily": "https://api.tavily.com",
}
_SEARCH_PATHS: dict[SearchProvider, str] = {
    "searxng": "/search",
    "brave": "/res/v1/web/search",
    "tavily": "/search",
}
_KEY_VARIABLES: dict[SearchProvider, str] = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}
_NOT_CONFIGURED = (
    "web search is not configured. Set, in the server's environment or the session's env, one of: "
    "A3S_SEARCH_URL (the base URL of a SearXNG instance, e.g. http://localhost:8080, with its JSON "
    "format enabled), BRAVE_API_KEY (Brave Search API) or TAVILY_API_KEY (Tavily). "
    "A3S_SEARCH_PROVIDER=searxng|brave|tavily picks the backend explicitly, A3S_SEARCH_API_KEY "
    "gives its key, and A3S_SEARCH_URL also overrides the Brave or Tavily base URL (for a proxy)."
)
_TAG = re.compile(r"<[^>]+>")


class WebSearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=400)
    max_results: int = Field(default=5, ge=1, le=20)


@dataclass(frozen=True)
class _SearchBackend:
    provider: SearchProvider
    endpoint: str
    api_key: str


def _setting(ctx: ToolContext, name: str) -> str:
    """A configuration value: the session's env first, then the server's environment (where its
    secrets, such as the search API keys, are withheld at start: server_secrets)."""
    return (ctx.env.get(name) or os.environ.get(name) or withheld(name)).strip()


def _chosen_provider(ctx: ToolContext) -> SearchProvider:
    explicit = _setting(ctx, "A3S_SEARCH_PROVIDER").lower()
    if explicit:
        if explicit not in _SEARCH_PATHS:
            raise ToolFailure(
                f"A3S_SEARCH_PROVIDER is {explicit!r}; it must be one of: {', '.join(_SEARCH_PATHS)}"
            )
        return explicit
    if _setting(ctx, "A3S_SEARCH_URL"):
        return "searxng"
    for provider, variable in _KEY_VARIABLES.items():
        if _setting(ctx, variable):
            return provider
    raise ToolFailure(_NOT_CONFIGURED)


def _search_backend(ctx: ToolContext) -> _SearchBackend:
    provider = _chosen_provider(ctx)
    base_url = _setting(ctx, "A3S_SEARCH_URL") or _DEFAULT_BASE_URLS.get(provider)
    if not base_url:
        raise ToolFailure(
            "A3S_SEARCH_PROVIDER is searxng but A3S_SEARCH_URL is not set; "
            "set it to the SearXNG base URL, e.g. http://localhost:8080"
        )
    api_key = _setting(ctx, "A3S_SEARCH_API_KEY")
    if provider in _KEY_VARIABLES:
        api_key = api_key or _setting(ctx, _KEY_VARIABLES[provider])
        if not api_key:
            raise ToolFailure(
                f"{provider} search needs an API key: set A3S_SEARCH_API_KEY or {_KEY_VARIABLES[provider]}"
            )
    return _SearchBackend(provider, base_url.rstrip("/") + _SEARCH_PATHS[provider], api_key)


def _query(client: httpx.AsyncClient, backend: _SearchBackend, query: str, max_results: int) -> httpx.Request:
    if backend.provider == "tavily":
        body = {"api_key": backend.api_key, "query": query, "max_results": max_results}
        return client.build_request("POST", backend.endpoint, json=body)
    if backend.provider == "brave":
        headers = {"X-Subscription-Token": backend.api_key, "Accept": "application/json"}
        params: dict[str, str | int] = {"q": query, "count": max_results}
        return client.build_request("GET", backend.endpoint, params=params, headers=headers)
    return client.build_request("GET", backend.endpoint, params={"q": query, "format": "json"})


def _plain(text: Any) -> str:
    """Snippets arrive with HTML highlighting (<strong>) and entities; keep only the text."""
    return " ".join(html.unescape(_TAG.sub("", str(text or ""))).split())


def _parse_results(provider: SearchProvider, data: Any) -> list[dict[str, str]]:
    """Title, url and snippet of each result, from the provider's JSON."""
    if not isinstance(data, dict):
        raise ToolFailure(f"{provider} search answered with JSON that is not an object")
    section = (data.get("web") or {}) if provider == "brave" else data
    items = section.get("results", []) if isinstance(section, dict) else None
    if not isinstance(items, list):
        raise ToolFailure(f"{provider} search answered with JSON without a results list")
    snippet_key = "description" if provider == "brave" else "content"
    return [
        {
            "title": _plain(item.get("title")),
            "url": str(item["url"]),
            "snippet": _plain(item.get(snippet_key)),
        }
        for item in items
        if isinstance(item, dict) and item.get("url")
    ]


def _format_results(results: list[dict[str, str]]) -> str:
    return "\n\n".join(
        f"{number}. {result['title'] or '(untitled)'}\n   {result['url']}"
        + (f"\n   {result['snippet']}" if result["snippet"] else "")
        for number, result in enumerate(results, start=1)
    )


@tool(
    "web_search",
    family="web",
    lane="query",
    truncation_hint="ask for fewer max_results",
    rule_subject=RuleSubject("query", "text"),
)
async def web_search(args: WebSearchArgs, ctx: ToolContext) -> ToolOutput:
    """Search the web: title, URL and snippet per result. For documentation, error messages and
    anything not in the workspace; web_fetch a page before relying on its details.
    """
    import httpx  # on first use: see tools/checked_fetch.py

    from .checked_fetch import read_capped

    backend = _search_backend(ctx)
    proxy = tool_proxy(backend.endpoint)
    try:
        async with httpx.AsyncClient(
            timeout=SEARCH_TIMEOUT_S,
            headers={"User-Agent": USER_AGENT},
            proxy=proxy.url if proxy else None,
            trust_env=False,  # proxies as base/proxies.py reads them, not as httpx does
            verify=httpx.create_ssl_context(),  # which still reads SSL_CERT_FILE / SSL_CERT_DIR
        ) as client:
            request = _query(client, backend, args.query, args.max_results)
            response = await client.send(request, stream=True)
            try:
                body, more = await read_capped(response, MAX_SEARCH_REPLY_BYTES)
            finally:
                await response.aclose()
    except httpx.TimeoutException as exc:
        raise ToolFailure(
            f"{backend.provider} search at {backend.endpoint} did not answer within {SEARCH_TIMEOUT_S:g} s"
        ) from exc
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ToolFailure(
            f"{backend.provider} search at {backend.endpoint} failed: {connection_problem(exc)}"
        ) from exc
    text = decode(body, response.charset_encoding)
    if response.is_error:
        raise ToolFailure(
            f"{backend.provider} search answered HTTP {response.status_code} {response.reason_phrase}: "
            f"{text[:300]}",
            status=response.status_code,
        )
    if more:
        raise ToolFailure(
            f"{backend.provider} search answered more than {MAX_SEARCH_REPLY_BYTES >> 20} MiB; gave up reading it"
        )
    try:
        data = model_json(text)
    except ValueError as exc:
        raise ToolFailure(f"{backend.provider} search answered with something that is not JSON") from exc
    results = _parse_results(backend.provider, data)[: args.max_results]
    output = _format_results(results) if results else f"No results for {args.query!r}."
    return ToolOutput(
        output=output,
        metadata={
            "provider": backend.provider,
            "query": args.query,
            "results": results,
            "count": len(results),
        },
    )


# ---------------------------------------------------------------- web_fetch

FetchFormat = Literal["markdown", "text", "html"]
_Kind = Literal["html", "text", "binary"]

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/ecmascript",
        "application/x-javascript",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-sh",
        "application/sql",
        "application/graphql",
    }
)
_ACCEPT = {
    "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.9,*/*;q=0.5",
}


class WebFetchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=8192)
    format: FetchFormat = Field(default="markdown", description="What an HTML page becomes.")
    timeout_ms: int = Field(default=30_000, ge=1, le=120_000)
    max_bytes: int = Field(default=5_000_000, ge=1, le=20_000_000)


@dataclass
class _Page:
    status: int
    url: str
    content_type: str
    kind: _Kind
    text: str
    size: int  # bytes of body read
    truncated: bool
    redirects: int


def _kind_of(media_type: str) -> _Kind | None:
    """What the Content-Type says the body is; None when the header is missing."""
    if not media_type:
        return None
    if media_type in _HTML_TYPES:
        return "html"
    if media_type.startswith("text/") or media_type in _TEXT_TYPES or media_type.endswith(("+json", "+xml")):
        return "text"
    return "binary"


def _sniff(body: bytes) -> _Kind:
    """The kind of a body served without a Content-Type."""
    head = body[:1024]
    if b"\x00" in head:
        return "binary"
    start = head.lstrip().lower()
    return "html" if start.startswith((b"<!doctype html", b"<html")) else "text"


async def _read_page(response: httpx.Response, max_bytes: int, redirects: int) -> _Page:
    url = str(response.url)
    if response.is_error:
        raise ToolFailure(
            f"HTTP {response.status_code} {response.reason_phrase} from {url}",
            status=response.status_code,
            url=url,
        )
    content_type = response.headers.get("content-type", "")
    media_type = content_type.split(";")[0].strip().lower()
    kind = _kind_of(media_type)
    if kind == "binary":
        raise ToolFailure(
            f"{url} is {media_type} content, which web_fetch cannot show; "
            "it fetches HTML and text (text/*, JSON, XML) only",
            status=response.status_code,
            url=url,
            content_type=content_type,
        )
    from .checked_fetch import read_capped

    body, truncated = await read_capped(response, max_bytes)
    kind = kind or _sniff(body)
    if kind == "binary":
        raise ToolFailure(f"{url} sent binary content without a Content-Type; web_fetch cannot show it")
    text = decode(body, response.charset_encoding)
    return _Page(response.status_code, url, content_type, kind, text, len(body), truncated, redirects)


def _readable(page_html: str, fmt: Literal["markdown", "text"], url: str) -> str:
    """Main content via trafilatura; markdownify for pages it finds nothing in (blocking: run in a thread).

    Both are imported here, on first use: together they cost the server's start-up half a second."""
    import trafilatura
    from markdownify import markdownify

    extracted = trafilatura.extract(
        page_html,
        url=url,
        output_format="markdown" if fmt == "markdown" else "txt",
        include_links=fmt == "markdown",
        include_formatting=fmt == "markdown",
        include_tables=True,
        favor_recall=True,
    )
    if extracted:
        return extracted
    stripped = ["a", "img"] if fmt == "text" else None
    return markdownify(page_html, heading_style="ATX", strip=stripped).strip()


@tool(
    "web_fetch",
    family="web",
    lane="query",
    truncation_hint='the page is longer than the output limit; format "text" is shorter',
    rule_subject=RuleSubject("url", "url"),
)
async def web_fetch(args: WebFetchArgs, ctx: ToolContext) -> ToolOutput:
    """Read a public http(s) URL: documentation, issues, raw files, JSON APIs. An HTML page comes
    back as the markdown of its main content; binary files are refused.
    """
    import httpx

    from .checked_fetch import fetch  # on first use, with httpx

    timeout_s = args.timeout_ms / 1000
    try:
        async with fetch(
            "GET", args.url, allow_private=private_allowed(ctx), timeout_s=timeout_s, headers=_ACCEPT
        ) as fetched:
            page = await _read_page(fetched.response, args.max_bytes, fetched.redirects)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise ToolFailure(f"fetching {args.url} timed out after {args.timeout_ms} ms") from exc
    except httpx.HTTPError as exc:
        raise ToolFailure(f"fetching {args.url} failed: {connection_problem(exc)}") from exc
    text = page.text
    if page.kind == "html" and args.format != "html":
        text = await asyncio.to_thread(_readable, text, args.format, page.url)
    if not text.strip():
        text = '(the page has no readable text; format "html" shows the raw page)'
    if page.truncated:
        text += f"\n\n[body cut at max_bytes={args.max_bytes}; raise max_bytes to read more]"
    metadata = {
        "status": page.status,
        "url": page.url,
        "content_type": page.content_type,
        "bytes": page.size,
        "truncated": page.truncated,
        "redirects": page.redirects,
    }
    return ToolOutput(output=text, metadata=metadata)


TOOLS: list[Tool] = [web_search, web_fetch]
