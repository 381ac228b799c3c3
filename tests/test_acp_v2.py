"""ACP v2 (faces/acp/v2.py) through a real pipe: `a3s-agent acp` as a subprocess, driven by a client
speaking the v2 JSON (the Python ACP SDK has no v2), every message the agent sends checked against
the official v2 schema (tests/data/acp/schema.v2.json), against the fake LLM over real HTTP."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from a3s_agent.testing.fake_llm import FakeLLM, error, hang, text, tool_call

from .conftest import eventually
from .test_acp import agent_env

SCHEMA = json.loads((Path(__file__).parent / "data" / "acp" / "schema.v2.json").read_text())
RESULTS = {
    "initialize": "InitializeResponse",
    "session/new": "NewSessionResponse",
    "session/prompt": "PromptResponse",
    "session/resume": "ResumeSessionResponse",
}
WAIT_S = 30.0


def check(definition: str, value: object) -> None:
    """`value` is valid as the schema's `definition`."""
    jsonschema.validate(value, {"$ref": f"#/$defs/{definition}", "$defs": SCHEMA["$defs"]})


def heard(body: dict[str, Any]) -> Any:
    return text(f"heard: {body['messages'][-1]['content']}")


class V2Client:
    """The client end of the pipe: requests by id, the updates as they come, permission asks
    answered by `permit` (None: left waiting until `answer_permission`)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.updates: list[dict[str, Any]] = []
        self.permission_asks: list[dict[str, Any]] = []
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = iter(range(1, 1_000_000))
        self._methods: dict[int, str] = {}
        self.v2 = True  # check answers against the v2 schema
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            message = json.loads(line)
            assert message["jsonrpc"] == "2.0", message
            if message.get("method") == "session/update":
                check("UpdateSessionNotification", message["params"])
                self.updates.append(message["params"]["update"])
            elif message.get("method") == "session/request_permission":
                check("RequestPermissionRequest", message["params"])
                self.permission_asks.append(message)
            else:
                method = self._methods.pop(message["id"], "")
                if "result" in message and method in RESULTS and self.v2:
                    check(RESULTS[method], message["result"])
                self._answers[message["id"]].set_result(message)

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        await self.proc.stdin.drain()

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The whole answer (`result` or `error`)."""
        request_id = next(self._ids)
        self._methods[request_id] = method
        answer = self._answers[request_id] = asyncio.get_running_loop().create_future()
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await asyncio.wait_for(answer, WAIT_S)

    async def result(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answer = await self.call(method, params)
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    async def answer_permission(self, ask: dict[str, Any], option_id: str) -> None:
        outcome = {"outcome": {"outcome": "selected", "optionId": option_id}}
        check("RequestPermissionResponse", outcome)
        await self.send({"jsonrpc": "2.0", "id": ask["id"], "result": outcome})

    def states(self) -> list[str]:
        return [u["state"] for u in self.updates if u["sessionUpdate"] == "state_update"]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["sessionUpdate"] == kind]

    async def until(self, check: Callable[[], Any], what: str) -> Any:
        return await eventually(check, what, within_s=WAIT_S)


@asynccontextmanager
async def v2_agent(workspace: Path, fake: FakeLLM, data_dir: Path) -> AsyncIterator[V2Client]:
    with open(f"{data_dir}.stderr.log", "a") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "a3s_agent", "acp",
            cwd=workspace, env=agent_env(fake, data_dir),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
        client = V2Client(proc)
        try:
            yield client
        finally:
            client.reader.cancel()
            assert proc.stdin is not None
            proc.stdin.close()
            with suppress(ProcessLookupError):
                proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT_S)


async def started(client: V2Client, workspace: Path) -> str:
    init = await client.result(
        "initialize", {"protocolVersion": 2, "info": {"name": "test-client", "version": "1.0"}}
    )
    assert init["protocolVersion"] == 2 and init["info"]["name"] == "a3s-agent"
    assert "session" in init["capabilities"]
    session_id: str = (await client.result("session/new", {"cwd": str(workspace)}))["sessionId"]
    return session_id


def prompt(session_id: str, words: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": words}]}


async def test_a_prompt_during_a_turn_steers_it_at_its_next_safe_point(
    workspace: Path, tmp_path: Path
) -> None:
    script = (tool_call("write_file", {"path": "a.txt", "content": "x"}), heard)
    async with FakeLLM(*script) as fake, v2_agent(workspace, fake, tmp_path / "data") as client:
        session_id = await started(client, workspace)
        first = await client.result("session/prompt", prompt(session_id, "write a.txt"))
        assert first["messageId"]  # the receipt comes at once: the turn has only started
        ask = await client.until(lambda: client.permission_asks and client.permission_asks[0], "the ask")
        assert ask["params"]["subject"]["toolCall"]["name"] == "write_file"
        await client.until(lambda: "requires_action" in client.states() or None, "requires_action")

        second = await client.result("session/prompt", prompt(session_id, "use tabs, not spaces"))
        assert second["messageId"] and second["messageId"] != first["messageId"]
        await client.answer_permission(ask, "allow-once")
        await client.until(lambda: client.states()[-1:] == ["idle"] or None, "the turn's end")

        assert client.states() == ["running", "requires_action", "running", "idle"]
        idle = client.of("state_update")[-1]
        assert idle["stopReason"] == "end_turn"
        shown = [(u["messageId"], u["content"][0]["text"]) for u in client.of("user_message")]
        assert shown == [
            (first["messageId"], "write a.txt"),
            (second["messageId"], "use tabs, not spaces"),
        ]
        answer = "".join(u["content"]["text"] for u in client.of("agent_message_chunk"))
        assert answer == "heard: use tabs, not spaces"
        sent = fake.requests[1].messages
        assert [m["role"] for m in sent[-3:]] == ["assistant", "tool", "user"]
        assert len(fake.requests) == 2 and (workspace / "a.txt").read_text() == "x"


async def test_cancel_is_confirmed_by_idle_and_resume_replays_from_the_start(
    workspace: Path, tmp_path: Path
) -> None:
    async with (
        FakeLLM(text("the first answer"), hang(60)) as fake,
        v2_agent(workspace, fake, tmp_path / "data") as client,
    ):
        session_id = await started(client, workspace)
        await client.result("session/prompt", prompt(session_id, "hello"))
        await client.until(lambda: client.states()[-1:] == ["idle"] or None, "the first turn's end")
        await client.result("session/prompt", prompt(session_id, "take your time"))
        await client.until(lambda: len(fake.requests) == 2 or None, "the second model call")
        await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}})
        await client.until(lambda: client.states()[-1:] == ["idle"] or None, "idle after the cancel")
        assert client.of("state_update")[-1]["stopReason"] == "cancelled"

        client.updates.clear()
        resume = {"sessionId": session_id, "cwd": str(workspace), "replayFrom": {"type": "start"}}
        assert await client.result("session/resume", resume) == {}
        users = [u["content"][0]["text"] for u in client.of("user_message")]
        assert users == ["hello", "take your time"]
        agents = [u["content"][0]["text"] for u in client.of("agent_message")]
        assert agents[0] == "the first answer"
        assert client.updates[-1] == {
            "sessionUpdate": "state_update",
            "state": "idle",
            "stopReason": "cancelled",
        }
        # Live updates carry their log seq; replay from one of them (inclusive) shows the same again.
        client.updates.clear()
        resume_at = {"sessionId": session_id, "cwd": str(workspace)}
        first = await _first_text_seq(client, session_id, workspace)
        replay = {**resume_at, "replayFrom": {"type": "_a3s_seq", "seq": first}}
        assert await client.result("session/resume", replay) == {}
        chunks = client.of("agent_message_chunk")
        assert "".join(u["content"]["text"] for u in chunks) == "the first answer"
        seqs = [u["_meta"]["a3s/seq"] for u in chunks]
        assert seqs[0] == first and seqs == sorted(set(seqs))
        assert client.permission_asks == [] and client.states() == ["idle"]
        for bad_seq in (0, "1", True):
            bad = await client.call(
                "session/resume", {**resume_at, "replayFrom": {"type": "_a3s_seq", "seq": bad_seq}}
            )
            assert bad["error"]["code"] == -32602 and "replayFrom.seq" in bad["error"]["message"]
        listed = await client.result("session/list", {"cwd": str(workspace)})
        assert [(s["sessionId"], s["cwd"]) for s in listed["sessions"]] == [(session_id, str(workspace))]
        bad = await client.call("session/list", {"cursor": "not-ours"})
        assert bad["error"]["code"] == -32602 and "cursor" in bad["error"]["message"]


async def _first_text_seq(client: V2Client, session_id: str, workspace: Path) -> int:
    """The seq of the session's first text update, from a replay of its whole log."""
    replay = {"sessionId": session_id, "cwd": str(workspace), "replayFrom": {"type": "_a3s_seq", "seq": 1}}
    await client.result("session/resume", replay)
    seq: int = client.of("agent_message_chunk")[0]["_meta"]["a3s/seq"]
    client.updates.clear()
    return seq


async def test_a_failed_turn_ends_idle_with_the_error(workspace: Path, tmp_path: Path) -> None:
    failing = error(500, "the model's server broke", should_retry=False)
    async with FakeLLM(failing) as fake, v2_agent(workspace, fake, tmp_path / "data") as client:
        session_id = await started(client, workspace)
        await client.result("session/prompt", prompt(session_id, "hello"))
        await client.until(lambda: client.states()[-1:] == ["idle"] or None, "the turn's end")
        idle = client.of("state_update")[-1]
        assert idle["stopReason"] == "error" and "the model's server broke" in idle["error"]["message"], idle


@pytest.mark.parametrize(
    ("method", "params", "code", "named"),
    [
        ("session/prompt", {"sessionId": "S", "prompt": []}, -32602, "prompt"),
        ("session/prompt", {"prompt": [{"type": "text", "text": "x"}]}, -32602, "sessionId"),
        (
            "session/prompt",
            {"sessionId": "ghost", "prompt": [{"type": "text", "text": "x"}]},
            -32002,
            "ghost",
        ),
        (
            "session/resume",
            {"sessionId": "S", "cwd": "W", "replayFrom": {"type": "later"}},
            -32602,
            "replayFrom",
        ),
        ("session/resume", {"sessionId": "S", "cwd": "/"}, -32602, "cwd"),
        ("session/fork", {"sessionId": "S"}, -32601, "session/fork"),
    ],
)
async def test_bad_requests_are_errors_naming_the_fault(
    workspace: Path, tmp_path: Path, method: str, params: dict[str, Any], code: int, named: str
) -> None:
    async with FakeLLM() as fake, v2_agent(workspace, fake, tmp_path / "data") as client:
        session_id = await started(client, workspace)
        filled = {k: session_id if v == "S" else str(workspace) if v == "W" else v for k, v in params.items()}
        answer = await client.call(method, filled)
        assert answer["error"]["code"] == code and named in answer["error"]["message"], answer
        check("Error", answer["error"])
        assert client.states() == []  # nothing ran


async def test_a_v1_client_still_gets_v1(workspace: Path, tmp_path: Path) -> None:
    async with FakeLLM() as fake, v2_agent(workspace, fake, tmp_path / "data") as client:
        client.v2 = False
        init = await client.call("initialize", {"protocolVersion": 1})
        assert init["result"]["protocolVersion"] == 1 and "agentCapabilities" in init["result"]


SDK_CLIENT = Path(__file__).with_name("acp_v2_client.mjs")
SDK = ("@agentclientprotocol/sdk@2.4.0", "zod@4")


@pytest.mark.slow  # installs the ACP TypeScript SDK from npm
async def test_the_typescript_sdks_v2_client_steers_a_turn(workspace: Path, tmp_path: Path) -> None:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("node and npm are not installed")
    client_dir = tmp_path / "client"
    client_dir.mkdir()
    (client_dir / "package.json").write_text('{"name": "acp-v2-client", "private": true, "type": "module"}')
    installed = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", *SDK],
        cwd=client_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    shutil.copy(SDK_CLIENT, client_dir)
    script = (tool_call("write_file", {"path": "a.txt", "content": "x"}), heard)
    async with FakeLLM(*script) as fake:
        node = await asyncio.create_subprocess_exec(
            "node", str(client_dir / SDK_CLIENT.name), sys.executable, str(workspace),
            cwd=client_dir, env=agent_env(fake, tmp_path / "data"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(node.communicate(), 120)
    assert node.returncode == 0, err.decode()[-3000:]
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["protocolVersion"] == 2 and seen["asked"] == "write_file"
    first, second = seen["receipts"]
    assert seen["users"] == [[first, "write a.txt"], [second, "use tabs, not spaces"]]
    assert seen["answer"] == "heard: use tabs, not spaces" and seen["stopReason"] == "end_turn"
    assert seen["states"] == ["running", "requires_action", "running", "idle"]
