"""Connection floods against a real `a3s-agent serve` started with 1,024 open files: attackers
that hold idle or slowloris connections (for the flood tests and the benchmark's `flood` section)."""

from __future__ import annotations

import asyncio
import os
import resource
from typing import Any

FLOOD = 1100
"""Connections held open at once on a port: more than the server's 1,024 open files."""
SERVER_NOFILE = 1024
RECONNECT_S = 0.2


class TooFewOpenFiles(Exception):
    """This process may not open as many files as the flood needs (its hard limit is lower)."""


def raise_own_open_files_limit(needed: int) -> None:
    """Raise this process's soft limit of open files to `needed`; TooFewOpenFiles if the hard
    limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise TooFewOpenFiles(f"the flood opens {needed} files; the hard limit here is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Flood:
    """`per_port` attacker connections on each of `ports`, each opened again whenever the server
    closes it: idle, or (every second one, with `slowloris`) sending a request header a byte at a
    time. `stop_reconnecting` ends the reconnecting; the connections then held stay open (as an
    attacker that opened them once and went quiet) until `close`."""

    def __init__(self, ports: list[int], per_port: int = FLOOD, slowloris: bool = False) -> None:
        self._stop = asyncio.Event()
        self._connected = [asyncio.Event() for _ in range(per_port * len(ports))]
        self._left_open: list[asyncio.StreamWriter] = []
        self._tasks = [
            asyncio.create_task(self._hold(ports[i % len(ports)], slowloris and i % 2 == 1, connected))
            for i, connected in enumerate(self._connected)
        ]

    def all_connected(self) -> bool:
        """Whether every attacker has got through at least once."""
        return all(connected.is_set() for connected in self._connected)

    async def until_all_connected(self) -> None:
        await asyncio.gather(*(connected.wait() for connected in self._connected))

    async def stop_reconnecting(self) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), 30)

    async def close(self) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 30)
        for writer in self._left_open:
            writer.close()

    async def _hold(self, port: int, slow: bool, connected: asyncio.Event) -> None:
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            while not stopped.done():
                connecting = asyncio.ensure_future(asyncio.open_connection("127.0.0.1", port))
                await asyncio.wait({connecting, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not connecting.done():  # a connect the server's backlog holds up, given up
                    connecting.cancel()
                    return
                try:
                    reader, writer = connecting.result()
                except OSError:
                    await asyncio.sleep(RECONNECT_S)
                    continue
                connected.set()
                if not await self._until_closed(reader, writer, slow, stopped):
                    self._left_open.append(writer)
                    return
                writer.close()
                await asyncio.sleep(RECONNECT_S)
        finally:
            stopped.cancel()

    @staticmethod
    async def _until_closed(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        slow: bool,
        stopped: asyncio.Future[Any],
    ) -> bool:
        """Hold the connection until the server closes it (True) or the attack stops (False)."""
        if slow:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        while not stopped.done():
            if slow:
                writer.write(b"x")
            read = asyncio.ensure_future(reader.read(4096))
            await asyncio.wait(
                {read, stopped}, timeout=0.5 if slow else None, return_when=asyncio.FIRST_COMPLETED
            )
            read.cancel()
            if read.done() and not read.cancelled():
                try:
                    if read.result() == b"":
                        return True
                except OSError:
                    return True
        return False
