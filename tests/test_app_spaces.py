"""The application layer in process: the Agent Spaces service over the runtime's Spaces (its data
dir, settings and Initialize env), and the calls the coven face and the relay CLI make (ScriptedProvider
as the model)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.app import Application
from a3s_agent.app.lifecycle import InitializeRequest
from a3s_agent.app.standalone import standalone
from a3s_agent.base.errors import FailedPrecondition, NotFound, ResourceExhausted
from a3s_agent.base.models import LLMConfig, Message, SessionConfig
from a3s_agent.config import Settings
from a3s_agent.core.loop.agent import DoneEvent, GenerateOptions
from a3s_agent.core.sessions.control import ConfirmationPolicy
from a3s_agent.core.store.events import EventType
from a3s_agent.runtime import Runtime
from a3s_agent.testing.fake_llm import text
from a3s_agent.tools.builtin import builtin_registry

from .conftest import eventually
from .scripted_model import ScriptedProvider, after

RISKY = {
    "protocolVersion": "1.0",
    "operations": [
        {"type": "createFile", "id": "a", "path": "temp/x.txt", "content": "x"},
        {"type": "shell", "id": "b", "command": "rm -rf temp"},
        {"type": "createFile", "id": "c", "path": "after.txt", "content": "done"},
    ],
}


def ops(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


@pytest.fixture
async def app(workspace: Path, tmp_path: Path) -> AsyncIterator[Application]:
    async with standalone(Settings(workspace=workspace, data_dir=tmp_path / "data", max_space_runs=1)) as app:
        yield app


async def test_a_run_pauses_for_approval_resumes_and_ends(app: Application, workspace: Path) -> None:
    space = await app.spaces.create_space("box", workspace=str(workspace))
    assert (await app.spaces.get_space("box")) == space
    assert space.workspace == workspace  # tmp_path is resolved already
    paused = await app.spaces.start_run("box", RISKY)
    assert paused["status"] == "awaiting_approval" and paused["events"][-1]["operationId"] == "b"
    assert await app.spaces.get_run("box", paused["runId"]) == paused
    resumed = await app.spaces.resume_run(
        "box", paused["runId"], {"operationId": "b", "decision": "approved"}
    )
    assert resumed["status"] == "completed"
    assert [(e["type"], e.get("operationId")) for e in resumed["events"]] == [
        ("shell", "b"),
        ("createFile", "c"),
    ]
    assert not (workspace / "temp").exists() and (workspace / "after.txt").read_text() == "done"
    with pytest.raises(FailedPrecondition, match="only a running run or one awaiting approval"):
        await app.spaces.cancel_run("box", paused["runId"])
    with pytest.raises(NotFound, match="does not exist in space 'box'"):
        await app.spaces.get_run("box", "run_missing")


async def test_a_space_lives_in_a_sessions_workspace_or_its_own(
    app: Application, workspace: Path, tmp_path: Path
) -> None:
    inner = workspace / "inner"
    inner.mkdir()
    view = await app.sessions.create(None, SessionConfig(workspace=str(inner)), [], {})
    assert (await app.spaces.create_space(session_id=view.session.id)).workspace == inner
    with pytest.raises(NotFound, match="session 'nobody' not found"):
        await app.spaces.create_space(session_id="nobody")
    own = await app.spaces.create_space("own")
    assert own.workspace == (tmp_path / "data" / "spaces" / "own" / "workspace").resolve()


async def test_spaces_share_the_runtimes_env_and_limits(app: Application, workspace: Path) -> None:
    """The Initialize env and the gateway's (add_tool_env) reach the shells; max_space_runs holds."""
    await app.lifecycle.initialize(InitializeRequest(env={"FROM_INIT": "init"}))
    app.lifecycle.add_tool_env({"FROM_GATEWAY": "gateway"})
    space = await app.spaces.create_space(workspace=str(workspace))
    done = await app.spaces.start_run(
        space.id, ops({"type": "shell", "command": 'echo "$FROM_INIT $FROM_GATEWAY"'})
    )
    assert done["events"][0]["stdout"] == "init gateway\n"

    slow = asyncio.create_task(
        app.spaces.start_run(space.id, ops({"type": "shell", "command": "touch started; sleep 30"}))
    )
    await eventually(lambda: (workspace / "started").exists(), "the slow command started")
    with pytest.raises(ResourceExhausted, match="1 Agent Spaces runs are already running"):
        await app.spaces.start_run(space.id, ops({"type": "message", "content": "x"}))
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow


async def test_a_paused_run_resumes_in_the_next_runtime_on_the_data_dir(
    workspace: Path, tmp_path: Path
) -> None:
    settings = Settings(workspace=workspace, data_dir=tmp_path / "data")
    async with standalone(settings) as first:
        space = await first.spaces.create_space("kept", workspace=str(workspace))
        paused = await first.spaces.start_run(space.id, RISKY)
    async with standalone(settings) as second:
        assert (await second.spaces.get_run("kept", paused["runId"]))["status"] == "awaiting_approval"
        resumed = await second.spaces.resume_run(
            "kept", paused["runId"], {"operationId": "b", "decision": "denied", "reason": "no"}
        )
    assert [e["type"] for e in resumed["events"]] == ["policyDenied", "createFile"]
    assert (workspace / "temp" / "x.txt").exists()


async def test_run_file_reads_the_message_and_runs_it_in_a_new_space(
    app: Application, workspace: Path
) -> None:
    path = workspace / "ops.json"
    path.write_text('{"protocolVersion": "1.0", "operations": [{"type": "message", "content": "hi"}]}')
    result = await app.spaces.run_file(path, workspace)
    assert result["status"] == "completed" and result["events"][0]["type"] == "message"
    with pytest.raises(NotFound, match="does not exist"):
        await app.spaces.run_file(workspace / "missing.json", workspace)


# --- what the coven face calls --------------------------------------------------------------------


@pytest.fixture
async def scripted_app(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> AsyncIterator[Application]:
    runtime = Runtime(
        Settings(workspace=workspace, data_dir=tmp_path / "data"),
        registry=builtin_registry(),
        connect=scripted.connect,
    )
    await runtime.start()
    try:
        app = Application(runtime)
        await app.lifecycle.initialize(
            InitializeRequest(llm=LLMConfig(provider="openai", model="fake-model"))
        )
        yield app
    finally:
        await runtime.close()


async def test_a_thread_session_is_made_once_with_its_confirmation_policy(scripted_app: Application) -> None:
    app = scripted_app
    policy = ConfirmationPolicy(enabled=True)
    assert await app.sessions.ensure("coven:t1", SessionConfig(name="thread"), policy) is True
    assert await app.sessions.ensure("coven:t1", SessionConfig(name="other")) is False
    assert (await app.sessions.get("coven:t1")).session.config.name == "thread"
    assert (await app.control.confirmation_policy("coven:t1")).enabled
    await app.sessions.append("coven:t1", [Message(role="user", content="context")])
    assert (await app.sessions.get("coven:t1")).usage.message_count == 1


async def test_a_running_generation_is_seen_and_takes_injected_context(
    scripted_app: Application, scripted: ScriptedProvider
) -> None:
    app = scripted_app
    await app.sessions.ensure("s", SessionConfig())
    release = asyncio.Event()
    scripted.script(after(release, text("done")))
    subscription = await app.events.subscription("s", {EventType.GENERATION_STARTED})
    assert not await app.control.inject("s", [Message(role="user", content="too early")])

    async def generate() -> list[object]:
        return [
            e
            async for e in app.generation.stream("s", [Message(role="user", content="go")], GenerateOptions())
        ]

    task = asyncio.create_task(generate())
    await eventually(lambda: scripted.requests, "the model call")
    assert app.control.runs_in("s", task) and not app.control.runs_in("nobody", task)
    assert await app.control.inject("s", [Message(role="user", content="later")])
    release.set()
    done = (await task)[-1]
    assert isinstance(done, DoneEvent) and done.generation.message.content == "done"
    async with asyncio.timeout(5):
        started = await anext(aiter(subscription))
    subscription.close()
    assert started.type is EventType.GENERATION_STARTED and started.session_id == "s"
