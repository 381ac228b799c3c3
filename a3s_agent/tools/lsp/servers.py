"""The server's language servers: at most one per workspace and language, started on demand (or
asked for), stopped once idle for `idle_s`, when asked, and all of them at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from ...base.errors import FailedPrecondition, ResourceExhausted
from ..workspace_paths import workspace_root
from .catalog import Catalog, Language
from .types import ServerInfo

if TYPE_CHECKING:  # lsprotocol takes most of a second to import: only once a server starts
    from .client import LanguageServer

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 600.0
DEFAULT_MAX_SERVERS = 8

Key = tuple[Path, str]  # (workspace, language name)


class LanguageServers:
    """Language servers by workspace and language. `env`: what a tool process's environment gets
    added (Initialize's env), read at each start."""

    def __init__(
        self,
        catalog: Catalog,
        env: Callable[[], Mapping[str, str]] = dict,
        idle_s: float = DEFAULT_IDLE_S,
        max_servers: int = DEFAULT_MAX_SERVERS,
    ) -> None:
        self.catalog = catalog
        self._env = env
        self.idle_s = idle_s
        self.max_servers = max_servers
        self._servers: dict[Key, LanguageServer] = {}
        self._starting: dict[Key, asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    # --- finding and starting -----------------------------------------------------------------

    def running(self, workspace: Path, language: Language) -> LanguageServer | None:
        """The server of `language` for `workspace` if one runs (no start)."""
        server = self._servers.get((workspace_root(workspace), language.name))
        return server if server is not None and server.running else None

    def running_for_file(self, workspace: Path, path: PurePath) -> LanguageServer | None:
        """The running server for a file's language in `workspace`; None when none runs or no
        server is known for the file's kind."""
        try:
            language, _ = self.catalog.of_file(path, "path")
        except FailedPrecondition:
            return None
        return self.running(workspace, language)

    def running_in(self, workspace: Path) -> list[LanguageServer]:
        """Every running server of `workspace`."""
        root = workspace_root(workspace)
        return [s for (where, _), s in self._servers.items() if where == root and s.running]

    async def server(self, workspace: Path, language: Language) -> LanguageServer:
        """The server of `language` for `workspace`, started if none runs (a dead one replaced).
        FailedPrecondition when none is installed, ResourceExhausted past `max_servers`,
        Unavailable when it does not start."""
        if self._closed:
            raise FailedPrecondition("the server is shutting down")
        key = (workspace_root(workspace), language.name)
        lock = self._starting.setdefault(key, asyncio.Lock())
        try:
            return await self._started(key, language, lock)
        finally:
            if key not in self._servers and not lock.locked():  # a refused start leaves nothing behind
                self._starting.pop(key, None)

    async def _started(self, key: Key, language: Language, lock: asyncio.Lock) -> LanguageServer:
        async with lock:
            server = self._servers.get(key)
            if server is not None and server.running:
                server.last_used = time.monotonic()
                return server
            if server is not None:
                log.warning("language server %s for %s ended; starting it again", server.name, key[0])
                await self._drop(key)
            if len(self._servers) >= self.max_servers:
                raise ResourceExhausted(
                    f"{self.max_servers} language servers run, the most this server runs at once:"
                    " stop one (StopLspServer) or wait until one is idle"
                )
            from .client import LanguageServer

            server = LanguageServer(language, key[0], self._env())
            await server.start()
            other = self._servers.get(key)
            if other is not None and other.running:  # started meanwhile under a lock dropped after a refusal
                await server.stop()
                return other
            self._servers[key] = server
            log.info("language server %s started for %s (%s)", server.name, key[0], language.name)
            self._watch()
            return server

    def servers(self) -> list[ServerInfo]:
        return [server.info() for server in self._servers.values()]

    def all(self) -> list[LanguageServer]:
        return [server for server in self._servers.values() if server.running]

    # --- stopping -----------------------------------------------------------------------------

    async def stop(self, language: Language) -> int:
        """Stop every server of `language`; how many there were."""
        keys = [key for key in self._servers if key[1] == language.name]
        for key in keys:
            await self._drop(key)
        return len(keys)

    async def _drop(self, key: Key) -> None:
        server = self._servers.pop(key, None)
        if server is not None:
            await server.stop()
            log.info("language server %s for %s stopped", server.name, key[0])

    def _watch(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._stop_idle())

    async def _stop_idle(self) -> None:
        """Stop servers unused for idle_s (and dead ones), until none is left."""
        while self._servers:
            await asyncio.sleep(min(max(self.idle_s / 4, 0.05), 30.0))
            now = time.monotonic()
            for key, server in list(self._servers.items()):
                if now - server.last_used >= self.idle_s or not server.running:
                    await self._drop(key)

    async def close(self) -> None:
        """At shutdown: every server asked to exit, then killed."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self._drop(key) for key in list(self._servers)))
