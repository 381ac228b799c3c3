"""The server's allow-list proxy for sandboxed commands (`--sandbox-network allow:host,...`).

A sandboxed command has no network of its own. With an allow list, each sandboxed call gets a
`Grant`: a credential of its own, and HTTP_PROXY / HTTPS_PROXY / ALL_PROXY naming this proxy with
it (`http://a3s:<token>@127.0.0.1:<port>`), as curl, pip, npm, git, cargo and Go read them. The
proxy, on 127.0.0.1 and a port of its own (opened by the first grant, closed with the server):

- tunnels CONNECT host:port (HTTPS and anything else) and forwards plain-HTTP requests in
  absolute form (`GET http://host/path`: the head rewritten with `Connection: close`, the rest
  relayed as bytes, so one connection reaches one destination);
- answers 407 to a connection without a live grant's credential: nothing else on the machine can
  use it, and each connection is known to be its grant's (`Grant.label`);
- lets through only the hosts of the proxy's list and of the grant's (a host must be in both;
  a proxy made without a list lets each grant's own decide): exact names, `*.domain` for the names
  below a domain, `*` for any host; ports 80 and 443 unless an entry names its own (`host:8443`),
  base/allow_list.py;
- resolves the name once, refuses it unless every address is public (tools/fetcher.py: no
  loopback, private, link-local or metadata address, even for an allowed name, unless the
  server sets A3S_FETCH_ALLOW_PRIVATE=1), and connects to exactly an address it checked, so a DNS
  answer that changes in between (rebinding) cannot send the connection elsewhere;
- goes through the server's own proxy when its environment names one (HTTPS_PROXY for tunnels,
  HTTP_PROXY for plain HTTP, NO_PROXY: base/proxies.py), by name after the same check, as
  web_fetch does;
- answers 403 with the reason to what it refuses (logged sparsely, and kept on the grant so the
  call's result can say it), 502 when the destination cannot be reached, 504 when reaching it
  takes too long;
- bounds everything: the request head's size (431) and the time it takes to arrive (408), the
  time to connect, the connections open (503 over the cap, in all and per grant), a tunnel's
  idle time; bytes are relayed with backpressure both ways (what one side sends is read only as
  fast as the other side takes it).

A command in a network namespace of its own (bwrap) cannot reach the proxy's port: the sandbox
makes a listening socket inside the namespace and hands it over (`Grant.serve_handed_over`), and
the proxy serves it, with the same rules, for as long as the grant lives.

Plain asyncio streams rather than aiohttp: aiohttp's server does not tunnel CONNECT, and since a
request is relayed as bytes after its head, the only HTTP here is parsing one request head.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import re
import secrets
import socket
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import unquote, urlsplit

from ...base.allow_list import AllowList, host_and_port, normalized_host
from ...base.errors import FailedPrecondition
from ...base.proxies import Proxy, proxy_for
from ...base.sparse_log import SparseLog
from ..fetcher import AddressRefused, checked_addresses, connection_problem
from ..registry import ToolFailure
from ..special_addresses import IPAddress

log = logging.getLogger("a3s_agent.security")

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
USER = "a3s"
"""The user name of the proxy URL; the grant's token is its password (which tools redact)."""
REFUSALS_KEPT = 8
"""The latest refusals a grant keeps for its call's result."""

_CHUNK = 64 * 1024
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: methods, header names
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
        "host",
    }
)


@dataclass(frozen=True)
class ProxyLimits:
    head_bytes: int = 32 * 1024
    """The longest request head (request line and headers): 431 over it."""
    head_timeout_s: float = 10.0
    """How long a request head may take to arrive: 408 after it (a slow client holds nothing longer)."""
    connect_timeout_s: float = 30.0
    """Resolving, connecting and the server's own proxy's answer to CONNECT: 504 after it."""
    idle_timeout_s: float = 300.0
    """A connection that moves no byte either way for this long is closed."""
    connections: int = 32
    """Connections open at once, in all: each holds two open files once connected, and the 64 they
    can hold come out of the files the server keeps beside its listeners (faces/open_files.py
    RESERVED_FILES, 256), so that commands cannot use up the files the store and tools need."""
    connections_per_grant: int = 16
    """Connections open at once with one grant's credential, so that one call cannot take them all."""


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Grant:
    """The credential of one sandboxed call (or session) for the proxy: what its command's
    environment names, whose connections they are, what they may reach. Closing it revokes the
    credential and ends the connections made with it."""

    def __init__(self, proxy: SandboxProxy, label: str, narrowed: AllowList | None) -> None:
        self.label = label
        """Whose connections these are, for the log: "session <id>"..."""
        self.narrowed = narrowed
        """The grant's own allow list: a host must be in it and in the proxy's (if it has one)."""
        self.refused: deque[str] = deque(maxlen=REFUSALS_KEPT)
        """What the proxy refused this grant's connections, latest last ("CONNECT host:443: why")."""
        self._proxy = proxy
        self._token = secrets.token_urlsafe(24)
        self.digest = _digest(self._token)
        self.tasks: set[asyncio.Task[None]] = set()
        self._servers: list[asyncio.Server] = []
        self._channels: list[socket.socket] = []

    @property
    def port(self) -> int | None:
        """The proxy's loopback port (a command in a network namespace reaches its own)."""
        return self._proxy.port

    @property
    def url(self) -> str:
        return f"http://{USER}:{self._token}@127.0.0.1:{self._proxy.port}"

    def env(self) -> dict[str, str]:
        """The command's proxy variables: all of them name the proxy, NO_PROXY none."""
        return {**dict.fromkeys(PROXY_VARIABLES, self.url), "NO_PROXY": "", "no_proxy": ""}

    def ports(self, host: str) -> frozenset[int]:
        lists = [found for found in (self._proxy.allowed, self.narrowed) if found is not None]
        return frozenset.intersection(*(found.ports(host) for found in lists))

    async def serve_handed_over(self, channel: socket.socket) -> None:
        """Serve the listening socket that arrives on the Unix socket `channel` (SCM_RIGHTS, sent by
        the sandbox's launcher from inside a network namespace: tools/sandbox/launch.py) until the
        grant is closed. Nothing but a listening TCP socket is served; `channel` is closed."""
        self._channels.append(channel)
        try:
            listening = await _received_listener(channel)
        finally:
            channel.close()
        if listening is None:
            return
        if self._proxy.revoked(self):
            listening.close()
            return
        self._servers.append(await self._proxy.serve(listening))

    def close(self) -> None:
        self._proxy.revoke(self)
        for task in list(self.tasks):
            task.cancel()
        for channel in self._channels:
            channel.close()
        for server in self._servers:
            self._proxy.stop_serving(server)

    def __enter__(self) -> Grant:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _digest(token: str) -> bytes:
    """Grants are looked up by their token's digest, so the lookup's timing tells nothing of a token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class _Refused(Exception):
    def __init__(self, status: int, reason: str, *headers: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]


@dataclass
class _Connection:
    """A client connection: its task, and what is known of it so far (for the log and the grant)."""

    task: asyncio.Task[None]
    grant: Grant | None = None
    what: str = "a connection"


class SandboxProxy:
    """The proxy of one server: `grant()` for each sandboxed call that may use the network,
    `close()` when the server stops."""

    def __init__(
        self, allowed: AllowList | None, *, allow_private: bool, limits: ProxyLimits | None = None
    ) -> None:
        self.allowed = allowed
        """The hosts any grant may reach; None: each grant's own list decides (a server whose MCP
        servers and skills have lists of their own, wider than its --sandbox-network's)."""
        self.allow_private = allow_private
        """The operator allows non-public addresses (A3S_FETCH_ALLOW_PRIVATE=1: `fetcher.private_allowed()`)."""
        self.limits = limits or ProxyLimits()
        self.port: int | None = None
        """The loopback port it listens on, once the first grant opened it."""
        self._grants: dict[bytes, Grant] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._servers: set[asyncio.Server] = set()
        self._starting: asyncio.Task[asyncio.Server] | None = None
        self._closed = False
        self._lines = SparseLog(log, "proxy connections refused")

    def grant(self, label: str, narrowed: AllowList | None = None) -> Grant:
        """A new credential for `label`'s commands. The first opens the proxy's port (call it in
        the event loop's thread; connections made before it serves wait in the listen queue)."""
        if self._closed:
            raise FailedPrecondition("the sandbox's network proxy is stopped")
        if self.allowed is None and narrowed is None:
            raise ValueError("a grant of a proxy without an allow list needs one of its own")
        if self.port is None:
            listening = socket.create_server(("127.0.0.1", 0))
            self.port = int(listening.getsockname()[1])
            self._starting = asyncio.get_running_loop().create_task(self.serve(listening))
        grant = Grant(self, label, narrowed)
        self._grants[grant.digest] = grant
        return grant

    def revoke(self, grant: Grant) -> None:
        """The grant's credential no longer gets in (`Grant.close` also ends its connections)."""
        self._grants.pop(grant.digest, None)

    def revoked(self, grant: Grant) -> bool:
        return self._grants.get(grant.digest) is not grant

    async def serve(self, listening: socket.socket) -> asyncio.Server:
        """Serve the connections accepted on `listening` (the proxy's own port; or a socket made
        where a sandboxed command can reach it and handed over) until `stop_serving` or `close`:
        the credential decides, as on any."""
        server = await asyncio.start_server(self._serve, sock=listening, limit=self.limits.head_bytes)
        self._servers.add(server)
        return server

    def stop_serving(self, server: asyncio.Server) -> None:
        """Close `server`'s listening socket (its connections go with their grants)."""
        self._servers.discard(server)
        server.close()

    async def close(self) -> None:
        """Stop listening and end every connection."""
        self._closed = True
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._grants.clear()

    # --- a connection --------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio runs each connection's callback as a task
        connection = _Connection(task)
        try:
            if len(self._tasks) >= self.limits.connections:
                raise _Refused(
                    503, f"{self.limits.connections} connections are open already: try again later"
                )
            self._tasks.add(task)
            await self._handle(reader, writer, connection)
        except _Refused as refused:
            self._refused(connection, refused)
            _answer(writer, refused)
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self._tasks.discard(task)
            if connection.grant is not None:
                connection.grant.tasks.discard(task)
            writer.close()

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection
    ) -> None:
        request = _parse_head(await self._head(reader))
        connection.what = _printable(f"{request.method} {request.target}")[:120]
        grant = connection.grant = self._authenticated(request)
        if len(grant.tasks) >= self.limits.connections_per_grant:
            raise _Refused(
                503, f"{self.limits.connections_per_grant} connections of this command are open already"
            )
        grant.tasks.add(connection.task)
        host, port, path = _destination(request)
        connection.what = f"{request.method} {_authority(host, port)}"
        ports = grant.ports(host)
        if not ports:
            raise _Refused(403, f"{host} is not one of the hosts the sandbox allows")
        if port not in ports:
            raise _Refused(403, f"{host} is allowed on port {', '.join(map(str, sorted(ports)))}, not {port}")
        try:
            async with asyncio.timeout(self.limits.connect_timeout_s):
                upstream, through = await self._connect(host, port, request.method == "CONNECT")
        except TimeoutError:
            raise _Refused(504, f"reaching {_authority(host, port)} took too long") from None
        try:
            if request.method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream[1].write(_forwarded_head(request, host, port, path, through))
            await _relay((reader, writer), upstream, self.limits.idle_timeout_s)
        finally:
            upstream[1].close()

    async def _head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            async with asyncio.timeout(self.limits.head_timeout_s):
                return await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            raise _Refused(408, "the request head did not arrive in time") from None
        except asyncio.LimitOverrunError:
            raise _Refused(431, f"the request head is longer than {self.limits.head_bytes} bytes") from None

    def _authenticated(self, request: _Request) -> Grant:
        values = request.values("proxy-authorization")
        scheme, _, encoded = values[0].partition(" ") if len(values) == 1 else ("", "", "")
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        grant = self._grants.get(_digest(decoded.partition(":")[2])) if scheme.lower() == "basic" else None
        if grant is None:
            raise _Refused(
                407,
                "no valid credentials: use the proxy URL in this command's environment (HTTPS_PROXY)",
                'Proxy-Authenticate: Basic realm="a3s-agent sandbox"',
            )
        return grant

    async def _connect(
        self, host: str, port: int, tunnel: bool
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], Proxy | None]:
        """A connection to the destination (tunnel: ready for its bytes), and the server's proxy
        it goes through, if any."""
        authority = _authority(host, port)
        try:
            through = proxy_for(f"{'https' if tunnel else 'http'}://{authority}/")
        except FailedPrecondition as exc:
            raise _Refused(502, str(exc)) from None
        if through is None:
            return await _dial(await self._checked(host), port, authority), None
        if not self.allow_private:
            await self._checked(host)
        return await _through(through, authority, tunnel), through

    async def _checked(self, host: str) -> list[IPAddress]:
        try:
            return await checked_addresses(host, allow_private=self.allow_private)
        except AddressRefused as exc:
            raise _Refused(403, str(exc)) from None
        except ToolFailure as exc:
            raise _Refused(502, str(exc)) from None

    def _refused(self, connection: _Connection, refused: _Refused) -> None:
        grant = connection.grant
        if refused.status in (403, 503) and grant is not None:
            grant.refused.append(f"{connection.what}: {refused.reason}")
        if refused.status in (403, 407, 503):
            whose = grant.label if grant is not None else "a client without valid credentials"
            self._lines.log(
                logging.WARNING, "sandbox proxy refused %s of %s: %s", connection.what, whose, refused.reason
            )


async def _received_listener(channel: socket.socket) -> socket.socket | None:
    """The listening TCP socket sent on `channel` (None: the sender ended without one, or sent
    something else). Received close-on-exec: no later spawn inherits it."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    channel.setblocking(False)
    loop.add_reader(channel.fileno(), ready)
    try:
        await readable
    finally:
        loop.remove_reader(channel.fileno())
    try:
        _, fds, _, _ = socket.recv_fds(channel, 16, 1, socket.MSG_CMSG_CLOEXEC)
    except OSError:
        return None
    if not fds:
        return None
    listening = socket.socket(fileno=fds[0])
    listens = listening.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if (
        listening.family not in (socket.AF_INET, socket.AF_INET6)
        or listening.type != socket.SOCK_STREAM
        or not listens
    ):
        log.warning("a sandbox's launcher handed over something other than a listening TCP socket: ignored")
        listening.close()
        return None
    return listening


def _parse_head(head: bytes) -> _Request:
    line, *lines = head[:-4].decode("latin-1").split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Refused(400, "the request line is not METHOD TARGET HTTP/1.1")
    headers = []
    for header in lines:
        name, colon, value = header.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
            raise _Refused(400, "a header line is malformed")
        headers.append((name, value.strip(" \t")))
    return _Request(parts[0], parts[1], parts[2], headers)


def _destination(request: _Request) -> tuple[str, int, str]:
    """(host, port, path and query) of the request; a tunnel's path is ""."""
    if request.method == "CONNECT":
        try:
            raw, port = host_and_port(request.target)
        except ValueError:
            raw, port = "", None
        host = normalized_host(raw)
        if host is None or port is None:
            raise _Refused(400, "CONNECT needs host:port")
        return host, port, ""
    url = urlsplit(request.target)
    if url.scheme.lower() != "http" or not url.netloc:
        why = "use CONNECT for https" if url.scheme.lower() == "https" else "send http://host/path requests"
        raise _Refused(400, f"this is a proxy: {why}")
    try:
        port = url.port or 80
    except ValueError:
        raise _Refused(400, "the URL's port is not a number") from None
    host = normalized_host(url.hostname or "")
    if host is None:
        raise _Refused(400, "the URL's host is not a host name or IP address")
    return host, port, (url.path or "/") + (f"?{url.query}" if url.query else "")


def _forwarded_head(request: _Request, host: str, port: int, path: str, through: Proxy | None) -> bytes:
    """The head of a plain-HTTP request as it goes on: to the destination in origin form, or to the
    server's proxy in absolute form with its credentials; hop-by-hop headers dropped, closed after."""
    authority = _authority(host, port).removesuffix(":80")
    listed = {name.strip().lower() for value in request.values("connection") for name in value.split(",")}
    kept = [f"{name}: {value}" for name, value in request.headers if name.lower() not in _HOP_BY_HOP | listed]
    target = f"http://{authority}{path}" if through is not None else path
    credentials = _credentials(through) if through is not None else None
    lines = [f"{request.method} {target} {request.version}", f"Host: {authority}", *kept, "Connection: close"]
    if credentials:
        lines.append(f"Proxy-Authorization: {credentials}")
    return "\r\n".join([*lines, "", ""]).encode("latin-1")


def _credentials(proxy: Proxy) -> str | None:
    """The Proxy-Authorization value for the server's proxy, when its URL carries credentials."""
    parts = urlsplit(proxy.url)
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return f"Basic {base64.b64encode(pair.encode()).decode()}"


async def _dial(
    addresses: Iterable[IPAddress], port: int, authority: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of the checked `addresses` that answers (never to the name again)."""
    failure: OSError | None = None
    for address in addresses:
        try:
            return await asyncio.open_connection(str(address), port, limit=_CHUNK)
        except OSError as exc:
            failure = exc
    assert failure is not None  # checked_addresses() returns at least one address
    raise _Refused(502, f"could not connect to {authority}: {connection_problem(failure)}")


async def _through(
    proxy: Proxy, authority: str, tunnel: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the server's proxy; for a tunnel, with its CONNECT to `authority` answered."""
    parts = urlsplit(proxy.url)
    try:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80, limit=_CHUNK)
    except OSError as exc:
        raise _Refused(502, f"could not reach {proxy.named}: {connection_problem(exc)}") from None
    if not tunnel:
        return reader, writer
    credentials = _credentials(proxy)
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    lines += [f"Proxy-Authorization: {credentials}"] if credentials else []
    writer.write("\r\n".join([*lines, "", ""]).encode("latin-1"))
    try:
        line = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0].decode("latin-1")
        version, _, answer = line.partition(" ")
        status, _, reason = answer.partition(" ")
        if not version.startswith("HTTP/") or not re.fullmatch("[0-9]{3}", status):
            raise ValueError(line)
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        raise _Refused(502, f"{proxy.named} did not answer CONNECT {authority} with HTTP") from None
    if not 200 <= int(status) < 300:
        writer.close()
        raise _Refused(502, proxy.refusal(int(status), _printable(reason)))
    return reader, writer


async def _relay(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    idle_s: float,
) -> None:
    """Copy bytes both ways until both sides have finished (each end passed on as a half close),
    either fails, or no byte moved for `idle_s`. Each side is read only while the other takes what
    was read (drain), so neither buffers more than a chunk and the transports' limits."""
    loop = asyncio.get_running_loop()
    last = [loop.time()]

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(_CHUNK):
            last[0] = loop.time()
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()

    pipes = {
        asyncio.create_task(pipe(client[0], upstream[1])),
        asyncio.create_task(pipe(upstream[0], client[1])),
    }
    try:
        while pipes:
            done, pipes = await asyncio.wait(
                pipes, timeout=last[0] + idle_s - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
            if any([task.exception() for task in done]) or (not done and loop.time() >= last[0] + idle_s):
                return
    finally:
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


def _printable(text: str) -> str:
    return re.sub(r"[^\x20-\x7e]", "?", text)[:200]


def _answer(writer: asyncio.StreamWriter, refused: _Refused) -> None:
    """The proxy's own answer, its reason in the status line too (Python's clients show that one)."""
    body = f"a3s-agent sandbox proxy: {refused.reason}\n".encode()
    head = [
        f"HTTP/1.1 {refused.status} {_printable(refused.reason)}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *refused.headers,
    ]
    writer.write("\r\n".join([*head, "", ""]).encode("latin-1") + body)
