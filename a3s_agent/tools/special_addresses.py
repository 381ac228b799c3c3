"""IANA's special-purpose address registries, as data: which blocks are not globally reachable.

The rows of https://www.iana.org/assignments/iana-ipv4-special-registry and
https://www.iana.org/assignments/iana-ipv6-special-registry: each block, its name, and its
"Globally Reachable" column (True, False, or None where the registry says N/A or leaves it blank
for a terminated block). Python's `ipaddress` tables lag behind the registries (3.11 knows neither
192.0.0.0/24 as a whole nor 3fff::/20), so the fetcher reads these instead. To update: compare
each table with the registry's CSV and change the rows and REGISTRIES_AS_OF together.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

REGISTRIES_AS_OF: Final = "2025-10-09"
"""The registries' last update these tables follow (the IPv6 one's; the IPv4 one's is earlier)."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class SpecialBlock:
    network: IPNetwork
    name: str
    globally_reachable: bool | None  # None: N/A, or blank for a terminated block


_IPV4: Final = (
    ("0.0.0.0/8", '"This network"', False),
    ("0.0.0.0/32", '"This host on this network"', False),
    ("10.0.0.0/8", "Private-Use", False),
    ("100.64.0.0/10", "Shared Address Space", False),
    ("127.0.0.0/8", "Loopback", False),
    ("169.254.0.0/16", "Link Local", False),
    ("172.16.0.0/12", "Private-Use", False),
    ("192.0.0.0/24", "IETF Protocol Assignments", False),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix", False),
    ("192.0.0.8/32", "IPv4 dummy address", False),
    ("192.0.0.9/32", "Port Control Protocol Anycast", True),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", True),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery", False),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery", False),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)", False),
    ("192.31.196.0/24", "AS112-v4", True),
    ("192.52.193.0/24", "AMT", True),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", None),
    ("192.88.99.2/32", "6a44-relay anycast address", False),
    ("192.168.0.0/16", "Private-Use", False),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", True),
    ("198.18.0.0/15", "Benchmarking", False),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)", False),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)", False),
    ("240.0.0.0/4", "Reserved", False),
    ("255.255.255.255/32", "Limited Broadcast", False),
)
_IPV6: Final = (
    ("::1/128", "Loopback Address", False),
    ("::/128", "Unspecified Address", False),
    ("::ffff:0:0/96", "IPv4-mapped Address", False),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", True),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", False),
    ("100::/64", "Discard-Only Address Block", False),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix", False),
    ("2001::/23", "IETF Protocol Assignments", False),
    ("2001::/32", "TEREDO", None),
    ("2001:1::1/128", "Port Control Protocol Anycast", True),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", True),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", True),
    ("2001:2::/48", "Benchmarking", False),
    ("2001:3::/32", "AMT", True),
    ("2001:4:112::/48", "AS112-v6", True),
    ("2001:10::/28", "Deprecated (previously ORCHID)", None),
    ("2001:20::/28", "ORCHIDv2", True),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", True),
    ("2001:db8::/32", "Documentation", False),
    ("2002::/16", "6to4", None),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", True),
    ("3fff::/20", "Documentation", False),
    ("5f00::/16", "Segment Routing (SRv6) SIDs", False),
    ("fc00::/7", "Unique-Local", False),
    ("fe80::/10", "Link-Local Unicast", False),
)

SPECIAL_BLOCKS: Final = tuple(
    SpecialBlock(ipaddress.ip_network(block), name, reachable) for block, name, reachable in (*_IPV4, *_IPV6)
)


@lru_cache(maxsize=256)
def special_block(address: IPAddress) -> SpecialBlock | None:
    """The most specific registry block holding `address` (a row's own exceptions, such as
    192.0.0.9/32 inside 192.0.0.0/24, win), or None outside every block."""
    holding = [
        block
        for block in SPECIAL_BLOCKS
        if block.network.version == address.version and address in block.network
    ]
    return max(holding, key=lambda block: block.network.prefixlen, default=None)
