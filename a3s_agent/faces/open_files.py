"""The process's open files. Every connection, store file, tool pipe and MCP server holds one, and
when none is left, everything fails at once: tools, the store, health checks. So at start the
soft limit is raised to the hard one, and the listeners' connection caps are fitted under it with
RESERVED_FILES to spare: a flood of connections on either port can take at most its listener's
cap. Should the process run out anyway, failed accepts are logged sparsely."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import resource
import socket
from typing import Any

from ..app.types import Settings
from ..base.sparse_log import SparseLog

log = logging.getLogger(__name__)

RESERVED_FILES = 256
"""Open files kept out of the listeners' caps: the store's files, tool processes' pipes, MCP
servers, connections to the model, and connections accepted over a cap while they are closed."""
MIN_CONNECTIONS = 16
"""Per listener: a limit that leaves less room than this beside the reserve is refused."""
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""The accept errors asyncio retries a second later (and reports on every attempt)."""


class TooFewOpenFiles(RuntimeError):
    """The open-files limit leaves no room for the listeners beside the reserve."""


def raise_open_file_limit() -> int:
    """Raise the soft limit to the hard one, as far as allowed; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.debug("open files limit stays %d (hard limit %d): %s", soft, hard, exc)
        return soft
    log.debug("open files limit raised from %d to the hard limit %d", soft, hard)
    return hard


def fit_connection_caps(settings: Settings, limit: int) -> Settings:
    """`settings` with max_grpc_connections and max_http_connections lowered, in proportion, so
    that they and RESERVED_FILES fit in `limit` open files (a warning says so); unchanged if they
    fit already. Raises TooFewOpenFiles if the room left is under MIN_CONNECTIONS per listener."""
    grpc_cap = settings.max_grpc_connections
    http_cap = settings.max_http_connections if settings.http_listen != "off" else 0
    listeners = 2 if http_cap else 1
    room = limit - RESERVED_FILES
    wanted = grpc_cap + http_cap
    if limit == resource.RLIM_INFINITY or wanted <= room:
        return settings
    least = RESERVED_FILES + MIN_CONNECTIONS * listeners
    if limit < least:
        raise TooFewOpenFiles(
            f"the open-files limit is {limit}: a3s-agent needs at least {least} ({RESERVED_FILES} for"
            f" its store, tools and health checks, {MIN_CONNECTIONS} connections per listener). Raise"
            " it (ulimit -n, LimitNOFILE= in systemd, --ulimit nofile= in Docker)"
        )
    fitted = dataclasses.replace(
        settings,
        max_grpc_connections=max(1, grpc_cap * room // wanted),
        max_http_connections=max(1, http_cap * room // wanted) if http_cap else settings.max_http_connections,
    )
    lowered = [f"gRPC {fitted.max_grpc_connections} (A3S_MAX_GRPC_CONNECTIONS is {grpc_cap})"]
    if http_cap:
        lowered.append(f"HTTP {fitted.max_http_connections} (A3S_MAX_HTTP_CONNECTIONS is {http_cap})")
    log.warning(
        "the open-files limit is %d: with %d kept for the store, tools and health checks, the"
        " connection caps are lowered to %s. Raise the hard limit (ulimit -Hn, LimitNOFILE= in"
        " systemd, --ulimit nofile= in Docker) or set caps that fit",
        limit,
        RESERVED_FILES,
        " and ".join(lowered),
    )
    return fitted


def listening_addresses(address: str) -> int:
    """How many sockets gRPC listens on for HOST:PORT: one per address the host resolves to
    (localhost: 127.0.0.1 and ::1). Each has a connection cap of its own."""
    host, _, port = address.rpartition(":")
    try:
        found = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):  # check_address has already refused what cannot resolve
        return 1
    return max(1, len({info[4][:2] for info in found}))


def log_accept_errors_sparsely(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio reports a listener's failed accept (out of open files) with a traceback on every
    attempt: hundreds of lines a second. Make that one line, at most LINES_PER_WINDOW per window."""
    lines = SparseLog(log, "failed accepts")

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        listener = context.get("socket")
        if not (isinstance(exc, OSError) and exc.errno in OUT_OF_RESOURCES and listener is not None):
            loop.default_exception_handler(context)
            return
        try:
            host, port = listener.getsockname()[:2]
        except OSError:
            host, port = "?", "?"
        lines.log(logging.ERROR, "cannot accept connections on %s:%s: %s; retrying", host, port, exc.strerror)

    loop.set_exception_handler(handle)
