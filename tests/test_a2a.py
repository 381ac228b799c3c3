"""The A2A face of a real `a3s-agent serve --a2a` process, driven by the a2a SDK's own client over
JSON-RPC: the agent card, message/send and message/stream onto a session, a task that waits for
input answered by the next message, a task cancelled mid-run, resubscription, and the token."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import aiohttp
import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.helpers.proto_helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from aiohttp import web

from a3s_agent.config import ConfigError, check_serving, settings_from
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import ServerProcess, alive, eventually, host_pid

TOKEN = "a2a-test-token"


@pytest.fixture
def served(tmp_path: Path, fake: FakeLLM) -> Iterator[ServerProcess]:
    with serving(tmp_path, fake) as server:
        yield server


def a2a_env(fake: FakeLLM, **more: str) -> dict[str, str]:
    """The variables of a server with `--a2a`, the fake model and TOKEN (`more`: added)."""
    return {
        "A3S_LLM_BASE_URL": fake.base_url,
        "A3S_LLM_MODEL": "fake-model",
        "A3S_LLM_API_KEY": "sk-test",
        "A3S_LLM_RETRIES": "0",
        "A3S_AUTH_TOKEN": TOKEN,
        "A3S_A2A": "1",
        **more,
    }


@contextmanager
def serving(tmp_path: Path, fake: FakeLLM, **more: str) -> Iterator[ServerProcess]:
    """`a3s-agent serve --a2a` with the fake model, behind TOKEN (`more`: variables added)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "README.md").write_text("a project, not a git work tree\n")
    server = ServerProcess(workspace, tmp_path / "data", env=a2a_env(fake, A3S_GRACE_SECONDS="0.5", **more))
    server.proc = subprocess.Popen(
        server.command(), env=server.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


async def ready(server: ServerProcess) -> str:
    base = f"http://127.0.0.1:{server.http_port}"
    async with aiohttp.ClientSession(base_url=base) as http:

        async def answers() -> bool:
            assert server.proc is not None and server.proc.poll() is None, "the server exited"
            try:
                async with http.get("/health/ready") as response:
                    return response.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await eventually(answers, "the server is ready", within_s=30)
    return base


@asynccontextmanager
async def a2a_client(base: str, *, streaming: bool) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        factory = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming))
        client = await factory.create_from_url(base)
        try:
            yield client
        finally:
            await client.close()


def ask(prompt: str, *, context_id: str = "", task_id: str = "") -> SendMessageRequest:
    message = new_text_message(
        prompt, context_id=context_id or None, task_id=task_id or None, role=Role.ROLE_USER
    )
    return SendMessageRequest(message=message)


async def final_task(client: Client, request: SendMessageRequest) -> tuple[Task, list[StreamResponse]]:
    """Send, collect what the stream said, and the task as it is at the end of the turn."""
    seen = [response async for response in client.send_message(request)]
    task_ids = {r.task.id for r in seen if r.HasField("task")} | {
        r.status_update.task_id for r in seen if r.HasField("status_update")
    }
    assert len(task_ids) == 1, seen
    return await client.get_task(GetTaskRequest(id=task_ids.pop())), seen


async def streaming_task(
    client: Client, request: SendMessageRequest
) -> tuple[AsyncGenerator[StreamResponse, None], str]:
    """The stream of a message sent, once it has named its task, and the task's id."""
    stream = cast(AsyncGenerator[StreamResponse, None], client.send_message(request))
    first = await anext(stream)
    return stream, first.task.id if first.HasField("task") else first.status_update.task_id


async def test_the_card_is_open_and_names_the_token_and_the_agents(served: ServerProcess) -> None:
    base = await ready(served)
    async with aiohttp.ClientSession(base_url=base) as http:
        async with http.get("/.well-known/agent-card.json") as response:
            assert response.status == 200
            card = await response.json()
        async with http.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"}) as response:
            assert response.status == 401
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["supportedInterfaces"][0]["url"] == f"{base}/a2a"
    assert card["capabilities"]["streaming"] is True
    assert [skill["id"] for skill in card["skills"]] == ["coding"]  # the workspace's are for the token
    assert card["capabilities"]["extendedAgentCard"] is True
    async with a2a_client(base, streaming=False) as client:
        extended = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    names = {skill.id for skill in extended.skills}
    assert "coding" in names and any(name.startswith("agent:") for name in names), names


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_message_runs_a_generation_of_the_context_session_with_the_changes(
    served: ServerProcess, fake: FakeLLM, streaming: bool
) -> None:
    fake.script(
        tool_call("write_file", {"path": "notes.md", "content": "# notes\n"}),
        text("Wrote notes.md."),
        text("It has one heading."),
    )
    base = await ready(served)
    async with a2a_client(base, streaming=streaming) as client:
        task, seen = await final_task(client, ask("Write notes.md", context_id="ctx-1"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.context_id == "ctx-1"
        assert get_message_text(task.status.message) == "Wrote notes.md."
        artifacts = {a.artifact_id: a for a in task.artifacts}
        assert get_artifact_text(artifacts["response"], "") == "Wrote notes.md."
        assert list(artifacts["changes"].metadata["files"]) == ["notes.md"]
        assert "+# notes" in artifacts["changes"].parts[0].text
        if streaming:
            assert any(r.HasField("artifact_update") for r in seen), seen
        # The same context is the same session: the model sees the first exchange.
        second, _ = await final_task(client, ask("And now?", context_id="ctx-1"))
        assert second.id != task.id and second.status.state == TaskState.TASK_STATE_COMPLETED
    said = [m.get("content") for m in fake.requests[-1].messages]
    assert "Write notes.md" in said and "And now?" in said
    assert (served.workspace / "notes.md").read_text() == "# notes\n"


async def test_a_question_waits_for_input_and_the_next_message_answers_it(
    served: ServerProcess, fake: FakeLLM
) -> None:
    fake.script(
        tool_call("ask_user", {"question": "Which name?", "options": ["Ada", "Bob"]}),
        text("Named it Bob."),
    )
    base = await ready(served)
    async with a2a_client(base, streaming=True) as client:
        task, _ = await final_task(client, ask("Name the thing", context_id="ctx-ask"))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert get_message_text(task.status.message) == "Which name? (Ada / Bob)"
        answered, _ = await final_task(client, ask("Bob", context_id="ctx-ask", task_id=task.id))
        assert answered.id == task.id
        assert answered.status.state == TaskState.TASK_STATE_COMPLETED
        assert get_message_text(answered.status.message) == "Named it Bob."
    tool_results = [m for m in fake.requests[-1].messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_results] == ["Bob"]


def over_rest(base: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"})


async def confirming(http: aiohttp.ClientSession, session_id: str, policy: dict[str, Any]) -> None:
    """The session `session_id`, made over REST with the confirmation `policy`."""
    async with http.post("/sessions", json={"session_id": session_id}) as response:
        assert response.status == 201, await response.text()
    body = {"session_id": session_id, "policy": policy}
    async with http.post("/rpc/SetConfirmationPolicy", json=body) as response:
        assert response.status == 200, await response.text()


@pytest.mark.parametrize(("reply", "written"), [("yes", True), ("No, not that file.", False)])
async def test_a_tool_confirmation_waits_for_input_and_the_reply_approves_or_rejects(
    served: ServerProcess, fake: FakeLLM, reply: str, written: bool
) -> None:
    fake.script(tool_call("write_file", {"path": "out.txt", "content": "x\n"}), text("Finished."))
    base = await ready(served)
    async with over_rest(base) as http:
        await confirming(http, "ctx-confirm", {"enabled": True, "require_confirm_tools": ["write_file"]})
    async with a2a_client(base, streaming=True) as client:
        task, _ = await final_task(client, ask("Write out.txt", context_id="ctx-confirm"))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert get_message_text(task.status.message).startswith("May I run write_file with")
        answered, _ = await final_task(client, ask(reply, context_id="ctx-confirm", task_id=task.id))
        assert answered.status.state == TaskState.TASK_STATE_COMPLETED
    assert (served.workspace / "out.txt").exists() is written
    result = next(m for m in fake.requests[-1].messages if m["role"] == "tool")
    assert ("rejected by user: No, not that file." in result["content"]) is not written, result


async def test_a_reply_after_the_confirmation_timed_out_finds_the_run_gone_on(
    served: ServerProcess, fake: FakeLLM
) -> None:
    fake.script(tool_call("write_file", {"path": "late.txt", "content": "x\n"}), text("Gave up on it."))
    base = await ready(served)
    async with over_rest(base) as http:
        await confirming(http, "ctx-late", {"enabled": True, "default_timeout_ms": 300})
        async with a2a_client(base, streaming=True) as client:
            task, _ = await final_task(client, ask("Write late.txt", context_id="ctx-late"))
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED

            async def timed_out() -> bool:
                async with http.get("/sessions/ctx-late/events", params={"after_seq": "0"}) as response:
                    page = await response.json()
                return any("CONFIRMATION_TIMEOUT" in str(e) for e in page["events"])

            await eventually(timed_out, "the confirmation timed out")
            answered, _ = await final_task(client, ask("yes", context_id="ctx-late", task_id=task.id))
    assert answered.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_message_text(answered.status.message) == "Gave up on it."
    assert not (served.workspace / "late.txt").exists()


async def test_a_message_to_a_working_task_steers_its_next_model_call(
    served: ServerProcess, fake: FakeLLM
) -> None:
    go = served.workspace / "go"
    started = served.workspace / "started"
    wait = f"touch {started}; for i in $(seq 300); do [ -f {go} ] && break; sleep 0.1; done"
    fake.script(tool_call("bash", {"command": wait}), text("Done, in French."))
    base = await ready(served)
    async with a2a_client(base, streaming=True) as client:
        stream, task_id = await streaming_task(client, ask("Work", context_id="ctx-steer"))
        await eventually(started.exists, "the tool runs")
        steer = [r async for r in client.send_message(ask("Answer in French.", task_id=task_id))]
        assert [r.task.status.state for r in steer] == [TaskState.TASK_STATE_WORKING]
        go.touch()
        rest = [response async for response in stream]
        assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        with pytest.raises(UnsupportedOperationError, match="terminal state"):
            await final_task(client, ask("More?", task_id=task_id))
        with pytest.raises(PushNotificationNotSupportedError):
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url="http://127.0.0.1:9/hook")
            )
    said = [(m.get("role"), m.get("content")) for m in fake.requests[-1].messages]
    assert ("user", "Answer in French.") in said, said  # taken in as the user's, at a safe point
    async with (
        over_rest(base) as http,
        http.get("/sessions/ctx-steer/events", params={"limit": 1000}) as page,
    ):
        assert '"steer_applied"' in await page.text()  # the session's log says when the run took it in


async def test_push_notifications_go_only_to_the_operators_urls(tmp_path: Path, fake: FakeLLM) -> None:
    received: list[tuple[str, str, dict[str, Any]]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(
            (request.path, request.headers.get("X-A2A-Notification-Token", ""), await request.json())
        )
        return web.Response()

    receiver = web.Application()
    receiver.router.add_post("/hook/{name}", hook)
    runner = web.AppRunner(receiver)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.script(text("Pushed."))
    allowed = f"http://127.0.0.1:{port}/hook"
    try:
        with serving(tmp_path, fake, A3S_A2A_PUSH_URLS=allowed, A3S_FETCH_ALLOW_PRIVATE="1") as server:
            base = await ready(server)
            async with a2a_client(base, streaming=False) as client:
                assert client._card.capabilities.push_notifications  # type: ignore[attr-defined]
                for refused in (
                    f"http://127.0.0.1:{port}/other",
                    f"{allowed}/../admin",
                    f"http://localhost:{port}/hook/a",
                    f"http://user:pw@127.0.0.1:{port}/hook/a",
                    "file:///etc/passwd",
                ):
                    request = ask("Go", context_id="ctx-push")
                    request.configuration.task_push_notification_config.url = refused
                    with pytest.raises(InvalidParamsError, match="push notification URL"):
                        await final_task(client, request)
                request = ask("Go", context_id="ctx-push")
                request.configuration.task_push_notification_config.url = f"{allowed}/mine"
                request.configuration.task_push_notification_config.token = "secret-for-the-hook"
                task, _ = await final_task(client, request)
                assert task.status.state == TaskState.TASK_STATE_COMPLETED

                def completed() -> bool:
                    return any("COMPLETED" in str(body) for _, _, body in received)

                await eventually(completed, "the completion was pushed")
    finally:
        await runner.cleanup()
    assert {path for path, _, _ in received} == {"/hook/mine"}
    assert {token for _, token, _ in received} == {"secret-for-the-hook"}


async def test_the_server_keeps_a_bounded_number_of_tasks_forgetting_the_oldest_ended(
    tmp_path: Path, fake: FakeLLM
) -> None:
    fake.script(text("one"), text("two"), text("three"))
    with serving(tmp_path, fake, A3S_A2A_MAX_TASKS="2") as server:
        base = await ready(server)
        async with a2a_client(base, streaming=False) as client:
            tasks = [(await final_task(client, ask(n, context_id="ctx-kept")))[0] for n in ("1", "2", "3")]
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=tasks[0].id))
            kept = [await client.get_task(GetTaskRequest(id=task.id)) for task in tasks[1:]]
    assert [get_message_text(task.status.message) for task in kept] == ["two", "three"]


async def test_a_task_cancelled_mid_run_stops_its_tool(served: ServerProcess, fake: FakeLLM) -> None:
    marker = served.workspace / "pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    base = await ready(served)
    async with a2a_client(base, streaming=True) as client:
        stream, task_id = await streaming_task(client, ask("Sleep", context_id="ctx-cancel"))
        pid = host_pid(
            int(await eventually(lambda: marker.exists() and marker.read_text().strip(), "the tool runs"))
        )
        cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        await eventually(lambda: not alive(pid), "the tool's process is gone")
        await stream.aclose()
        task = await client.get_task(GetTaskRequest(id=task_id))
        assert task.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_client_that_lost_its_stream_resubscribes_and_misses_nothing(
    served: ServerProcess, fake: FakeLLM
) -> None:
    fake.script(
        tool_call("ask_user", {"question": "Go on?"}),
        text("Done, after the answer."),
    )
    base = await ready(served)
    async with a2a_client(base, streaming=True) as client:
        task, _ = await final_task(client, ask("Start", context_id="ctx-resub"))
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        resubscribed = client.subscribe(SubscribeToTaskRequest(id=task.id))
        first = await anext(resubscribed)
        assert first.task.id == task.id  # the task as it is: nothing before it lost
        await final_task(client, ask("yes", context_id="ctx-resub", task_id=task.id))
        rest = [response async for response in resubscribed]
    texts = [get_artifact_text(r.artifact_update.artifact, "") for r in rest if r.HasField("artifact_update")]
    assert "".join(texts) == "Done, after the answer."
    assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_without_the_token_or_with_a_bad_context_a2a_refuses(served: ServerProcess) -> None:
    base = await ready(served)
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(f"{base}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage"})
        assert refused.status_code == 401
        wrong = await http.post(
            f"{base}/a2a", headers={"Authorization": "Bearer nope"}, json={"jsonrpc": "2.0", "id": 1}
        )
        assert wrong.status_code == 401
    async with a2a_client(base, streaming=False) as client:
        with pytest.raises(InvalidParamsError, match="context id: 'not a session id!' is not a session id"):
            await final_task(client, ask("hi", context_id="not a session id!"))
        with pytest.raises(InvalidParamsError, match=r"message\.parts: no text"):
            await final_task(client, ask("  ", context_id="ctx-empty"))
        as_agent = ask("I am the agent", context_id="ctx-role")
        as_agent.message.role = Role.ROLE_AGENT
        with pytest.raises(InvalidParamsError, match=r"message\.role: must be ROLE_USER"):
            await final_task(client, as_agent)
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(17):
            yield b" " * (1024 * 1024)

    authorized = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60, headers=authorized) as http:
        whole = await http.post(f"{base}/a2a", content=b" " * (17 * 1024 * 1024))
        streamed = await http.post(f"{base}/a2a", content=chunked())
        malformed = await http.post(f"{base}/a2a", content=b'{"jsonrpc": "2.0", "id": 1, "method"')
    assert (whole.status_code, streamed.status_code) == (413, 413)
    assert malformed.status_code == 200 and malformed.json()["error"]["code"] == -32700


def test_the_flag_and_its_variable() -> None:
    assert settings_from(env={"A3S_A2A": "1"}).a2a
    assert settings_from(a2a=True, env={}).a2a
    with pytest.raises(ConfigError, match="--a2a"):
        check_serving(settings_from(a2a=True, http_listen="off", env={}))
    pushed = settings_from(
        a2a_push_urls=["https://hooks.example/a2a"], env={"A3S_A2A_PUSH_URLS": "http://h/x"}
    )
    assert pushed.a2a_push_urls == ["https://hooks.example/a2a", "http://h/x"]
    with pytest.raises(ConfigError, match=r"--a2a-push-url .*'ftp://h/x' is not an http or https URL"):
        check_serving(settings_from(a2a=True, a2a_push_urls=["ftp://h/x"], env={}))
