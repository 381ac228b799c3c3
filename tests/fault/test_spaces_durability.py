"""The Agent Spaces store syncs its commits as the session store does (both are core/sqlite.py's):
with A3S_DURABILITY=full each run's events are synced before the reply, with =normal none are.

Watched as test_durability.py watches the session store: a real `a3s-agent serve` under strace.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from .test_durability import TracedServer, _position, _stub, _tool, needs_strace

pytestmark = pytest.mark.fault

RUNS = 4


def _spaces_wal_syncs(calls: list[tuple[int, str, str]]) -> int:
    return sum(call in ("fsync", "fdatasync") and "spaces.db-wal>" in args for _, call, args in calls)


@needs_strace
@pytest.mark.parametrize("setting", ["full", "normal"])
async def test_each_space_run_is_synced_unless_durability_is_normal(tmp_path: Path, setting: str) -> None:
    server = TracedServer(tmp_path, env={"A3S_DURABILITY": setting})
    batch = {"protocolVersion": "1.0", "operations": [{"type": "message", "content": "hello"}]}
    try:
        server.start()
        channel, stub = _stub(server)
        with channel:
            async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{server.http_port}") as http:
                space = {"spaceId": "s1", "workspace": str(server.workspace.resolve())}
                async with http.post("/v1/spaces", json=space) as reply:
                    assert reply.status == 201, await reply.text()
                # write_file calls mark the trace: everything between them is the runs' doing.
                _tool(stub, "write_file", path="before.txt", content="x")
                for _ in range(RUNS):
                    async with http.post("/v1/spaces/s1/runs", json=batch) as reply:
                        assert (await reply.json())["status"] == "completed"
                _tool(stub, "write_file", path="after.txt", content="x")
        server.kill()
        calls = server.calls()
        during = calls[_position(calls, '"before.txt"') : _position(calls, '"after.txt"')]
        if setting == "full":
            assert _spaces_wal_syncs(during) >= RUNS, during
        else:
            assert _spaces_wal_syncs(during) == 0, during
    finally:
        server.kill()
