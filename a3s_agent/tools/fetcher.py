"""Which URLs the agent may request when it was given them (web_fetch, the http tools of skills, MCP
servers over HTTP), and through which proxy; tools/checked_fetch.py makes the requests.

Every request, the first and each redirect, goes through CheckedTransport (checked_fetch.py): it
resolves the host name once (`checked_addresses`), refuses the request unless every address is
public (`refusal`; A3S_FETCH_ALLOW_PRIVATE=1 allows the others), and then connects to exactly an
address it checked. A DNS answer that changes between the check and the connection (DNS
rebinding) therefore cannot send the request anywhere else. The Host header, the TLS server name
(SNI) and the certificate check stay those of the URL's host name.

Through a proxy (HTTPS_PROXY / HTTP_PROXY of the server's environment, unless NO_PROXY lists the
host: base/proxies.py) the name is still resolved and checked here first, and refused unless every
address is public; then the request goes to the proxy by name (CONNECT host:port for https), since
proxies allow and deny by name and may resolve names this machine cannot. The proxy resolves the
name again: a DNS answer that changes in between can lead it elsewhere, so with a proxy the proxy's
own rules are the last word. A name this machine cannot resolve is refused, as without a proxy;
A3S_FETCH_ALLOW_PRIVATE=1 skips the check, and the proxy alone resolves and decides.

Nothing here imports httpx: the server imports this module at start, httpx (with its command line,
which loads rich and pygments when they are installed) only on the first request."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket

from .. import __version__
from ..base.errors import FailedPrecondition
from ..base.proxies import Proxy, proxy_for
from .registry import ToolContext, ToolFailure
from .special_addresses import IPAddress, special_block

USER_AGENT = f"a3s-agent/{__version__}"
ALLOW_PRIVATE = "A3S_FETCH_ALLOW_PRIVATE"

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


def private_allowed(ctx: ToolContext | None = None) -> bool:
    """A3S_FETCH_ALLOW_PRIVATE=1 in the session's env (with `ctx`) or the server's environment."""
    server = os.environ.get(ALLOW_PRIVATE, "")
    value = ctx.env.get(ALLOW_PRIVATE, server) if ctx is not None else server
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

    Public means: not multicast, not in space IANA keeps reserved, and outside every block of
    IANA's special-purpose registries that is not globally reachable (special_addresses.py). An
    IPv6 address that carries an IPv4 address is judged by the IPv4 address it carries."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    if isinstance(address, ipaddress.IPv6Address):
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
    block = special_block(address)
    if block is not None:
        reachable = block.globally_reachable
        return None if reachable else f"a special-purpose address (IANA: {block.network}, {block.name})"
    if address.is_reserved:
        return "a reserved address"
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


class AddressRefused(ToolFailure):
    """A host resolves to (or is) an address that is not public, and private ones are not allowed."""


def _check(host: str, addresses: list[IPAddress]) -> None:
    """Refuse the request unless every address of `host` is public."""
    for address in addresses:
        reason = refusal(address)
        if reason:
            what = f"{host} is" if [address] == _literal(host) else f"{host} resolves to {address},"
            raise AddressRefused(
                f"{what} {reason}: only public addresses are fetched unless the server sets {ALLOW_PRIVATE}=1"
            )


async def checked_addresses(host: str, *, allow_private: bool) -> list[IPAddress]:
    """The addresses of `host` a request may be sent to (resolved once, to connect to exactly
    those): all of them, when every one is public or `allow_private`; AddressRefused otherwise,
    ToolFailure when the name does not resolve."""
    addresses = await _resolve(host)
    if not allow_private:
        _check(host, addresses)
    return addresses


def tool_proxy(url: str) -> Proxy | None:
    """The proxy the server's environment names for `url` (base/proxies.py); a bad one fails the tool."""
    try:
        return proxy_for(url)
    except FailedPrecondition as exc:
        raise ToolFailure(str(exc)) from exc


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
