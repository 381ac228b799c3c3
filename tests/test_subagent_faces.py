"""Subagents as the faces other than gRPC show them, each through its real interface: ACP (`a3s-agent
acp` driven by the ACP SDK's client), the HTTP face (REST, SSE, WebSocket, the A3S harness) and
the MCP server face (the MCP SDK's client), against the fake LLM, which plays the parent and its
child in turn (one child at a time: the fake answers requests in order)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from acp import text_block
from acp.schema import ToolCallProgress, ToolCallStart

from a3s_agent.base.models import SessionConfig
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import (
    LiveServer,
    agent_settings,
    alive,
    eventually,
    host_pid,
    initialize,
    new_session,
    running,
)
from .test_acp import Editor, acp_agent
from .test_harness import RELEASE, all_events, command, finished, start
from .test_http import serving, socket_to, sse
from .test_http import user as http_user
from .test_mcp_server import client_of, mcp_server, texts


def task(agent: str, prompt: str, id: str, description: str = "look") -> Any:
    return tool_call("task", {"agent": agent, "description": description, "prompt": prompt}, id=id)


def contents(update: ToolCallStart | ToolCallProgress) -> str:
    return "\n".join(getattr(c.content, "text", "") for c in update.content or [] if c.type == "content")


# --- ACP ----------------------------------------------------------------------------------------


async def test_acp_shows_a_task_call_with_its_childs_steps_then_its_answer(
    workspace: Path, tmp_path: Path
) -> None:
    (workspace / "a.txt").write_text("alpha-body\n")
    async with FakeLLM(
        task("explore", "Read a.txt", "call_t", "read a"),
        tool_call("read_file", {"path": "a.txt"}, id="child_read"),
        text("a.txt says alpha"),
        text("The child says alpha."),
    ) as fake:
        editor = Editor()
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            async with asyncio.timeout(60):
                reply = await conn.prompt(session_id=session_id, prompt=[text_block("Look at a.txt")])

    assert reply.stop_reason == "end_turn" and editor.answer_text() == "The child says alpha."
    updates = editor.call_updates("call_t")
    assert isinstance(updates[0], ToolCallStart) and updates[0].title == "task explore: read a"
    child = f"{session_id}.call_t"
    # While the child works the call shows its steps: the read running, then done.
    shown = [contents(u) for u in updates[1:-1] if u.status in (None, "in_progress")]
    assert any("- read_file: running" in s for s in shown), shown
    assert any("- read_file: done" in s for s in shown), shown
    assert all(s.startswith(f"explore subagent (session {child})") for s in shown if s)
    # It ends completed, with the steps and then the child's answer.
    assert editor.statuses("call_t")[-1] == "completed"
    assert editor.last_text("call_t") == "a.txt says alpha"
    assert "- read_file: done" in contents(updates[-1])
    assert not editor.call_updates("child_read")  # the child's calls are not the parent's
    assert not editor.asked


async def test_acp_asks_the_editor_about_a_childs_call_naming_the_child_and_its_answer_counts(
    workspace: Path, tmp_path: Path
) -> None:
    async with FakeLLM(
        task("general", "Make a file", "call_t", "make a file"),
        tool_call("bash", {"command": "touch made.txt"}, id="c1"),
        tool_call("bash", {"command": "rm -f made.txt"}, id="c2"),
        text("made it, the removal was refused"),
        text("Done."),
    ) as fake:
        editor = Editor(answers=["allow-once", "reject-once"])
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session_id = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            async with asyncio.timeout(60):  # unanswered, a child's call would wait 30 minutes
                reply = await conn.prompt(session_id=session_id, prompt=[text_block("Make a file")])

    assert reply.stop_reason == "end_turn"
    assert (workspace / "made.txt").exists()  # made (allowed), not removed (rejected)
    child = f"{session_id}.call_t"
    asked = [call for call, _ in editor.asked]
    assert [c.tool_call_id for c in asked] == [f"{child}/c1", f"{child}/c2"]
    assert [c.title for c in asked] == [
        "general subagent: bash touch made.txt",
        "general subagent: bash rm -f made.txt",
    ]
    assert [o.name for o in editor.asked[0][1]] == ["Allow once", "Always allow bash(touch:*)", "Reject"]
    # Each shown as a call of its own that ends with the child's result.
    assert editor.statuses(f"{child}/c1") == ["pending", "in_progress", "completed"]
    assert editor.statuses(f"{child}/c2")[-1] == "failed"
    assert "rejected by user" in json.dumps(fake.requests[3].messages[-1])  # what the child's model read
    assert editor.statuses("call_t")[-1] == "completed"
    assert editor.last_text("call_t") == "made it, the removal was refused"


# --- MCP server face ----------------------------------------------------------------------------


async def test_mcp_agent_task_naming_an_agent_delegates_to_it_as_a_subagent(
    workspace: Path, tmp_path: Path
) -> None:
    (workspace / "a.txt").write_text("alpha-body\n")
    reported: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append(message or "")

    async with (
        FakeLLM(tool_call("read_file", {"path": "a.txt"}, id="r"), text("a.txt says alpha")) as fake,
        mcp_server(workspace, tmp_path / "data", fake) as served,
        client_of(served.url, "legacy") as client,
    ):
        session_id = (await served.app.sessions.create(None, SessionConfig(), [], {})).session.id
        result = await client.call_tool(
            "agent_task",
            {"task": "Read a.txt", "agent": "explore", "session_id": session_id},
            progress_callback=on_progress,
        )
        unknown = await client.call_tool(
            "agent_task", {"task": "x", "agent": "no-such-agent", "session_id": session_id}
        )
        [child] = served.app.subagents.children(session_id)
        parent_history = await served.app.sessions.history(session_id)
        child_history = await served.app.sessions.history(child.id)

    assert not result.is_error, texts(result)
    done = result.structured_content
    assert done is not None and done["answer"] == "a.txt says alpha" == texts(result)[0]
    assert (done["session_id"], done["agent"], done["child_session_id"]) == (session_id, "explore", child.id)
    assert child.parent is not None and (child.parent.session_id, child.parent.agent) == (
        session_id,
        "explore",
    )
    # The child worked in its own session; the parent's history is untouched.
    assert [m.role for m in child_history] == ["user", "assistant", "tool", "assistant"]
    assert parent_history == []
    # The explore agent's tools (read-only), not the whole set.
    offered = {t["function"]["name"] for t in fake.requests[0].tools or []}
    assert "read_file" in offered and "bash" not in offered and "write_file" not in offered
    assert reported[0] == f"subagent explore started in session {child.id}"
    assert "calling read_file" in reported and "read_file done" in reported
    assert reported[-1] == "subagent explore ended (stop)"
    assert unknown.is_error and texts(unknown)[0].startswith("NOT_FOUND") and "explore" in texts(unknown)[0]


# --- HTTP: REST, SSE, WebSocket; gRPC's GetSession metadata ---------------------------------------


async def test_http_shows_a_childs_parent_link_its_parents_children_and_the_child_in_the_streams(
    agent: LiveServer, fake: FakeLLM
) -> None:
    (agent.workspace / "a.txt").write_text("alpha-body\n")
    fake.script(
        task("explore", "Read a.txt", "call_t", "read a"),
        tool_call("read_file", {"path": "a.txt"}, id="child_read"),
        text("a.txt says alpha"),
        text("The child says alpha."),
    )
    session_id = await new_session(agent)
    child = f"{session_id}.call_t"
    async with serving(agent) as http:
        stream = await http.client.post(
            f"/sessions/{session_id}/generate/stream", json={"messages": [http_user("go")]}
        )
        chunks = [data for event, data in await sse(stream) if event == "message"]
        child_view = await http.client.get(f"/sessions/{child}")
        parent_view = await http.client.get(f"/sessions/{session_id}")
        async with socket_to(http) as sock:
            await sock.ws.send_json(
                {
                    "method": "subscribe_events",
                    "params": {"session_id": session_id},
                    "id": "e",
                    "after_seq": 0,
                }
            )
            events: list[dict[str, Any]] = []
            while not any(e["message"] == "subagent_end" for e in events):
                events.append((await sock.next_for("e"))["result"])
    call = agent.stub.GetSession(pb.GetSessionRequest(session_id=child))
    assert (await call).session.session_id == child
    trailing = dict(await call.trailing_metadata() or ())

    # The SSE stream of the parent's generation: the child's start, steps and end, naming it.
    notices = [c["metadata"] for c in chunks if c["metadata"].get("type", "").startswith("subagent_")]
    assert {c["type"] for c in chunks if c["metadata"] in notices} == {"CHUNK_TYPE_METADATA"}
    said = [(n["type"], n.get("step", "")) for n in notices]
    assert said == [
        ("subagent_start", ""),
        ("subagent_progress", "tool_call"),
        ("subagent_progress", "tool_result"),
        ("subagent_end", ""),
    ]
    assert all(n["child_session_id"] == child and n["tool_id"] == "call_t" for n in notices)
    # The WebSocket's events of the parent: the same, each with the child's id.
    infos = [e for e in events if e["message"].startswith("subagent_")]
    assert [e["message"] for e in infos] == [
        "subagent_start", "subagent_progress", "subagent_progress", "subagent_end"
    ]  # fmt: skip
    assert all(e["session_id"] == session_id and e["data"]["child_session_id"] == child for e in infos)
    # The child's view: its parent link in the JSON and the headers; the parent's: its children.
    assert child_view.status == 200, await child_view.text()
    shown = (await child_view.json())["session"]
    assert shown["session_id"] == child
    assert shown["parent"] == {"session_id": session_id, "tool_call_id": "call_t", "agent": "explore"}
    assert shown["children"] == []
    assert child_view.headers["a3s-parent-session-id"] == session_id
    assert child_view.headers["a3s-parent-tool-call-id"] == "call_t"
    assert child_view.headers["a3s-agent"] == "explore"
    parent = (await parent_view.json())["session"]
    assert parent["parent"] is None and "a3s-parent-session-id" not in parent_view.headers
    assert [(c["session_id"], c["tool_call_id"], c["agent"], c["name"]) for c in parent["children"]] == [
        (child, "call_t", "explore", "explore: read a")
    ]
    # gRPC's GetSession: the link in the reply's trailing metadata, as the session's other facts.
    assert (
        trailing["a3s-parent-session-id"],
        trailing["a3s-parent-tool-call-id"],
        trailing["a3s-agent"],
    ) == (session_id, "call_t", "explore")


# --- the A3S harness ----------------------------------------------------------------------------


async def test_harness_pages_a_childs_start_tool_steps_and_end_under_the_parent_run(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    (workspace / "a.txt").write_text("alpha-body\n")
    fake.script(
        task("explore", "Read a.txt", "call_t", "read a"),
        tool_call("read_file", {"path": "a.txt"}, id="child_read"),
        text("a.txt says alpha"),
        text("The child says alpha."),
    )
    settings = replace(agent_settings(workspace, tmp_path / "data"), release_identity=RELEASE)
    async with running(settings) as server:
        await initialize(server, fake)
        async with serving(server) as http:
            await command(http, start("Look at a.txt"))
            assert (await finished(http))["state"] == "completed"
            events = [e["event"] for e in await all_events(http)]
    async with running(settings) as server, serving(server) as http:  # the run read from the store
        again = [e["event"] for e in await all_events(http)]

    session_id, child = "conv-42", "conv-42.call_t"
    kinds = [(e["type"], e["payload"].get("id") or e["payload"].get("status", "")) for e in events]
    at = kinds.index(("tool_execution_start", "call_t"))
    assert kinds[at : at + 6] == [
        ("tool_execution_start", "call_t"),
        ("subagent_start", ""),
        ("subagent_progress", "tool_execution_start"),
        ("subagent_progress", "tool_end"),
        ("subagent_end", ""),
        ("tool_end", "call_t"),
    ]
    assert again == events  # the same events once the run is read back from the store
    started, called, ended, end = (dict(e["payload"]) for e in events[at + 1 : at + 5])
    began, finished_at = started.pop("started_ms"), end.pop("finished_ms")
    assert 0 < began <= finished_at
    assert started == {"task_id": "call_t", "session_id": child, "parent_session_id": session_id,
                       "agent": "explore", "description": "read a"}  # fmt: skip
    assert called == {"task_id": "call_t", "session_id": child, "status": "tool_execution_start",
                      "metadata": {"id": "child_read", "name": "read_file"}}  # fmt: skip
    assert ended["metadata"] == {"id": "child_read", "name": "read_file", "success": True}
    assert end == {"task_id": "call_t", "session_id": child, "agent": "explore",
                   "output": "a.txt says alpha", "success": True}  # fmt: skip
    assert events[at + 5]["payload"]["output"] == "a.txt says alpha"


async def test_mcp_cancelling_a_delegated_agent_task_stops_the_child_and_its_tool(
    workspace: Path, tmp_path: Path
) -> None:
    marker = workspace / "pid"
    running_bash = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message == "calling bash":
            running_bash.set()

    async with (
        FakeLLM(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never")) as fake,
        mcp_server(workspace, tmp_path / "data", fake) as served,
        client_of(served.url, "legacy") as client,
    ):
        session_id = (await served.app.sessions.create(None, SessionConfig(), [], {})).session.id
        arguments = {"task": "Wait", "agent": "general", "session_id": session_id}
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(
                    lambda: client.call_tool("agent_task", arguments, progress_callback=on_progress)
                )
                with anyio.fail_after(30):
                    await running_bash.wait()
                pid = host_pid(
                    int(
                        await eventually(
                            lambda: marker.exists() and marker.read_text().strip(), "the tool runs"
                        )
                    )
                )
                scope.cancel()
        await eventually(lambda: not alive(pid), "the child's tool's process is gone")
        [child] = served.app.subagents.children(session_id)

        async def answered() -> bool:  # the child's open call, once its run has written its end
            history = await served.app.sessions.history(child.id)
            return any(m.role == "tool" and "cancelled" in m.content for m in history)

        await eventually(answered, "the child's open call answered as cancelled")
    assert len(fake.requests) == 1  # the child's model was not called again
