"""Ports for servers that the tests and the benchmark start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()
_PORTS_BELOW_EPHEMERAL = 12_000


def free_port() -> int:
    """A port on 127.0.0.1 that nothing holds, for a server to bind later: picked below the kernel's
    ephemeral range, since one from it (what binding port 0 gives) can become an outgoing
    connection's local end before the server binds it ("address already in use"), and never the
    same one twice in a run."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1_000):
        port = random.randrange(max(1024, low - _PORTS_BELOW_EPHEMERAL), low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")
