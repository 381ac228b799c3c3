"""The Streamable HTTP transport, with the server's headers and, for a URL the operator did not
configure, the request guard web_fetch uses (tools/fetcher.py): the host is resolved once, every
address must be public (unless A3S_FETCH_ALLOW_PRIVATE=1), and the connection goes to exactly an
address that was checked, so DNS rebinding cannot point it elsewhere. Such requests ignore the
environment's proxies (a proxy would resolve the name itself)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx2
from mcp.client import Transport
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_TIMEOUT, create_mcp_http_client

from ..fetcher import USER_AGENT, checked_addresses


class GuardedTransport(httpx2.AsyncBaseTransport):
    """Checks each request's host, then dials only the addresses it checked."""

    def __init__(self, allow_private: bool) -> None:
        self._allow_private = allow_private
        self._http = httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        host = request.url.raw_host.decode("ascii")
        addresses = await checked_addresses(host, allow_private=self._allow_private)
        failure: httpx2.ConnectError | None = None
        for address in addresses:
            pinned = httpx2.Request(
                request.method,
                request.url.copy_with(host=str(address)),
                headers=request.headers,  # with the Host header of the name
                stream=request.stream,
                extensions={**request.extensions, "sni_hostname": host},
            )
            try:
                return await self._http.handle_async_request(pinned)
            except httpx2.ConnectError as exc:  # nothing sent yet: the next address may answer
                failure = exc
        assert failure is not None  # checked_addresses returns at least one address
        raise failure

    async def aclose(self) -> None:
        await self._http.aclose()


def http_transport(
    url: str, headers: Mapping[str, str], *, guard: bool | None, timeout_s: float
) -> Transport:
    """The SDK's Streamable HTTP client for `url`; `guard` None sends requests as they are (the
    operator's URL), else through GuardedTransport, allowing private addresses when it is True."""
    all_headers = {"User-Agent": USER_AGENT, **headers}
    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=max(timeout_s, MCP_DEFAULT_TIMEOUT))
    if guard is None:
        client = create_mcp_http_client(headers=all_headers, timeout=timeout)
    else:
        client = httpx2.AsyncClient(
            headers=all_headers, timeout=timeout, transport=GuardedTransport(guard), trust_env=False
        )
    return _owning(client, url)


@asynccontextmanager
async def _owning(client: httpx2.AsyncClient, url: str) -> AsyncIterator[TransportStreams]:
    """The SDK's transport over `client`, closing the client after it (the SDK leaves a client it
    was given open)."""
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams
