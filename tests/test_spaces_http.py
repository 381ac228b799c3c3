"""Agent Spaces over HTTP: spaces, runs, the approval round trip across a server restart, and `a3s-agent ops`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from a3s_agent.app import Application
from a3s_agent.config import DEFAULT_MAX_SPACE_RUNS, SandboxSettings, Settings
from a3s_agent.faces.http import start_http
from a3s_agent.faces.http.spaces import spaces_routes

from .conftest import LiveServer, eventually, running

RISKY = {
    "protocolVersion": "1.0",
    "operations": [
        {"type": "createFile", "id": "a", "path": "temp/x.txt", "content": "x"},
        {"type": "shell", "id": "b", "command": "rm -rf temp"},
        {"type": "createFile", "id": "c", "path": "after.txt", "content": "done"},
    ],
}


@dataclass
class SpacesServer:
    live: LiveServer
    http: aiohttp.ClientSession


@asynccontextmanager
async def spaces_server(
    workspace: Path,
    data: Path,
    *,
    max_runs: int = DEFAULT_MAX_SPACE_RUNS,
    sandbox: SandboxSettings | None = None,
) -> AsyncIterator[SpacesServer]:
    """The server's runtime (with its Spaces service on the data dir) and the HTTP face with the
    space routes, as server.py assembles them; `sandbox` the operator's sandbox settings."""
    settings = Settings(
        listen="127.0.0.1:0",
        workspace=workspace,
        data_dir=data,
        max_space_runs=max_runs,
        sandbox=sandbox or SandboxSettings(),
    )
    async with running(settings) as server:
        runtime = server.runtime
        app = Application(runtime)
        listener = await start_http(app, "127.0.0.1:0", extra_routes=spaces_routes(app))
        try:
            async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{listener.port}") as client:
                yield SpacesServer(server, client)
        finally:
            await listener.stop()


@asynccontextmanager
async def serving(
    workspace: Path, data: Path, sandbox: SandboxSettings | None = None
) -> AsyncIterator[aiohttp.ClientSession]:
    async with spaces_server(workspace, data, sandbox=sandbox) as served:
        yield served.http


async def test_a_run_waits_for_approval_and_resumes_after_a_restart(workspace: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with serving(workspace, data) as http:
        async with http.post("/v1/spaces", json={"spaceId": "box1", "workspace": str(workspace)}) as reply:
            assert reply.status == 201 and (await reply.json())["spaceId"] == "box1"
        async with http.post("/v1/spaces/box1/runs", json=RISKY) as reply:
            paused = await reply.json()
        assert paused["status"] == "awaiting_approval"
        assert [e["type"] for e in paused["events"]] == ["createFile", "approvalRequired"]
        assert paused["events"][-1]["operationId"] == "b"
        assert (workspace / "temp" / "x.txt").exists()
    async with serving(workspace, data) as http:  # a new server on the same data dir
        run = f"/v1/spaces/box1/runs/{paused['runId']}"
        async with http.get(run) as reply:
            assert (await reply.json())["status"] == "awaiting_approval"
        approval = {"approval": {"operationId": "b", "decision": "approved", "reason": "scratch dir"}}
        async with http.post(f"{run}/resume", json=approval) as reply:
            resumed = await reply.json()
        assert resumed["status"] == "completed"
        assert [(e["type"], e.get("operationId")) for e in resumed["events"]][-2:] == [
            ("shell", "b"),
            ("createFile", "c"),
        ]
        assert not (workspace / "temp").exists() and (workspace / "after.txt").read_text() == "done"
        async with http.post(f"{run}/resume", json=approval) as reply:
            assert reply.status == 409  # nothing is waiting any more
            assert (await reply.json())["error"]["code"] == "FAILED_PRECONDITION"


async def test_denial_validation_errors_and_unknown_spaces(workspace: Path, tmp_path: Path) -> None:
    async with serving(workspace, tmp_path / "data") as http:
        async with http.post("/v1/spaces", json={"policy": "standard"}) as reply:
            space = (await reply.json())["spaceId"]
        message = {
            "protocolVersion": "1.0",
            "operations": [
                {"type": "shell", "id": "s", "command": "sudo ls"},
                {"type": "createFile", "id": "bad", "path": "../escape.txt", "content": "x"},
                {"type": "message", "id": "m", "content": "hello"},
            ],
        }
        async with http.post(f"/v1/spaces/{space}/runs", json=message) as reply:
            result = await reply.json()
        kinds = [e["type"] for e in result["events"]]
        assert kinds == ["policyDenied", "error", "message"]
        assert result["events"][1]["category"] == "validation"
        async with http.post(
            f"/v1/spaces/{space}/runs", json={"protocolVersion": "2.0", "operations": []}
        ) as reply:
            assert reply.status == 400 and "protocolVersion" in (await reply.json())["error"]["message"]
        json_type = {"Content-Type": "application/json"}
        async with http.post(f"/v1/spaces/{space}/runs", data=b"{nope", headers=json_type) as reply:
            assert reply.status == 400
        async with http.get("/v1/spaces/nowhere") as reply:
            assert reply.status == 404 and (await reply.json())["error"]["code"] == "NOT_FOUND"


async def test_a_deleted_space_is_gone_with_its_runs_and_its_own_directory(
    workspace: Path, tmp_path: Path
) -> None:
    # A space in a directory of its own and one over a workspace it was given: deleting either
    # drops the space and its runs (a run awaiting approval included); only the own directory goes.
    data = tmp_path / "data"
    async with serving(workspace, data) as http:
        async with http.post("/v1/spaces", json={"spaceId": "own"}) as reply:
            own_dir = Path((await reply.json())["workspace"])
        async with http.post("/v1/spaces", json={"spaceId": "given", "workspace": str(workspace)}) as reply:
            assert reply.status == 201
        async with http.post("/v1/spaces/given/runs", json=RISKY) as reply:
            paused = await reply.json()
        assert paused["status"] == "awaiting_approval" and (workspace / "temp" / "x.txt").exists()
        assert await asyncio.to_thread(own_dir.exists) and own_dir.is_relative_to(data)
        for space in ("own", "given"):
            async with http.delete(f"/v1/spaces/{space}") as reply:
                assert reply.status == 204
            async with http.get(f"/v1/spaces/{space}") as reply:
                assert reply.status == 404
            async with http.delete(f"/v1/spaces/{space}") as reply:
                assert reply.status == 404 and (await reply.json())["error"]["code"] == "NOT_FOUND"
        async with http.get(f"/v1/spaces/given/runs/{paused['runId']}") as reply:
            assert reply.status == 404
        assert not own_dir.parent.exists()  # data/spaces/own
        assert (workspace / "temp" / "x.txt").exists()  # a given workspace is never removed
        async with http.post("/v1/spaces", json={"spaceId": "given"}) as reply:
            assert reply.status == 201  # the id is free again
        async with http.delete("/v1/spaces/bad%00id") as reply:
            assert reply.status == 400 and "spaceId" in (await reply.json())["error"]["message"]


async def test_a_space_with_a_run_executing_is_not_deleted(workspace: Path, tmp_path: Path) -> None:
    started, gate = workspace / "started", workspace / "gate"
    command = f"touch {started.name}; while [ ! -e {gate.name} ]; do sleep 0.05; done"
    waits = {"protocolVersion": "1.0", "operations": [{"type": "shell", "id": "w", "command": command}]}
    async with serving(workspace, tmp_path / "data") as http:
        async with http.post("/v1/spaces", json={"spaceId": "busy", "workspace": str(workspace)}) as reply:
            assert reply.status == 201
        running = asyncio.create_task(http.post("/v1/spaces/busy/runs", json=waits))
        try:
            await eventually(started.exists, "the run executes")
            async with http.delete("/v1/spaces/busy") as reply:
                assert reply.status == 409 and "cancel it" in (await reply.json())["error"]["message"]
        finally:
            gate.touch()
            async with await running as reply:
                assert (await reply.json())["status"] == "completed"
        async with http.delete("/v1/spaces/busy") as reply:
            assert reply.status == 204


def test_the_ops_command_prints_the_events(tmp_path: Path) -> None:
    (tmp_path / "ops.json").write_text(json.dumps(RISKY))
    result = subprocess.run(
        [sys.executable, "-m", "a3s_agent", "ops", str(tmp_path / "ops.json"), "--workspace", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # the run awaits an approval the command cannot give
    events = json.loads(result.stdout)
    assert events["status"] == "awaiting_approval" and events["events"][0]["path"] == "temp/x.txt"
    bad = subprocess.run(
        [sys.executable, "-m", "a3s_agent", "ops", str(tmp_path / "missing.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "missing.json" in bad.stderr
