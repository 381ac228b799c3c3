"""agent_task's confirmations and long runs the MCP 2026-07-28 way, over Streamable HTTP on the HTTP
face: a 2026 client (the `mcp` SDK's own) answers a confirmation carried by an `input_required`
result in its retry of the call; a 2025 client keeps the confirmation flow it had; a client that
declares the Tasks extension gets a task it polls (tasks/get), answers (tasks/update) and cancels
(tasks/cancel), spoken here as the extension's exact JSON since the SDK has no client for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import types
from mcp.client.context import ClientRequestContext

from a3s_agent.app.types import ConfirmationPolicy
from a3s_agent.base.models import SessionConfig
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import alive, eventually, host_pid
from .test_mcp_server import INITIALIZE, TOKEN, McpServer, client_of, mcp_server, texts

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
Asked = list[types.ElicitRequestParams]


@pytest.fixture
async def served(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[McpServer]:
    async with mcp_server(workspace, tmp_path / "data", fake) as server:
        yield server


async def confirming_session(server: McpServer, timeout_ms: int = 60_000) -> str:
    """A session whose tool calls wait for confirmation (rejected after `timeout_ms`)."""
    view = await server.app.sessions.create(None, SessionConfig(name="confirms"), [], {})
    policy = ConfirmationPolicy(enabled=True, default_timeout_ms=timeout_ms)
    await server.app.control.set_confirmation_policy(view.session.id, policy)
    return view.session.id


def answering(asked: Asked, content: dict[str, Any]) -> Any:
    async def answer(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content=content)

    return answer


def answer_of(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST, sent as JSON or as the last event of a stream."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        answer: dict[str, Any] = json.loads(data[-1])
        return answer
    answer = json.loads(response.text)
    return answer


def tool_message(fake: FakeLLM) -> str:
    """What the model was told of its tool call (the last request's tool message)."""
    return str(next(m["content"] for m in reversed(fake.requests[-1].messages) if m["role"] == "tool"))


# --- input_required: the SDK's client at 2026-07-28 --------------------------------------------


async def test_a_2026_client_answers_a_confirmation_in_its_retry(served: McpServer, fake: FakeLLM) -> None:
    session_id = await confirming_session(served)
    fake.script(tool_call("bash", {"command": "echo yes > approved.txt"}), text("written"))
    asked: Asked = []
    async with client_of(
        served.url, MODERN, elicitation_callback=answering(asked, {"approved": True})
    ) as client:
        result = await client.call_tool("agent_task", {"task": "write it", "session_id": session_id})
    assert not result.is_error, texts(result)
    assert texts(result)[0] == "written"
    [question] = asked
    assert isinstance(question, types.ElicitRequestFormParams)
    assert "bash" in question.message and "approved.txt" in question.message
    assert (served.workspace / "approved.txt").read_text() == "yes\n"


async def test_a_2026_client_that_says_no_rejects_the_call_with_its_reason(
    served: McpServer, fake: FakeLLM
) -> None:
    session_id = await confirming_session(served)
    fake.script(tool_call("bash", {"command": "touch pwned"}), text("as you wish"))
    asked: Asked = []
    refusal = answering(asked, {"approved": False, "reason": "not in my repo"})
    async with client_of(served.url, MODERN, elicitation_callback=refusal) as client:
        result = await client.call_tool("agent_task", {"task": "x", "session_id": session_id})
    assert texts(result)[0] == "as you wish" and len(asked) == 1
    assert not (served.workspace / "pwned").exists()
    assert tool_message(fake).endswith("rejected by user: not in my repo")


async def test_a_2025_client_keeps_the_confirmation_flow_it_had(served: McpServer, fake: FakeLLM) -> None:
    """No question reaches it: the call waits as the session's policy says (here: rejected at once)."""
    session_id = await confirming_session(served, timeout_ms=1)
    fake.script(tool_call("bash", {"command": "touch pwned"}), text("fine"))
    asked: Asked = []
    async with client_of(
        served.url, "legacy", elicitation_callback=answering(asked, {"approved": True})
    ) as client:
        result = await client.call_tool("agent_task", {"task": "x", "session_id": session_id})
    assert texts(result)[0] == "fine" and asked == []
    assert not (served.workspace / "pwned").exists()
    assert "rejected by user" in tool_message(fake)


# --- the Tasks extension, as its JSON --------------------------------------------------------


class Raw:
    """A 2026-07-28 client speaking the wire JSON: one POST per request, as the spec has them."""

    def __init__(self, http: httpx2.AsyncClient, url: str, capabilities: dict[str, Any]) -> None:
        self._http, self._url, self._capabilities = http, url, capabilities
        self._id = 0

    async def send(self, method: str, params: dict[str, Any], name: str = "") -> dict[str, Any]:
        self._id += 1
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": self._capabilities,
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": method,
            **({"Mcp-Name": name} if name else {}),
        }
        body = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": {**params, "_meta": meta}}
        return answer_of(await self._http.post(self._url, json=body, headers=headers))

    async def result(self, method: str, params: dict[str, Any], name: str = "") -> dict[str, Any]:
        answer = await self.send(method, params, name)
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    async def task_in(self, task_id: str, *statuses: str) -> dict[str, Any]:
        async def polled() -> dict[str, Any] | None:
            task = await self.result("tasks/get", {"taskId": task_id}, task_id)
            return task if task["status"] in statuses else None

        return await eventually(polled, f"task {task_id} {' or '.join(statuses)}")


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
        yield client


async def test_agent_task_runs_as_a_task_polled_answered_and_completed(
    served: McpServer, fake: FakeLLM, http: httpx2.AsyncClient
) -> None:
    session_id = await confirming_session(served)
    fake.script(tool_call("bash", {"command": "echo yes > approved.txt"}), text("written"))
    raw = Raw(http, served.url, {"extensions": {TASKS: {}}})
    call = {"name": "agent_task", "arguments": {"task": "write it", "session_id": session_id}}
    created = await raw.result("tools/call", call, "agent_task")
    assert created["resultType"] == "task" and created["status"] in {"working", "input_required"}
    task_id = created["taskId"]

    waiting = await raw.task_in(task_id, "input_required")
    assert waiting["resultType"] == "complete"
    [(key, question)] = waiting["inputRequests"].items()
    assert question["method"] == "elicitation/create" and "approved.txt" in question["params"]["message"]
    assert not (served.workspace / "approved.txt").exists()

    acknowledged = await raw.result(
        "tasks/update",
        {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"approved": True}}}},
        task_id,
    )
    assert acknowledged["resultType"] == "complete"
    done = await raw.task_in(task_id, "completed")
    assert done["result"]["structuredContent"]["answer"] == "written"
    assert done["result"]["structuredContent"]["session_id"] == session_id
    assert (served.workspace / "approved.txt").read_text() == "yes\n"


async def test_tasks_cancel_stops_the_run_and_its_tool(
    served: McpServer, fake: FakeLLM, http: httpx2.AsyncClient
) -> None:
    marker = served.workspace / "pid"
    fake.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    raw = Raw(http, served.url, {"extensions": {TASKS: {}}})
    created = await raw.result("tools/call", {"name": "agent_task", "arguments": {"task": "x"}}, "agent_task")
    task_id = created["taskId"]
    pid = host_pid(
        int(await eventually(lambda: marker.exists() and marker.read_text().strip(), "the tool runs"))
    )

    assert (await raw.result("tasks/cancel", {"taskId": task_id}, task_id))["resultType"] == "complete"
    cancelled = await raw.task_in(task_id, "cancelled", "completed", "failed")
    assert cancelled["status"] == "cancelled"
    await eventually(lambda: not alive(pid), "the tool's process is gone")
    assert len(fake.requests) == 1  # the model was not called again


async def test_task_requests_that_are_wrong_are_refused_naming_what_is_wrong(
    served: McpServer, fake: FakeLLM, http: httpx2.AsyncClient
) -> None:
    fake.script(text("done"))
    raw = Raw(http, served.url, {"extensions": {TASKS: {}}})
    created = await raw.result("tools/call", {"name": "agent_task", "arguments": {"task": "x"}}, "agent_task")
    task_id = created["taskId"]
    assert (await raw.task_in(task_id, "completed"))["result"]["content"][0]["text"] == "done"

    unknown = await raw.send("tasks/get", {"taskId": "no-such-task"}, "no-such-task")
    assert unknown["error"]["code"] == types.INVALID_PARAMS and "taskId" in unknown["error"]["message"]
    huge = "x" * 100_000
    too_long = await raw.send("tasks/get", {"taskId": huge})
    assert (
        too_long["error"]["code"] == types.INVALID_PARAMS
        and "taskId: String should have at most" in too_long["error"]["message"]
    )
    malformed = await raw.send("tasks/update", {"taskId": task_id, "inputResponses": "yes"}, task_id)
    assert (
        malformed["error"]["code"] == types.INVALID_PARAMS
        and "inputResponses" in malformed["error"]["message"]
    )

    # a client that did not declare the extension: no task methods, and agent_task answers in the call
    plain = Raw(http, served.url, {})
    refused = await plain.send("tasks/get", {"taskId": task_id}, task_id)
    assert refused["error"]["code"] == -32021
    assert refused["error"]["data"]["requiredCapabilities"] == {"extensions": {TASKS: {}}}
    fake.script(text("at once"))
    answered = await plain.result(
        "tools/call", {"name": "agent_task", "arguments": {"task": "y"}}, "agent_task"
    )
    assert answered["resultType"] == "complete" and answered["content"][0]["text"] == "at once"


async def test_a_forged_or_foreign_request_state_is_refused(
    served: McpServer, fake: FakeLLM, http: httpx2.AsyncClient
) -> None:
    """The requestState is sealed: one not minted here, or minted for another call, is refused."""
    session_id = await confirming_session(served)
    fake.script(tool_call("bash", {"command": "echo yes > approved.txt"}), text("written"))
    raw = Raw(http, served.url, {"elicitation": {}})
    call = {"name": "agent_task", "arguments": {"task": "x", "session_id": session_id}}
    asked = await raw.result("tools/call", call, "agent_task")
    assert asked["resultType"] == "input_required"
    [key] = asked["inputRequests"]
    yes = {key: {"action": "accept", "content": {"approved": True}}}
    other = {"name": "agent_task", "arguments": {"task": "something else"}}
    for params in (
        {**call, "requestState": "forged", "inputResponses": yes},
        {**other, "requestState": asked["requestState"], "inputResponses": yes},
    ):
        refused = await raw.send("tools/call", params, "agent_task")
        assert refused["error"]["code"] == types.INVALID_PARAMS, refused
    assert not (served.workspace / "approved.txt").exists()

    retried = {**call, "requestState": asked["requestState"], "inputResponses": yes}
    done = await raw.result("tools/call", retried, "agent_task")
    assert done["resultType"] == "complete" and done["content"][0]["text"] == "written"
    assert (served.workspace / "approved.txt").exists()


async def test_a_2025_client_has_no_task_methods(served: McpServer, http: httpx2.AsyncClient) -> None:
    """Tasks are the 2026 extension's: at 2025-11-25 (an MCP session) tasks/get is no method."""
    accept = {"Accept": "application/json, text/event-stream"}
    opened = await http.post(
        served.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
        headers=accept,
    )
    session = {
        **accept,
        "Mcp-Session-Id": opened.headers["Mcp-Session-Id"],
        "MCP-Protocol-Version": "2025-11-25",
    }
    await http.post(
        served.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session
    )
    for params in ({"taskId": "x"}, {"taskId": 7}):
        asked = await http.post(
            served.url,
            json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": params},
            headers=session,
        )
        assert answer_of(asked)["error"]["code"] == types.METHOD_NOT_FOUND
