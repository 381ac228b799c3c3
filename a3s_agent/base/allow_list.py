"""Allow lists of hosts, as the operator writes them for the sandbox's network
(`--sandbox-network allow:host,...`, a server's or skill's own `sandbox_network`) and as the
sandbox's proxy (tools/sandbox/proxy.py) applies them: one grammar for both.

An entry is a host name or IP address (`[v6]` in brackets), `*.domain` (the names below the domain,
not the domain itself) or `*` (any host), with an optional `:port`; without one, ports 80 and 443.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from .errors import InvalidArgument

DEFAULT_PORTS = frozenset({80, 443})

_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


@dataclass(frozen=True)
class AllowedHost:
    """One entry of an allow list."""

    name: str  # normalized (lower case, no trailing dot, IPv6 without brackets); "" for `*`
    wildcard: bool
    ports: frozenset[int]

    def matches(self, host: str) -> bool:
        if not self.wildcard:
            return host == self.name
        return not self.name or host.endswith(f".{self.name}")

    @property
    def text(self) -> str:
        """The entry as written, normalized: `host`, `*.domain`, `*`, `[v6]`, with `:port` unless
        it allows the default ports."""
        host = f"[{self.name}]" if ":" in self.name else self.name
        if self.wildcard:
            host = f"*.{host}" if host else "*"
        ports = "" if self.ports == DEFAULT_PORTS else ":" + ",".join(map(str, sorted(self.ports)))
        return host + ports


@dataclass(frozen=True)
class AllowList:
    hosts: tuple[AllowedHost, ...]

    @classmethod
    def parse(cls, text: str, what: str = "the sandbox's allowed hosts") -> AllowList:
        """`text` as the operator writes it: entries separated by commas. InvalidArgument, naming
        `what` and the entry, for anything but an entry."""
        entries = [entry.strip() for entry in text.split(",") if entry.strip()]
        if not entries:
            raise InvalidArgument(f"{what} name no host: give host names, *.domain patterns or host:port")
        return cls(tuple(_allowed_host(entry, what) for entry in entries))

    @property
    def text(self) -> str:
        return ",".join(entry.text for entry in self.hosts)

    def ports(self, host: str) -> frozenset[int]:
        """The ports `host` (normalized) may be reached on; empty when it may not be reached."""
        return frozenset().union(*(entry.ports for entry in self.hosts if entry.matches(host)))

    def beyond(self, other: AllowList) -> list[AllowedHost]:
        """The entries of this list that let through something `other` does not."""
        return [entry for entry in self.hosts if not _covered(entry, other)]


def _covered(entry: AllowedHost, other: AllowList) -> bool:
    if not entry.wildcard:
        return entry.ports <= other.ports(entry.name)
    covering = (
        o.ports
        for o in other.hosts
        if o.wildcard and (not o.name or (entry.name and (entry.name == o.name or o.matches(entry.name))))
    )
    return entry.ports <= frozenset().union(*covering)


def _allowed_host(entry: str, what: str) -> AllowedHost:
    problem = f"{what}: {entry!r} is not a host name, *.domain, * or IP address with an optional :port"
    try:
        host, port = host_and_port(entry)
    except ValueError:
        raise InvalidArgument(problem) from None
    wildcard = host == "*" or host.startswith("*.")
    name = normalized_host(host[2:] if host.startswith("*.") else host) if host != "*" else ""
    if name is None or (wildcard and name and _is_address(name)):
        raise InvalidArgument(problem)
    return AllowedHost(name, wildcard, frozenset({port}) if port is not None else DEFAULT_PORTS)


def host_and_port(text: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]` or `[v6]:port` split; ValueError for anything else."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(text)
        return host, _port(rest[1:]) if rest else None
    host, colon, port = text.partition(":")
    if ":" in port:
        raise ValueError(text)  # an IPv6 address must be in brackets
    return host, _port(port) if colon else None


def _port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(text)
    return int(text)


def normalized_host(host: str) -> str | None:
    """`host` as allow lists compare it (lower case, no trailing dot, an IP address in its standard
    form), or None when it is neither a DNS name nor an IP address."""
    host = host.lower().removesuffix(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host.isascii() or len(host) > 253:
        return None
    return host if all(_LABEL.fullmatch(label) for label in host.split(".")) else None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
