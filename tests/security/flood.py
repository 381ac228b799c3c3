"""What the flood tests add to the attackers of a3s_agent.testing.flood: a server started with
1,024 open files, this process's own limit raised (or the test skipped), and the check a user makes."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from a3s_agent.testing.flood import SERVER_NOFILE, TooFewOpenFiles
from a3s_agent.testing.flood import raise_own_open_files_limit as raise_limit


def limited_to(nofile: int = SERVER_NOFILE, hard_limit_too: bool = True) -> tuple[str, ...]:
    """A GuardedServer prefix that starts the server with `nofile` open files (soft, and hard too)."""
    limits = f"ulimit -Sn {nofile}" + (f" && ulimit -Hn {nofile}" if hard_limit_too else "")
    return ("sh", "-c", f'{limits} && exec "$@"', "sh")  # exec: the server keeps the pid


def raise_own_open_files_limit(needed: int) -> None:
    """This process's limit of open files raised to `needed`, or the test skipped where the hard
    limit is lower."""
    try:
        raise_limit(needed)
    except TooFewOpenFiles as exc:
        pytest.skip(str(exc))


async def healthz(port: int, within_s: float) -> int:
    """The status of /healthz from a fresh client, retried while the server turns connections away."""
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
        while True:
            try:
                async with client.get(f"http://127.0.0.1:{port}/healthz") as reply:
                    if reply.status != 503 or time.monotonic() > deadline:
                        return reply.status
            except (aiohttp.ClientError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)
