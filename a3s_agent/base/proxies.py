"""The proxy a request goes through, as the environment says: HTTPS_PROXY, HTTP_PROXY and NO_PROXY.

Read as curl and most tools read them: the lower-case name first, then the upper-case one;
`https_proxy` for https:// URLs (tunnelled with CONNECT), `http_proxy` for http:// ones. NO_PROXY
lists what is reached directly, comma-separated: `*` (everything), host names (each covers its
subdomains; a leading `.` or `*.` means the same), IP addresses and CIDR ranges, each optionally
with `:port`. A loopback destination (localhost, 127.0.0.0/8, ::1) is never proxied, as in Go's
net/http: a proxy would reach its own loopback, not this machine's. Only http:// proxies are
supported. A proxy URL may carry credentials (http://user:password@proxy:3128): they go to the
proxy alone, and messages name the proxy by `Proxy.shown`, without them.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import FailedPrecondition

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Proxy:
    url: str
    """With its credentials, if any: for the connection only."""
    variable: str
    """The environment variable it came from (HTTPS_PROXY, https_proxy...)."""
    shown: str
    """http://host:port, as messages may show it."""

    @property
    def password(self) -> str:
        return urlsplit(self.url).password or ""

    @property
    def named(self) -> str:
        """The proxy as messages name it: "the proxy http://host:port (HTTPS_PROXY)"."""
        return f"the proxy {self.shown} ({self.variable})"

    def refusal(self, status: int, reason: str) -> str:
        """What to say when the proxy answers `status` itself (an http:// URL's request, or the
        CONNECT of an https:// one): HTTP clients' own messages may show the URL, credentials and all."""
        said = f"{self.named} refused the request (HTTP {status} {reason})"
        return f"{said}: check the credentials in {self.variable}" if status == 407 else said


def proxy_for(url: str, env: Mapping[str, str] | None = None) -> Proxy | None:
    """The proxy to reach `url` through (None: connect directly), from `env` (default: the server's
    environment). FailedPrecondition when the variable names something else than an http:// proxy."""
    env = os.environ if env is None else env
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or _loopback(host):
        return None
    variable, value = _setting(env, f"{scheme}_proxy")
    if not value or _bypassed(host, parts.port or _DEFAULT_PORTS[scheme], _setting(env, "no_proxy")[1]):
        return None
    proxy = urlsplit(value if "://" in value else f"http://{value}")
    try:
        port = proxy.port or 80
    except ValueError:  # a port that is no number
        port = 0
    shown = f"{proxy.scheme}://{proxy.hostname or ''}:{port}"
    if proxy.scheme.lower() != "http" or not proxy.hostname or not port:
        raise FailedPrecondition(
            f"{variable} is {shown}, not an http:// proxy (host:port); only those are supported"
        )
    return Proxy(proxy.geturl(), variable, shown)


def _setting(env: Mapping[str, str], name: str) -> tuple[str, str]:
    """(the variable's name as set, its value): the lower-case name first, as curl reads them."""
    for variable in (name, name.upper()):
        value = env.get(variable, "").strip()
        if value:
            return variable, value
    return name.upper(), ""


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether NO_PROXY lists `host` (and `port`, when the entry names one)."""
    for entry in no_proxy.lower().split(","):
        entry = entry.strip()
        if entry == "*":
            return True
        pattern, entry_port = _host_and_port(entry)
        if pattern and entry_port in (None, port) and _matches(host, pattern):
            return True
    return False


def _host_and_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [::1]:8080
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest[1:].isdigit() else None
    host, colon, port = entry.rpartition(":")
    if colon and port.isdigit() and ":" not in host:  # not an IPv6 address
        return host, int(port)
    return entry, None


def _matches(host: str, pattern: str) -> bool:
    try:
        network = ipaddress.ip_network(pattern, strict=False)
    except ValueError:  # a name
        name = pattern.removeprefix("*").lstrip(".")
        return bool(name) and (host == name or host.endswith(f".{name}"))
    try:
        return ipaddress.ip_address(host) in network
    except ValueError:
        return False
