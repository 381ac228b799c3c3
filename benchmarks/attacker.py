"""The attacker of the `flood` section, in a process of its own so that its work does not slow the
measuring client: `python -m benchmarks.attacker PORT...` holds FLOOD silent connections per port,
reopened as the server closes them. It prints `connected` once every one got through (or after
60 s); SIGUSR1 stops the reconnecting (the connections held stay open), SIGTERM ends it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

from a3s_agent.testing.flood import FLOOD, Flood, raise_own_open_files_limit


async def attack(ports: list[int]) -> None:
    raise_own_open_files_limit(len(ports) * FLOOD + 256)
    loop = asyncio.get_running_loop()
    stop_reconnecting, end = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, stop_reconnecting.set)
    loop.add_signal_handler(signal.SIGTERM, end.set)
    flood = Flood(ports)
    try:
        with contextlib.suppress(TimeoutError):  # a server out of files accepts no more
            await asyncio.wait_for(flood.until_all_connected(), 60)
        print("connected", flush=True)
        await stop_reconnecting.wait()
        await flood.stop_reconnecting()
        await end.wait()
    finally:
        await flood.close()


if __name__ == "__main__":
    asyncio.run(attack([int(port) for port in sys.argv[1:]]))
