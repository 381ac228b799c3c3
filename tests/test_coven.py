"""The coven face against a fake coven gateway: a real grpc.aio server implementing CovenControl,
with our agent (the `agent` fixture's runtime, its LLM the fake) connected to it."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.app import Application
from a3s_agent.base.models import SessionConfig
from a3s_agent.core.sessions.control import ConfirmationPolicy
from a3s_agent.faces.coven import CovenAgent, CovenConfig
from a3s_agent.faces.coven.threads import session_id_for
from a3s_agent.proto import code_agent_pb2 as a3s_pb
from a3s_agent.proto import coven_pb2 as pb
from a3s_agent.proto import coven_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, call, error, text, tool_call, tool_calls

from .conftest import LiveServer, ServerProcess

TIMEOUT_S = 10.0
TERMINAL = {"done", "error", "cancelled"}
THINKING = ("thinking", "thinking")

# --- the fake gateway ---------------------------------------------------------------------


class GatewayStream:
    """One agent connection as the gateway sees it: what the agent sent, sorted by request."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
        self.outbox: asyncio.Queue[pb.ServerMessage | None] = asyncio.Queue()
        self._sorted: defaultdict[str, deque[pb.AgentMessage]] = defaultdict(deque)
        self.closed = False

    def send(self, **payload: Any) -> None:
        self.outbox.put_nowait(pb.ServerMessage(**payload))

    def drop(self) -> None:
        """End the RPC from the gateway's side."""
        self.outbox.put_nowait(None)

    async def take(self, key: str) -> pb.AgentMessage:
        """The next message for `key`: a request_id, or a payload kind such as "register"."""
        while not self._sorted[key]:
            message = await asyncio.wait_for(self.received.get(), TIMEOUT_S)
            if message is None:
                self.closed = True
                raise AssertionError(f"the agent closed the stream while {key!r} was awaited")
            kind = message.WhichOneof("payload")
            self._sorted[message.response.request_id if kind == "response" else kind].append(message)
        return self._sorted[key].popleft()

    async def events(self, request_id: str, until: str | None = None) -> list[tuple[str, Any]]:
        """A request's responses as (kind, value), through the terminal one (or `until`)."""
        events = []
        while True:
            response = (await self.take(request_id)).response
            kind = response.WhichOneof("event")
            events.append((kind, getattr(response, kind)))
            if kind in TERMINAL or kind == until:
                return events

    async def until_closed(self) -> None:
        while not self.closed:
            message = await asyncio.wait_for(self.received.get(), TIMEOUT_S)
            self.closed = message is None


class FakeGateway(pb_grpc.CovenControlServicer):
    def __init__(self) -> None:
        self.streams: asyncio.Queue[GatewayStream] = asyncio.Queue()
        self.address = ""

    async def AgentStream(self, request_iterator: Any, context: Any) -> AsyncIterator[pb.ServerMessage]:
        await context.send_initial_metadata(())  # at once, as the spec says the gateway does
        stream = GatewayStream()
        self.streams.put_nowait(stream)

        async def pump() -> None:
            try:
                async for message in request_iterator:
                    stream.received.put_nowait(message)
            finally:
                stream.received.put_nowait(None)
                stream.outbox.put_nowait(None)

        reading = asyncio.create_task(pump())
        try:
            while (message := await stream.outbox.get()) is not None:
                yield message
        finally:
            reading.cancel()

    async def connection(self) -> tuple[GatewayStream, pb.RegisterAgent]:
        """The next agent connection and its RegisterAgent (which must come first)."""
        stream = await asyncio.wait_for(self.streams.get(), TIMEOUT_S)
        first = await asyncio.wait_for(stream.received.get(), TIMEOUT_S)
        assert first is not None and first.WhichOneof("payload") == "register", first
        return stream, first.register

    async def accept(self, **welcome: Any) -> tuple[GatewayStream, pb.RegisterAgent]:
        stream, register = await self.connection()
        stream.send(
            welcome=pb.Welcome(server_id="gw-1", agent_id=register.agent_id, instance_id="abc", **welcome)
        )
        return stream, register


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    servicer = FakeGateway()
    server = grpc.aio.server()
    pb_grpc.add_CovenControlServicer_to_server(servicer, server)
    servicer.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    yield servicer
    await server.stop(0)


@dataclass
class Coven:
    task: asyncio.Task[int]
    stop: asyncio.Event

    async def exit_code(self) -> int:
        return await asyncio.wait_for(self.task, TIMEOUT_S)


@asynccontextmanager
async def coven_agent(live: LiveServer, gateway: FakeGateway, **config: Any) -> AsyncIterator[Coven]:
    """Our agent connected to the gateway; stopped (if still running) on exit."""
    settings = {"name": "test-agent", "heartbeat_s": 60.0, "backoff_initial_s": 0.05, "backoff_max_s": 0.2}
    agent = CovenAgent(
        Application(live.runtime), CovenConfig(gateway=gateway.address, **{**settings, **config})
    )
    stop = asyncio.Event()
    coven = Coven(asyncio.create_task(agent.run(stop)), stop)
    try:
        yield coven
    finally:
        stop.set()
        await coven.exit_code()


def send_message(stream: GatewayStream, request_id: str, thread_id: str, content: str, **extra: Any) -> None:
    stream.send(
        send_message=pb.SendMessage(
            request_id=request_id, thread_id=thread_id, sender="alice", content=content, **extra
        )
    )


def state(tool_id: str, value: int, detail: str | None = None) -> tuple[str, pb.ToolStateUpdate]:
    return "tool_state", pb.ToolStateUpdate(id=tool_id, state=value, detail=detail)  # type: ignore[arg-type]


def kinds(events: list[tuple[str, Any]]) -> list[str]:
    return [kind for kind, _ in events]


def usage_of(live: LiveServer, thread_id: str) -> tuple[str, pb.TokenUsage]:
    usage = live.runtime.sessions.get(session_id_for(thread_id)).usage
    return "usage", pb.TokenUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
    }  # fmt: skip
    done = subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return done.stdout.strip()


# --- registration -------------------------------------------------------------------------


async def test_registers_with_every_field_and_applies_the_welcome(
    agent: LiveServer, gateway: FakeGateway, workspace: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    git(workspace, "init", "-q", "-b", "main")
    (workspace / "a.txt").write_text("one\n")
    git(workspace, "add", "a.txt")
    git(workspace, "commit", "-q", "-m", "one")
    git(workspace, "remote", "add", "origin", str(remote))
    git(workspace, "push", "-q", "-u", "origin", "main")
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(remote), str(other))
    (other / "b.txt").write_text("theirs\n")
    git(other, "add", "b.txt")
    git(other, "commit", "-q", "-m", "theirs")
    git(other, "push", "-q")
    git(workspace, "fetch", "-q")
    (workspace / "c.txt").write_text("ours\n")
    git(workspace, "add", "c.txt")
    git(workspace, "commit", "-q", "-m", "ours")
    (workspace / "a.txt").write_text("changed\n")

    async with coven_agent(agent, gateway, name="my-agent", workspaces=("dev", "personal")):
        _, register = await gateway.accept(secrets={"COVEN_TOKEN": "s3cret"})

    stored = (agent.runtime.settings.resolved_data_dir / "coven-agent-id").read_text().strip()
    assert register.agent_id == stored
    assert str(uuid.UUID(register.agent_id)) == register.agent_id
    assert register.name == "my-agent"
    assert list(register.capabilities) == ["chat", "code"]
    assert list(register.protocol_features) == ["token_usage", "tool_states", "injection", "cancellation"]
    metadata = register.metadata
    assert metadata.working_directory == str(agent.runtime.workspace) != ""
    assert metadata.hostname == socket.gethostname()
    assert metadata.os == platform.system().lower()
    assert list(metadata.workspaces) == ["dev", "personal"]
    assert metadata.backend == "direct"
    assert metadata.git == pb.GitInfo(
        branch="main",
        commit=git(workspace, "rev-parse", "HEAD"),
        dirty=True,
        remote=str(remote),
        ahead=1,
        behind=1,
    )
    assert agent.runtime.init.env["COVEN_TOKEN"] == "s3cret"


async def test_the_agent_id_survives_restarts_and_no_repository_means_no_git(
    agent: LiveServer, gateway: FakeGateway
) -> None:
    registered = []
    for config in ({}, {}, {"agent_id": "given-id"}):
        async with coven_agent(agent, gateway, **config):
            _, register = await gateway.accept()
            registered.append(register)
    first, second, given = registered
    assert first.agent_id == second.agent_id != ""
    assert given.agent_id == "given-id"
    assert not first.metadata.HasField("git")


async def test_a_refusal_with_a_suggested_id_is_retried_once_with_that_id(
    agent: LiveServer, gateway: FakeGateway
) -> None:
    async with coven_agent(agent, gateway) as coven:
        stream, first = await gateway.connection()
        stream.send(registration_error=pb.RegistrationError(reason="id taken", suggested_id="alt-id"))
        stream, second = await gateway.accept()
        assert second.agent_id == "alt-id" != first.agent_id
        stream.drop()  # a reconnect keeps the id the gateway accepted
        _, third = await gateway.accept()
        assert third.agent_id == "alt-id"
        assert not coven.task.done()


@pytest.mark.parametrize("suggested", ["", "alt-id"])
async def test_a_refusal_ends_the_agent_with_a_nonzero_code(
    agent: LiveServer, gateway: FakeGateway, caplog: pytest.LogCaptureFixture, suggested: str
) -> None:
    async with coven_agent(agent, gateway) as coven:
        stream, _ = await gateway.connection()
        stream.send(registration_error=pb.RegistrationError(reason="not approved", suggested_id=suggested))
        if suggested:
            stream, register = await gateway.connection()
            assert register.agent_id == suggested
            stream.send(
                registration_error=pb.RegistrationError(reason="still not approved", suggested_id="x")
            )
        assert await coven.exit_code() == 1
    assert "not approved" in caplog.text


async def test_a_server_without_coven_control_is_fatal(agent: LiveServer) -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        stop = asyncio.Event()
        config = CovenConfig(gateway=f"127.0.0.1:{port}", backoff_initial_s=0.05)
        assert (
            await asyncio.wait_for(CovenAgent(Application(agent.runtime), config).run(stop), TIMEOUT_S) == 1
        )
    finally:
        await server.stop(0)


# --- requests -----------------------------------------------------------------------------


async def test_a_message_streams_text_tool_states_usage_and_done(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(
        tool_call("bash", {"command": "echo $COVEN_TOKEN"}, id="call_1", content="Let me check."),
        text("All done."),
    )
    async with coven_agent(agent, gateway):
        stream, _ = await gateway.accept(secrets={"COVEN_TOKEN": "s3cret"})
        send_message(stream, "r1", "thread-1", "what is the token?")
        events = await stream.events("r1")
        assert events == [
            THINKING,
            ("text", "Let me check."),  # the deltas of one network read, joined
            ("tool_use", pb.ToolUse(id="call_1", name="bash", input_json='{"command": "echo $COVEN_TOKEN"}')),
            state("call_1", pb.TOOL_STATE_PENDING),
            state("call_1", pb.TOOL_STATE_RUNNING),
            state("call_1", pb.TOOL_STATE_COMPLETED),
            ("tool_result", pb.ToolResult(id="call_1", output="s3cret\n", is_error=False)),
            THINKING,
            ("text", "All done."),
            usage_of(agent, "thread-1"),
            ("done", pb.Done(full_response="Let me check.All done.")),
        ]

        # The thread's session holds the conversation: the next message continues it.
        fake.script(text("Noted."))
        attachment = pb.FileAttachment(filename="notes.txt", mime_type="text/plain", data=b"hello notes")
        send_message(stream, "r2", "thread-1", "and this file?", attachments=[attachment])
        assert (await stream.events("r2"))[-1] == ("done", pb.Done(full_response="Noted."))

    messages = fake.requests[-1].messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[1]["content"] == "what is the token?"
    parts = messages[-1]["content"]
    assert parts[0] == {"type": "text", "text": "and this file?"}
    assert "notes.txt" in parts[1]["text"] and "hello notes" in parts[1]["text"]
    history = await agent.runtime.sessions.history(session_id_for("thread-1"))
    assert history[0].metadata == {"coven_request_id": "r1", "coven_sender": "alice"}


@pytest.mark.parametrize(
    ("thread_id", "expected"),
    [
        ("thread-1", "coven:thread-1"),
        ("C0123:1700000000.0001", "coven:C0123:1700000000.0001"),
    ],
)
def test_thread_ids_map_to_session_ids(thread_id: str, expected: str) -> None:
    assert session_id_for(thread_id) == expected


def test_unsafe_thread_ids_still_get_distinct_valid_session_ids() -> None:
    ids = {session_id_for(t) for t in ["a/b", "a b", "a_b", "x" * 200, "x" * 201, "ünï"]}
    assert len(ids) == 6
    for session_id in ids:
        assert session_id.startswith("coven:") and len(session_id) <= 128
        assert session_id.replace(":", "").replace("-", "").replace("_", "").replace(".", "").isalnum()
    assert session_id_for("a/b").startswith("coven:a_b-")


async def test_approve_all_approves_the_rest_of_the_request(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(
        tool_calls(
            [call("bash", {"command": "echo one"}, id="c1"), call("bash", {"command": "echo two"}, id="c2")]
        ),
        text("ok"),
    )
    policy = ConfirmationPolicy(enabled=True, require_confirm_tools=["bash"], default_timeout_ms=10_000)
    async with coven_agent(agent, gateway, approval=policy):
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "t-approve", "run both")
        asked = await stream.events("r1", until="tool_approval_request")
        assert asked == [
            THINKING,
            ("tool_use", pb.ToolUse(id="c1", name="bash", input_json='{"command": "echo one"}')),
            state("c1", pb.TOOL_STATE_PENDING),
            ("tool_use", pb.ToolUse(id="c2", name="bash", input_json='{"command": "echo two"}')),
            state("c2", pb.TOOL_STATE_PENDING),
            state("c1", pb.TOOL_STATE_AWAITING_APPROVAL),
            (
                "tool_approval_request",
                pb.ToolApprovalRequest(id="c1", name="bash", input_json='{"command": "echo one"}'),
            ),
        ]
        stream.send(tool_approval=pb.ToolApprovalResponse(id="c1", approved=True, approve_all=True))
        assert await stream.events("r1") == [
            state("c1", pb.TOOL_STATE_RUNNING),
            state("c1", pb.TOOL_STATE_COMPLETED),
            ("tool_result", pb.ToolResult(id="c1", output="one\n")),
            state("c2", pb.TOOL_STATE_RUNNING),  # no second approval request
            state("c2", pb.TOOL_STATE_COMPLETED),
            ("tool_result", pb.ToolResult(id="c2", output="two\n")),
            THINKING,
            ("text", "ok"),
            usage_of(agent, "t-approve"),
            ("done", pb.Done(full_response="ok")),
        ]


async def test_a_denied_tool_is_not_run(agent: LiveServer, gateway: FakeGateway, fake: FakeLLM) -> None:
    # Confirmation set on the thread's session itself, before the thread's first message.
    session_id = session_id_for("t-deny")
    await agent.runtime.sessions.create(session_id, SessionConfig(), [])
    await agent.runtime.control.set_confirmation_policy(
        session_id, ConfirmationPolicy(enabled=True, require_confirm_tools=["bash"])
    )
    fake.script(tool_call("bash", {"command": "touch denied.txt"}, id="c1"), text("fine"))
    async with coven_agent(agent, gateway):
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "t-deny", "make a file")
        asked = await stream.events("r1", until="tool_approval_request")
        assert kinds(asked)[-2:] == ["tool_state", "tool_approval_request"]
        stream.send(tool_approval=pb.ToolApprovalResponse(id="c1", approved=False))
        assert await stream.events("r1") == [
            state("c1", pb.TOOL_STATE_DENIED, "denied by the gateway user"),
            (
                "tool_result",
                pb.ToolResult(
                    id="c1", output="error: rejected by user: denied by the gateway user", is_error=True
                ),
            ),
            THINKING,
            ("text", "fine"),
            usage_of(agent, "t-deny"),
            ("done", pb.Done(full_response="fine")),
        ]
    assert not (agent.workspace / "denied.txt").exists()


async def test_policy_denials_and_approval_timeouts_end_the_tool(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    session_id = session_id_for("t-policy")
    await agent.runtime.sessions.create(session_id, SessionConfig(), [])
    policy = a3s_pb.PermissionPolicy(enabled=True, deny=[a3s_pb.PermissionRule(rule="Bash(rm:*)")])
    await agent.stub.SetPermissionPolicy(
        a3s_pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy)
    )
    await agent.runtime.control.set_confirmation_policy(
        session_id, ConfirmationPolicy(enabled=True, require_confirm_tools=["bash"], default_timeout_ms=100)
    )
    fake.script(
        tool_calls(
            [call("bash", {"command": "rm -rf x"}, id="c1"), call("bash", {"command": "echo hi"}, id="c2")]
        ),
        text("noted"),
    )
    async with coven_agent(agent, gateway):
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "t-policy", "clean up")
        events = await stream.events("r1")
    assert events[5:] == [
        state("c1", pb.TOOL_STATE_DENIED, "bash denied by policy: Bash(rm:*)"),
        ("tool_result", pb.ToolResult(id="c1", output="error: denied by policy: Bash(rm:*)", is_error=True)),
        state("c2", pb.TOOL_STATE_AWAITING_APPROVAL),
        (
            "tool_approval_request",
            pb.ToolApprovalRequest(id="c2", name="bash", input_json='{"command": "echo hi"}'),
        ),
        state("c2", pb.TOOL_STATE_TIMEOUT, "no answer for bash within 100 ms: rejected"),
        (
            "tool_result",
            pb.ToolResult(
                id="c2", output="error: rejected by user: no confirmation within 100 ms", is_error=True
            ),
        ),
        THINKING,
        ("text", "noted"),
        usage_of(agent, "t-policy"),
        ("done", pb.Done(full_response="noted")),
    ]


async def test_cancel_stops_the_running_request_and_drops_a_queued_one(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(tool_call("bash", {"command": "sleep 30"}, id="c1"))
    async with coven_agent(agent, gateway):
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "t-1", "wait a while")
        send_message(stream, "r2", "t-2", "and then this")
        started = time.monotonic()
        assert (await stream.events("r1", until="tool_state"))[-1] == state("c1", pb.TOOL_STATE_PENDING)
        assert await stream.events("r1", until="tool_state") == [state("c1", pb.TOOL_STATE_RUNNING)]

        stream.send(cancel_request=pb.CancelRequest(request_id="r2", reason="changed my mind"))
        assert await stream.events("r2") == [("cancelled", pb.Cancelled(reason="changed my mind"))]
        stream.send(cancel_request=pb.CancelRequest(request_id="r1", reason="user_requested"))
        assert await stream.events("r1") == [
            state("c1", pb.TOOL_STATE_CANCELLED, "user_requested"),
            usage_of(agent, "t-1"),
            ("cancelled", pb.Cancelled(reason="user_requested")),
        ]
        assert time.monotonic() - started < 5
    assert len(fake.requests) == 1  # r2 never ran


async def test_injections_are_stored_where_the_history_stays_valid(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(tool_call("bash", {"command": "sleep 0.3"}, id="c1"), text("noted"), text("ok"))
    async with coven_agent(agent, gateway):
        stream, _ = await gateway.accept()
        stream.send(inject_context=pb.InjectContext(injection_id="i0", content="too early"))
        ack = (await stream.take("injection_ack")).injection_ack
        assert (ack.injection_id, ack.accepted) == ("i0", False)
        assert "no conversation" in ack.reason

        send_message(stream, "r1", "t-inj", "go")
        await stream.events("r1", until="tool_state")
        await stream.events("r1", until="tool_state")  # RUNNING: between the call and its result
        for injection_id, priority in [("i1", "IMMEDIATE"), ("i2", "DEFERRED")]:
            stream.send(
                inject_context=pb.InjectContext(
                    injection_id=injection_id,
                    content=f"{injection_id} context",
                    priority=pb.InjectionPriority.Value(f"INJECTION_PRIORITY_{priority}"),
                    source="pack:test",
                )
            )
            ack = (await stream.take("injection_ack")).injection_ack
            assert ack == pb.InjectionAck(injection_id=injection_id, accepted=True)
        assert (await stream.events("r1"))[-1][0] == "done"

        stream.send(inject_context=pb.InjectContext(injection_id="i3", content="i3 context"))  # idle
        assert (await stream.take("injection_ack")).injection_ack.accepted
        send_message(stream, "r2", "t-inj", "next")
        assert (await stream.events("r2"))[-1][0] == "done"

    history = await agent.runtime.sessions.history(session_id_for("t-inj"))
    assert [(m.role, m.content) for m in history] == [
        ("user", "go"),
        ("assistant", ""),
        ("tool", ""),
        ("user", "[context from pack:test]\ni1 context"),  # IMMEDIATE: at the turn boundary
        ("assistant", "noted"),
        ("user", "[context from pack:test]\ni2 context"),  # DEFERRED: after the request
        ("user", "[context from gateway]\ni3 context"),  # idle: into the last thread
        ("user", "next"),
        ("assistant", "ok"),
    ]
    assert history[3].metadata == {"coven_injection_id": "i1", "coven_source": "pack:test"}
    seen_by_the_model = [m["content"] for m in fake.requests[-1].messages]
    assert seen_by_the_model[-5:] == [
        history[3].content,
        "noted",
        history[5].content,
        history[6].content,
        "next",
    ]


async def test_a_failing_model_ends_the_request_with_an_error(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(error(400, "bad request from the model"))
    async with coven_agent(agent, gateway):
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "t-err", "hi")
        events = await stream.events("r1")
        assert kinds(events) == ["thinking", "error"]
        assert "bad request from the model" in events[-1][1]
        stream.send(send_message=pb.SendMessage(request_id="r2", content="no thread"))
        assert await stream.events("r2") == [THINKING, ("error", "send_message.thread_id is required")]


# --- connection lifecycle -----------------------------------------------------------------


async def test_shutdown_finishes_the_current_request_then_closes(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(tool_call("bash", {"command": "sleep 0.3"}, id="c1"), text("bye"))
    async with coven_agent(agent, gateway) as coven:
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "t-1", "work")
        await stream.events("r1", until="tool_state")
        send_message(stream, "r2", "t-1", "queued")
        stream.send(shutdown=pb.Shutdown(reason="maintenance"))
        assert await stream.events("r2") == [
            ("cancelled", pb.Cancelled(reason="the agent is shutting down: maintenance"))
        ]
        assert kinds(await stream.events("r1")) == [
            "tool_state", "tool_state", "tool_result", "thinking", "text", "usage", "done",
        ]  # fmt: skip
        await stream.until_closed()
        assert await coven.exit_code() == 0
        assert gateway.streams.empty()  # no reconnect


async def test_stopping_cancels_the_current_request(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(tool_call("bash", {"command": "sleep 30"}, id="c1"))
    async with coven_agent(agent, gateway) as coven:
        stream, _ = await gateway.accept()
        send_message(stream, "r1", "t-1", "work")
        await stream.events("r1", until="tool_state")
        await stream.events("r1", until="tool_state")
        coven.stop.set()
        assert (await stream.events("r1"))[-1] == ("cancelled", pb.Cancelled(reason="the agent is stopping"))
        await stream.until_closed()
        assert await coven.exit_code() == 0


async def test_a_dropped_connection_is_reestablished_with_the_same_id(
    agent: LiveServer, gateway: FakeGateway, fake: FakeLLM
) -> None:
    fake.script(tool_call("bash", {"command": "sleep 30"}, id="c1"), text("still here"))
    async with coven_agent(agent, gateway):
        stream, first = await gateway.accept()
        send_message(stream, "r1", "t-1", "work")
        await stream.events("r1", until="tool_state")
        await stream.events("r1", until="tool_state")  # RUNNING
        stream.drop()
        stream, second = await gateway.accept()
        assert second == first
        # The request could not be answered any more, so its run was stopped.
        assert agent.runtime.control.of(session_id_for("t-1")).run_task is None
        send_message(stream, "r2", "t-2", "hello again")
        assert (await stream.events("r2"))[-1] == ("done", pb.Done(full_response="still here"))


async def test_heartbeats_are_sent_when_idle(agent: LiveServer, gateway: FakeGateway) -> None:
    async with coven_agent(agent, gateway, heartbeat_s=0.05):
        stream, _ = await gateway.accept()
        beats = [(await stream.take("heartbeat")).heartbeat for _ in range(3)]
    now_ms = time.time() * 1000
    assert all(now_ms - 5000 < beat.timestamp_ms <= now_ms for beat in beats)


async def test_the_log_names_the_instance(
    agent: LiveServer, gateway: FakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="a3s_agent.faces.coven")
    tool = pb.ToolDefinition(name="pack_weather")
    async with coven_agent(agent, gateway, heartbeat_s=0.01):
        stream, _ = await gateway.accept(available_tools=[tool], secrets={"API_KEY": "hidden-value"})
        await stream.take("heartbeat")  # serving: the Welcome was handled
    assert "pack_weather" in caplog.text
    assert "instance abc" in caplog.text
    assert "API_KEY" in caplog.text and "hidden-value" not in caplog.text


async def test_the_coven_command_and_serve_flag_connect_as_an_agent(
    gateway: FakeGateway, tmp_path: Path
) -> None:
    """`a3s-agent coven` on its own, and `a3s-agent serve --coven-gateway` beside the server."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    coven_command = [sys.executable, "-m", "a3s_agent", "coven", "--gateway", gateway.address,
                     "--name", "cli-agent", "--workspace", str(workspace),
                     "--data-dir", str(tmp_path / "coven-data")]  # fmt: skip
    server = ServerProcess(workspace, tmp_path / "data")
    serve_command = [*server.command(), "--coven-gateway", gateway.address]
    for command, name in ((coven_command, "cli-agent"), (serve_command, None)):
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
        try:
            stream, register = await gateway.accept()
            assert register.agent_id and (name is None or register.name == name)
            assert register.metadata.working_directory == str(workspace)
            stream.send(shutdown=pb.Shutdown(reason="done"))
            await stream.until_closed()
            if name is not None:  # the coven command ends with its gateway's Shutdown
                assert await asyncio.to_thread(proc.wait, 20) == 0
        finally:
            if proc.poll() is None:
                proc.terminate()
                assert await asyncio.to_thread(proc.wait, 20) == 0
