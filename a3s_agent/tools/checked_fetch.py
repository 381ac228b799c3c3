"""Requests to URLs the agent was given, over httpx, each checked by the rules of fetcher.py.

Imported on a tool's first request, not at the server's start (httpx's import loads its command
line, and with it rich and pygments when they are installed: megabytes of memory kept for nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from ..base import telemetry
from ..base.proxies import Proxy
from .fetcher import USER_AGENT, checked_addresses, connection_problem, tool_proxy
from .registry import ToolFailure

MAX_REDIRECTS = 5

_SCHEMES = ("http", "https")


class CheckedTransport(httpx.AsyncBaseTransport):
    """Resolves each request's host once, checks the addresses, and dials only those addresses, or
    hands the request to the proxy the environment names for it."""

    def __init__(self, allow_private: bool) -> None:
        self._allow_private = allow_private
        # SSL_CERT_FILE / SSL_CERT_DIR still name the CA certificates, as for any httpx client.
        self._verify = httpx.create_ssl_context()
        self._http = httpx.AsyncHTTPTransport(verify=self._verify, trust_env=False)
        self._proxied: dict[str, httpx.AsyncHTTPTransport] = {}  # by proxy URL

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host = url.raw_host.decode("ascii")
        proxy = tool_proxy(str(url))
        if proxy is not None:
            return await self._through(proxy, host, request)
        failure: httpx.ConnectError | None = None
        for address in await checked_addresses(host, allow_private=self._allow_private):
            pinned = httpx.Request(
                request.method,
                url.copy_with(host=str(address)),
                headers=request.headers,  # with the Host header of the name
                stream=request.stream,
                extensions={**request.extensions, "sni_hostname": host},
            )
            try:
                return await self._http.handle_async_request(pinned)
            except httpx.ConnectError as exc:  # nothing sent yet: the next address may answer
                failure = exc
        assert failure is not None  # checked_addresses() returns at least one address
        raise failure

    async def _through(self, proxy: Proxy, host: str, request: httpx.Request) -> httpx.Response:
        if not self._allow_private:
            await checked_addresses(host, allow_private=False)
        transport = self._proxied.get(proxy.url)
        if transport is None:
            transport = self._proxied[proxy.url] = httpx.AsyncHTTPTransport(
                proxy=httpx.Proxy(proxy.url), verify=self._verify, trust_env=False
            )
        try:
            return await transport.handle_async_request(request)
        except (httpx.ConnectError, httpx.ProxyError) as exc:
            raise ToolFailure(
                f"could not reach {host} through {proxy.named}: {connection_problem(exc)}"
            ) from exc

    async def aclose(self) -> None:
        await self._http.aclose()
        for transport in self._proxied.values():
            await transport.aclose()


@dataclass
class Fetched:
    response: httpx.Response  # its body not read yet
    redirects: int


def _checked_url(url: httpx.URL | str, shown: str) -> httpx.URL:
    """`url` when it is an http(s) URL with a host; errors call it `shown`."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ToolFailure(f"{shown} is not a valid URL: {exc}") from exc
    if parsed.scheme not in _SCHEMES:
        raise ToolFailure(f"{shown} is not an http or https URL; only those can be fetched")
    if not parsed.raw_host:
        raise ToolFailure(f"{shown} has no host name")
    return parsed


@asynccontextmanager
async def fetch(
    method: str,
    url: str,
    *,
    allow_private: bool,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
    shown_url: str | None = None,
    **body: Any,
) -> AsyncIterator[Fetched]:
    """Request `url`, following at most MAX_REDIRECTS redirects, each checked like the first.

    `timeout_s` bounds everything, the caller's reading of the body included (TimeoutError).
    `body` is httpx's `content=` or `json=`. Errors name the URL as `shown_url` (a skill's URL
    template, since the real URL may carry a value from the environment); a redirect target is
    named as it is. Redirects keep httpx's rules: 301/302/303 turn a POST into a GET, and an
    Authorization header is not sent on to another origin.
    """
    shown = repr(shown_url if shown_url is not None else url)
    target = _checked_url(url, shown)
    # A client span (when tracing): the request, and the redirects httpx makes of it, carry its
    # traceparent. Its attributes name the host, never the URL (a skill's may hold a key).
    span = telemetry.start(
        method, {"http.request.method": method, "server.address": target.host}, kind="client"
    )
    headers = {**(headers or {}), **telemetry.headers(span)}
    status: int | None = None
    error: str | None = None
    try:
        async with _fetch(target, shown, method, allow_private, timeout_s, headers, body) as fetched:
            status = fetched.response.status_code
            yield fetched
    except BaseException as exc:
        error = type(exc).__qualname__
        raise
    finally:
        telemetry.end(span, {"http.response.status_code": status} if status is not None else None, error)


@asynccontextmanager
async def _fetch(
    target: httpx.URL,
    shown: str,
    method: str,
    allow_private: bool,
    timeout_s: float,
    headers: Mapping[str, str],
    body: dict[str, Any],
) -> AsyncIterator[Fetched]:
    async with (
        asyncio.timeout(timeout_s),
        httpx.AsyncClient(
            transport=CheckedTransport(allow_private),
            timeout=timeout_s,
            trust_env=False,
            headers={"User-Agent": USER_AGENT},
        ) as client,
    ):
        request = client.build_request(method, target, headers=headers, **body)
        for redirects in range(MAX_REDIRECTS + 1):
            response = await client.send(request, stream=True)
            try:
                if response.next_request is None:
                    yield Fetched(response, redirects)
                    return
                request = response.next_request
            finally:
                await response.aclose()  # a redirect's body is never read
            location = str(request.url)
            _checked_url(location, f"{shown} redirected to {location!r}, which")
        raise ToolFailure(f"{shown} redirected more than {MAX_REDIRECTS} times (last to {location}); gave up")


async def read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """At most max_bytes of the body, and whether there was more (which is left unread)."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            return bytes(body[:max_bytes]), True
    return bytes(body), False
