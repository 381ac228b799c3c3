"""Which `Host` header values name this server: the defence against DNS rebinding.

A rebinding page is served from the attacker's name, so its requests carry that name in `Host`
even once the name resolves to us. A request is ours when its Host names

- the listen address, or for a loopback listener also `localhost`, `127.0.0.1` and `[::1]`;
  for a wildcard listener (0.0.0.0, ::) the loopback names, this machine's host names and
  the addresses they resolve to;
- the address the connection itself arrived on (an IP literal cannot be rebound);
- a name the operator allowed (`--allowed-host`, A3S_ALLOWED_HOSTS).

The port is not compared for the server's own names: a port forward (docker -p 8080:4089,
kubectl port-forward) or a proxy changes it, and it adds nothing against rebinding, where the
name is the attacker's. An allowed-host entry with a port (`agent.example:8443`) matches only
that port; one without matches any.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def split_host(value: str) -> tuple[str, str]:
    """(name, port) of a Host value, normalised: lower case, IPv6 without brackets, IPs canonical,
    no trailing dot; port "" when absent. A malformed value gives a name that matches nothing."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name, port = value, ""
    return _canonical(name), port


def _canonical(name: str) -> str:
    name = name.rstrip(".")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _is_loopback(name: str) -> bool:
    try:
        return name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _machine_names() -> set[str]:
    """This machine's host names and the addresses they resolve to (may ask DNS: run in a thread)."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in tuple(names):
        try:
            names.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
        except OSError:
            continue
    return {_canonical(n.lower()) for n in names if n}


@dataclass(frozen=True)
class HostPolicy:
    names: frozenset[str]
    """Names and addresses that are ours on any port."""
    with_port: frozenset[tuple[str, str]]
    """Allowed (name, port) pairs."""

    @classmethod
    async def for_listener(cls, listen_host: str, allowed: Iterable[str]) -> HostPolicy:
        host = _canonical(listen_host.strip("[]").lower())
        names = {host}
        if host in _WILDCARDS:
            names = set(LOOPBACK_NAMES) | await asyncio.to_thread(_machine_names)
        elif _is_loopback(host):
            names |= LOOPBACK_NAMES
        with_port = set()
        for entry in allowed:
            name, port = split_host(entry)
            if port:
                with_port.add((name, port))
            else:
                names.add(name)
        return cls(frozenset(names), frozenset(with_port))

    def allows(self, host_header: str, local_address: str | None) -> bool:
        """Whether `host_header` names us; `local_address` is the IP the connection arrived on."""
        name, port = split_host(host_header)
        if name in self.names or (name, port) in self.with_port:
            return True
        return local_address is not None and name == _canonical(local_address.lower())
