"""Where a face may push notifications to (A2A's push notifications): only under the URL prefixes
the operator allowed (`--a2a-push-url`), and only through the checked fetcher's transport (each
address checked before it is dialled, private ones refused unless A3S_FETCH_ALLOW_PRIVATE)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit

from ..runtime import Runtime
from ..tools.fetcher import private_allowed

if TYPE_CHECKING:
    import httpx

PUSH_TIMEOUT_S = 10.0
"""One notification's bound, connection and answer included."""
_PORTS = {"http": 80, "https": 443}


class Push:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @property
    def offered(self) -> bool:
        return bool(self._rt.settings.a2a_push_urls)

    async def allowed(self, url: str) -> bool:
        """Whether `url` is under one of the allowed prefixes: the same scheme, host and port, and
        a path at or below the prefix's (no `.` or `..` segments, no credentials)."""
        wanted = _parts(url)
        if wanted is None or wanted.username or wanted.password:
            return False
        path = wanted.path or "/"
        if "%2e" in path.lower() or any(segment in (".", "..") for segment in path.split("/")):
            return False
        for prefix in self._rt.settings.a2a_push_urls:
            allowed = _parts(prefix)
            if allowed is None or _origin(allowed) != _origin(wanted):
                continue
            base = allowed.path.rstrip("/")
            if path == base or path.startswith(base + "/"):
                return True
        return False

    def client(self) -> httpx.AsyncClient:
        """An httpx client whose every request goes through the checked fetcher's transport."""
        import httpx  # on first use: see tools/checked_fetch.py

        from ..tools.checked_fetch import CheckedTransport

        return httpx.AsyncClient(
            transport=CheckedTransport(private_allowed()), timeout=PUSH_TIMEOUT_S, trust_env=False
        )


def _parts(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError:
        return None
    return parts if parts.scheme in _PORTS and parts.hostname else None


def _origin(parts: SplitResult) -> tuple[str, str, int]:
    return parts.scheme, (parts.hostname or "").lower(), parts.port or _PORTS[parts.scheme]
