"""One session on every standard face, on one sequence: a run started over A2A is followed over
gRPC from its first chunk, steered from an ACP v2 editor (another replica on the same PostgreSQL),
and resumed over SSE after the last chunk gRPC saw; what the faces saw, put together, is the log's
every chunk exactly once, the steer among them, and A2A's task ends with the steered answer."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from a2a.types.a2a_pb2 import TaskState

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, tool_call

from .conftest import ServerProcess, eventually
from .test_a2a import TOKEN, a2a_client, ask, streaming_task
from .test_acp import agent_env
from .test_acp_v2 import V2Client, heard, prompt

SESSION = "one-sequence"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def logged_chunks(http: aiohttp.ClientSession) -> list[dict[str, Any]]:
    async with http.get(f"/sessions/{SESSION}/events", params={"limit": 1000}) as page:
        assert page.status == 200, await page.text()
        return [e for e in (await page.json())["events"] if e["kind"] == "chunk"]


async def test_a_run_started_on_a2a_followed_on_grpc_steered_from_acp_v2_resumed_on_sse(
    tmp_path: Path, fake: FakeLLM, postgres_url: str
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    go, started = workspace / "go", workspace / "started"
    wait = f"touch {started}; for i in $(seq 600); do [ -f {go} ] && break; sleep 0.1; done; echo went"
    fake.script(tool_call("bash", {"command": wait}), heard)
    shared = {"A3S_STORE": postgres_url, "A3S_LLM_RETRIES": "0"}
    server = ServerProcess(
        workspace,
        tmp_path / "data-serve",
        {
            **shared,
            "A3S_LLM_BASE_URL": fake.base_url,
            "A3S_LLM_MODEL": "fake-model",
            "A3S_LLM_API_KEY": "sk-test",
            "A3S_AUTH_TOKEN": TOKEN,
            "A3S_A2A": "1",
            "A3S_REPLICA_ID": "serve",
        },
    )
    stderr = (tmp_path / "acp.stderr.log").open("w")
    editor = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "a3s_agent", "acp"),
        cwd=workspace,
        env={**agent_env(fake, tmp_path / "data-acp"), **shared, "A3S_REPLICA_ID": "editor"},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )
    acp = V2Client(editor)
    base = f"http://127.0.0.1:{server.http_port}"
    try:
        server.start(timeout_s=30)
        async with (
            aiohttp.ClientSession(base_url=base, headers=AUTH) as http,
            a2a_client(base, streaming=True) as a2a,
        ):
            # A2A starts the run; its stream follows the task to its end.
            task_stream, _ = await streaming_task(a2a, ask("work on it", context_id=SESSION))
            await eventually(started.exists, "the run's tool runs", within_s=30)
            first = (await logged_chunks(http))[0]["seq"]  # the tool call's

            # gRPC follows the generation from its first chunk, then drops.
            over_grpc: list[tuple[int, str]] = []
            async with grpc.aio.insecure_channel(server.address) as channel:
                metadata = (("authorization", f"Bearer {TOKEN}"), ("a3s-after-seq", str(first)))
                call = pb_grpc.CodeAgentServiceStub(channel).StreamGenerate(
                    pb.GenerateRequest(session_id=SESSION), metadata=metadata
                )
                async for chunk in call:
                    over_grpc.append(
                        (int(chunk.metadata["seq"]), pb.GenerateChunk.ChunkType.Name(chunk.type))
                    )
                    break  # one chunk live (the tool is still running), then the client is gone
                call.cancel()

            # An ACP v2 editor, another replica, steers the run the server holds.
            init = await acp.result(
                "initialize", {"protocolVersion": 2, "info": {"name": "ed", "version": "1"}}
            )
            assert init["protocolVersion"] == 2
            steered = await acp.result("session/prompt", prompt(SESSION, "answer in French"))
            assert steered["messageId"]
            go.touch()

            # SSE resumes after the last chunk gRPC saw, to the end.
            over_sse: list[tuple[int, str]] = []
            async with http.get(
                f"/sessions/{SESSION}/generate/stream",
                params={"content": "x"},
                headers={"Last-Event-ID": str(over_grpc[-1][0])},
            ) as stream:
                assert stream.status == 200, await stream.text()
                seq = 0
                async for raw in stream.content:
                    line = raw.decode().strip()
                    if line.startswith("id: "):
                        seq = int(line[4:])
                    elif line.startswith("data: ") and seq:
                        data = json.loads(line[6:])
                        over_sse.append((seq, data.get("metadata", {}).get("type") or data["type"]))
                        seq = 0
                    elif line == "event: done":
                        break
            ended = [r async for r in task_stream]
            logged = await logged_chunks(http)
            async with http.get(f"/sessions/{SESSION}/events", params={"limit": 1000}) as page:
                steers = [e for e in (await page.json())["events"] if e.get("message") == "steer_applied"]
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        acp.reader.cancel()
        if editor.returncode is None:
            editor.kill()
        await editor.wait()
        stderr.close()

    print(
        "GRPC",
        over_grpc,
        "SSE",
        over_sse,
        "LOG",
        [(e["seq"], e["chunk"]["type"]) for e in logged],
        "A2A",
        ended[-1],
    )
    seen = over_grpc + over_sse
    assert [s for s, _ in seen] == [e["seq"] for e in logged if e["seq"] > first]  # each once, none lost
    assert seen[-1][1] == "CHUNK_TYPE_DONE"
    assert [kind for _, kind in over_sse].count("steer_applied") == 1  # the steer's notice, once
    assert len(steers) == 1 and steers[0]["data"]["content"] == "answer in French"
    final = ended[-1].status_update.status
    assert final.state == TaskState.TASK_STATE_COMPLETED
    assert fake.requests[-1].messages[-1]["content"] == "answer in French"
    done = next(e for e in logged if e["chunk"]["type"] == "CHUNK_TYPE_DONE")
    assert done["chunk"]["content"] == "heard: answer in French"
