"""The one way the agent requests a URL it was given: web_fetch and the http tools of skills.

Every request, the first and each redirect, goes through CheckedTransport: it resolves the host
name once, refuses the request unless every address is public (A3S_FETCH_ALLOW_PRIVATE=1 allows
the others), and then connects to exactly an address it checked. A DNS answer that changes
between the check and the connection (DNS rebinding) therefore cannot send the request anywhere
else. The Host header, the TLS server name (SNI) and the certificate check stay those of the URL's
host name. Proxies from the environment are not used: a proxy would resolve the name itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from .. import __version__
from .registry import ToolContext, ToolFailure

MAX_REDIRECTS = 5
USER_AGENT = f"a3s-agent/{__version__}"
ALLOW_PRIVATE = "A3S_FETCH_ALLOW_PRIVATE"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_SCHEMES = ("http", "https")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT
# IPv6 ranges whose last 32 bits are an IPv4 address (IPv4-mapped ::ffff:0:0/96 and 6to4 and
# Teredo have their own ipaddress properties).
_LAST_32_BITS_IPV4 = tuple(
    ipaddress.ip_network(net)
    for net in (
        "::/96",  # IPv4-compatible, ::a.b.c.d
        "::ffff:0:0:0/96",  # IPv4-translated, ::ffff:0:a.b.c.d
        "64:ff9b::/96",  # NAT64
    )
)
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")


def private_allowed(ctx: ToolContext) -> bool:
    """A3S_FETCH_ALLOW_PRIVATE=1 in the session's env or the server's environment."""
    value = ctx.env.get(ALLOW_PRIVATE, os.environ.get(ALLOW_PRIVATE, ""))
    return value.strip().lower() in {"1", "true", "yes"}


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries: mapped, compatible, translated, NAT64, 6to4, Teredo."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)  # the Teredo server and the client behind it
    if any(address in network for network in _LAST_32_BITS_IPV4):
        return [ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)]
    return []


def refusal(address: IPAddress) -> str | None:
    """What kind of non-public address `address` is, or None for a public unicast address.

    An IPv6 address that carries an IPv4 address is judged by the IPv4 address it carries."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64:
            return "a local-use NAT64 address"
        inner = _embedded_ipv4(address)
        for ipv4 in inner:
            reason = refusal(ipv4)
            if reason:
                return f"{reason} ({ipv4}) inside an IPv6 address"
        if inner:
            return None
        if address.is_site_local:
            return "a site-local address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if address.is_private:
        return "a private address"
    if address.is_reserved or not address.is_global:
        return "a reserved or special-purpose address"
    return None


def _literal(host: str) -> list[IPAddress]:
    """[the address] when `host` is an IP address in standard notation, else []."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        return []


async def _resolve(host: str) -> list[IPAddress]:
    """The addresses of `host`, in the resolver's order, each once. An IP literal is its own
    address; any other name (including `2130706433` or `0x7f.1`) goes to the system resolver."""
    literal = _literal(host)
    if literal:
        return literal
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolFailure(f"could not resolve the host name {host} ({exc.strerror or exc})") from exc
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses:
        raise ToolFailure(f"the host name {host} has no addresses")
    return list(dict.fromkeys(addresses))


def _check(host: str, addresses: list[IPAddress]) -> None:
    """Refuse the request unless every address of `host` is public."""
    for address in addresses:
        reason = refusal(address)
        if reason:
            what = f"{host} is" if [address] == _literal(host) else f"{host} resolves to {address},"
            raise ToolFailure(
                f"{what} {reason}: only public addresses are fetched unless the server sets {ALLOW_PRIVATE}=1"
            )


class CheckedTransport(httpx.AsyncBaseTransport):
    """Resolves each request's host once, checks the addresses, and dials only those addresses."""

    def __init__(self, allow_private: bool) -> None:
        self._allow_private = allow_private
        # SSL_CERT_FILE / SSL_CERT_DIR still name the CA certificates, as for any httpx client.
        self._http = httpx.AsyncHTTPTransport(verify=httpx.create_ssl_context(), trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host = url.raw_host.decode("ascii")
        addresses = await _resolve(host)
        if not self._allow_private:
            _check(host, addresses)
        failure: httpx.ConnectError | None = None
        for address in addresses:
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
        assert failure is not None  # _resolve() returns at least one address
        raise failure

    async def aclose(self) -> None:
        await self._http.aclose()


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


def decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset name Python does not know
        return body.decode("utf-8", errors="replace")


def connection_problem(exc: Exception) -> str:
    """A plain description of why a request failed: DNS, refused connection or the library's message."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return f"could not resolve the host name ({cause.strerror or cause})"
        if isinstance(cause, ConnectionRefusedError):
            return "the connection was refused (nothing is listening there)"
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__
