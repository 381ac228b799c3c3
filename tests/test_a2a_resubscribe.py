"""A2A tasks kept in the session store: a task outlives the server that took its first message, and
a client that lost its stream resubscribes on any replica, or on the server restarted after a
kill, and is shown the task and then the rest of the run, nothing lost and nothing twice."""

from __future__ import annotations

import signal
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

import pytest
from a2a.helpers.proto_helpers import get_artifact_text, get_message_text
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError, UnsupportedOperationError

from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import ServerProcess, eventually
from .test_a2a import a2a_client, a2a_env, ask, final_task, streaming_task

BEFORE, AFTER = "Before the command. ", "After the command."


def replica(tmp_path: Path, name: str, fake: FakeLLM, workspace: Path, **more: str) -> ServerProcess:
    return ServerProcess(workspace, tmp_path / f"data-{name}", a2a_env(fake, A3S_REPLICA_ID=name, **more))


def waiting_command(workspace: Path) -> tuple[str, Path, Path]:
    """A bash command that says it runs (`started`) and ends once `go` exists."""
    go, started = workspace / "go", workspace / "started"
    command = f"touch {started}; for i in $(seq 600); do [ -f {go} ] && break; sleep 0.1; done; echo went"
    return command, go, started


def texts(task: Task) -> str:
    return "".join(get_artifact_text(a, "") for a in task.artifacts if a.artifact_id == "response")


async def until_text(stream: AsyncGenerator[StreamResponse, None], wanted: str) -> str:
    """Read the stream until its response artifacts hold `wanted`; what they held."""
    seen = ""
    async for response in stream:
        if (
            response.HasField("artifact_update")
            and response.artifact_update.artifact.artifact_id == "response"
        ):
            seen += get_artifact_text(response.artifact_update.artifact, "")
        if seen == wanted:
            return seen
    raise AssertionError(f"the stream ended with {seen!r}")


def resumed(first: StreamResponse, rest: list[StreamResponse]) -> str:
    """The response text the resubscriber was shown: the task's, then the updates after it."""
    assert first.HasField("task"), first  # the protocol's first event
    updates = [
        get_artifact_text(r.artifact_update.artifact, "")
        for r in rest
        if r.HasField("artifact_update") and r.artifact_update.artifact.artifact_id == "response"
    ]
    return texts(first.task) + "".join(updates)


async def test_a_stream_lost_on_one_replica_is_resumed_on_another_whole(
    tmp_path: Path, fake: FakeLLM, postgres_url: str
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    command, go, started = waiting_command(workspace)
    fake.script(tool_call("bash", {"command": command}, content=BEFORE), text(AFTER))
    a = replica(tmp_path, "a", fake, workspace, A3S_STORE=postgres_url)
    b = replica(tmp_path, "b", fake, workspace, A3S_STORE=postgres_url)
    try:
        a.start(timeout_s=30)
        b.start(timeout_s=30)
        base_a, base_b = (f"http://127.0.0.1:{s.http_port}" for s in (a, b))
        async with a2a_client(base_a, streaming=True) as on_a, a2a_client(base_b, streaming=True) as on_b:
            stream, task_id = await streaming_task(on_a, ask("work", context_id="ctx-replicas"))
            assert await until_text(stream, BEFORE) == BEFORE
            await eventually(started.exists, "the run's tool runs", within_s=30)
            await stream.aclose()  # the client lost its stream on replica a

            resubscribed = cast(
                AsyncGenerator[StreamResponse, None], on_b.subscribe(SubscribeToTaskRequest(id=task_id))
            )
            first = await anext(resubscribed)
            assert first.task.status.state == TaskState.TASK_STATE_WORKING
            go.touch()
            rest = [response async for response in resubscribed]
            assert resumed(first, rest) == BEFORE + AFTER
            assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

            for client in (on_a, on_b):  # both replicas answer for the task, as it ended
                got = await client.get_task(GetTaskRequest(id=task_id))
                assert got.status.state == TaskState.TASK_STATE_COMPLETED, got.status
                assert texts(got) == BEFORE + AFTER
                # An ended task is not followed again, and an id no replica knows is not found.
                with pytest.raises(UnsupportedOperationError, match="terminal state"):
                    await anext(client.subscribe(SubscribeToTaskRequest(id=task_id)))
                with pytest.raises(TaskNotFoundError):
                    await anext(client.subscribe(SubscribeToTaskRequest(id=f"{task_id}-forged")))
    finally:
        for server in (a, b):
            if server.proc is not None and server.proc.poll() is None:
                server.stop()


async def test_tasks_outlive_a_killed_server_and_a_resubscription_sees_how_the_run_ended(
    tmp_path: Path, fake: FakeLLM
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    command, _, started = waiting_command(workspace)
    fake.script(text("The first answer."), tool_call("bash", {"command": command}, content=BEFORE))
    first = replica(tmp_path, "one", fake, workspace).start(timeout_s=30)
    async with a2a_client(f"http://127.0.0.1:{first.http_port}", streaming=True) as client:
        done, _ = await final_task(client, ask("answer", context_id="ctx-restart"))
        stream, task_id = await streaming_task(client, ask("work", context_id="ctx-restart"))
        await until_text(stream, BEFORE)
        await eventually(started.exists, "the run's tool runs", within_s=30)
        first.stop(signal.SIGKILL)
        await stream.aclose()

    again = replica(tmp_path, "one", fake, workspace)  # the same data dir
    fake.script(text("Still here."))
    try:
        again.start(timeout_s=30)
        async with a2a_client(f"http://127.0.0.1:{again.http_port}", streaming=True) as client:
            kept = await client.get_task(GetTaskRequest(id=done.id))
            assert kept.status.state == TaskState.TASK_STATE_COMPLETED
            assert get_message_text(kept.status.message) == "The first answer."

            resubscribed = cast(
                AsyncGenerator[StreamResponse, None], client.subscribe(SubscribeToTaskRequest(id=task_id))
            )
            shown = await anext(resubscribed)
            rest = [response async for response in resubscribed]
            assert resumed(shown, rest) == BEFORE  # what the run said before the kill, once
            ended = rest[-1].status_update.status
            assert ended.state == TaskState.TASK_STATE_FAILED, ended
            assert "the replica running it (one) stopped" in get_message_text(ended.message)
            got = await client.get_task(GetTaskRequest(id=task_id))
            assert got.status.state == TaskState.TASK_STATE_FAILED

            # The context goes on with a new task.
            after, _ = await final_task(client, ask("still there?", context_id="ctx-restart"))
            assert get_message_text(after.status.message) == "Still here."
    finally:
        if again.proc is not None and again.proc.poll() is None:
            again.stop()
