"""The relay provider and its CLI: outbox files out, inbox files in, a person (here a task) between."""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.app.relay import relay_llm
from a3s_agent.app.standalone import standalone
from a3s_agent.base.errors import FailedPrecondition, Unavailable
from a3s_agent.base.models import Message, SessionConfig
from a3s_agent.config import Settings
from a3s_agent.core.loop.agent import DoneEvent, GenerateOptions
from a3s_agent.faces.relay import relay_new, relay_resume
from a3s_agent.llm.messages import tool_schema
from a3s_agent.llm.provider import CompletionRequest, ProviderEvent, TextDelta, ToolCallReady, TurnEnd
from a3s_agent.text_protocol.relay import RelayProvider, RelayTiming, load_sessions, relay_dir_of
from a3s_agent.text_protocol.renderer import CONTINUATION_PROMPT, PROTOCOL_INSTRUCTIONS
from a3s_agent.text_protocol.tag_mode import TurnScope
from a3s_agent.tools.line_edits import edit_lines as EDIT_LINES_TOOL

FAST = RelayTiming(wait_timeout_s=20, poll_s=0.01, settle_s=0)
TOOLS = [tool_schema(EDIT_LINES_TOOL)]


async def outbox_file(relay_dir: Path, sequence: int) -> Path:
    """The outbox file of `sequence`, once it is there."""
    async with asyncio.timeout(10):
        while True:
            found = sorted((relay_dir / "outbox").glob(f"*_seq{sequence:04d}.txt"))
            if found:
                return found[0]
            await asyncio.sleep(0.01)


async def new_outboxes(relay_dir: Path, known: set[Path]) -> set[Path]:
    """The outbox files that are not `known`, once there is one."""
    while True:
        if found := set((relay_dir / "outbox").glob("*.txt")) - known:
            return found
        await asyncio.sleep(0.01)


async def replies_read(relay_dir: Path, count: int) -> None:
    """Once `count` replies have been read (and moved to inbox/processed)."""
    while True:
        if len(list((relay_dir / "inbox" / "processed").glob("*.txt"))) >= count:
            return
        await asyncio.sleep(0.01)


async def person(relay_dir: Path, replies: list[str], first: int = 1) -> list[str]:
    """Answer outbox `first`, `first + 1`... with `replies`; returns the outboxes as read."""
    seen = []
    for sequence, reply in enumerate(replies, first):
        seen.append((await outbox_file(relay_dir, sequence)).read_text(encoding="utf-8"))
        (relay_dir / "inbox" / f"reply{sequence}.txt").write_text(reply, encoding="utf-8")
    return seen


def outbox(handle: str, sequence: int, task: str, context: str, prompt: str) -> str:
    return (
        f"=== HEADER ===\nSession: {handle}\nSequence: {sequence}\nTask: {task}\n\n"
        f"=== PROTOCOL ===\n{PROTOCOL_INSTRUCTIONS}\n\n"
        f"=== CONTEXT ===\n{context}\n\n"
        f"=== PROMPT ===\n{prompt}\n"
    )


def request(*messages: dict[str, Any]) -> CompletionRequest:
    return CompletionRequest(
        model="relay", messages=[{"role": "system", "content": "sys"}, *messages], tools=TOOLS
    )


async def events_of(provider: RelayProvider, turn: CompletionRequest) -> list[ProviderEvent]:
    return [event async for event in provider.stream(turn)]


def write_reply(relay_dir: Path, name: str, text: str, age_s: float = 0) -> None:
    path = relay_dir / "inbox" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


# The relay directory


@pytest.mark.parametrize(
    ("base_url", "default", "expected"),
    [
        ("relay:///srv/relay", "", "/srv/relay"),
        ("relay://rel/dir", "", "rel/dir"),
        ("/plain/path", "/env", "/plain/path"),
        ("", "/from/env", "/from/env"),
    ],
)
def test_the_relay_directory_comes_from_base_url_else_the_default(
    base_url: str, default: str, expected: str
) -> None:
    assert relay_dir_of(base_url, default) == Path(expected)


def test_a_relay_without_a_directory_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="A3S_RELAY_DIR"):
        relay_dir_of("", "")


async def test_a_turn_needs_its_session_and_tools(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="session and workspace"):
        await events_of(RelayProvider(tmp_path), request({"role": "user", "content": "x"}))
    provider = RelayProvider(tmp_path, scope=TurnScope("s1", tmp_path))
    with pytest.raises(FailedPrecondition, match="tools are off"):
        await events_of(
            provider, CompletionRequest(model="relay", messages=[{"role": "user", "content": "x"}])
        )


# Through the agent loop


async def test_outboxes_carry_the_task_then_the_results_and_requested_files(tmp_path: Path) -> None:
    workspace, relay_dir = tmp_path / "workspace", tmp_path / "relay"
    workspace.mkdir()
    (workspace / "README.md").write_text("hello\n")
    provider = RelayProvider(relay_dir, timing=FAST)  # the turn's session and workspace: from its request
    settings = Settings(workspace=workspace, data_dir=tmp_path / "data")
    async with standalone(settings, relay=lambda llm: provider) as app:
        config = SessionConfig(workspace=str(workspace), llm=relay_llm(relay_dir))
        session = (await app.sessions.create(None, config, [], {})).session
        replies = [
            'Sure.\n[CREATE_FILE path="src/app.py"]\nprint("hi")\n[/CREATE_FILE]\n'
            '[READ_FILE path="README.md"]\n[RUN_COMMAND]\npython3 src/app.py\n[/RUN_COMMAND]\n',
            "[DONE]\nAdded src/app.py.\n[/DONE]\n",
        ]
        answering = asyncio.create_task(person(relay_dir, replies))
        run = app.generation.stream(
            session.id, [Message(role="user", content="Write an app")], GenerateOptions()
        )
        events = [event async for event in run]
        first, second = await answering

    done = events[-1]
    assert isinstance(done, DoneEvent) and done.generation.message.content == "Added src/app.py."
    assert (workspace / "src" / "app.py").read_text() == 'print("hi")\n'
    [state] = load_sessions(relay_dir).values()
    handle = state.handle
    assert len(handle) == 8 and int(handle, 16) >= 0
    assert (state.session_id, state.sequence, state.answered, state.complete) == (session.id, 2, 2, True)

    assert first == outbox(
        handle, 1, "Write an app", "## Workspace Files\n  README.md (6 bytes)", "Write an app"
    )
    context = "\n".join(
        [
            "## Workspace Files",
            "  README.md (6 bytes)",
            "  src/app.py (12 bytes)",
            "",
            "## Previous Command Results",
            "[OK] CREATE_FILE: Created 'src/app.py'",
            "[OK] READ_FILE: Read 'README.md'",
            "[OK] RUN_COMMAND: Ran 'python3 src/app.py' (exit code 0)",
            "  Output: hi",
            "",
            "## Requested File Contents",
            "--- README.md ---",
            "hello",
            "--- end README.md ---",
        ]
    )
    assert second == outbox(handle, 2, "Write an app", context, CONTINUATION_PROMPT)
    assert sorted(p.name for p in (relay_dir / "outbox").iterdir()) == [
        f"{handle}_seq0001.txt",
        f"{handle}_seq0002.txt",
    ]
    assert sorted(p.name for p in (relay_dir / "inbox").iterdir()) == ["processed"]
    assert sorted(p.name for p in (relay_dir / "inbox" / "processed").iterdir()) == [
        f"{handle}_seq0001_reply1.txt",
        f"{handle}_seq0002_reply2.txt",
    ]


# The inbox


async def test_replies_are_read_oldest_first_and_moved_to_processed(tmp_path: Path) -> None:
    relay_dir = tmp_path / "relay"
    write_reply(relay_dir, "b-newer.txt", "[DONE]\ntwo\n[/DONE]", age_s=50)
    write_reply(relay_dir, "a-older.txt", "[RUN_COMMAND]\necho one\n[/RUN_COMMAND]", age_s=100)
    write_reply(relay_dir, ".hidden.txt", "[DONE]\nnever\n[/DONE]", age_s=200)
    write_reply(relay_dir, "notes.md", "[DONE]\nnever\n[/DONE]", age_s=200)
    provider = RelayProvider(relay_dir, scope=TurnScope("s1", tmp_path), timing=FAST)

    task = {"role": "user", "content": "Do it"}
    first = await events_of(provider, request(task))
    assert isinstance(first[1], ToolCallReady) and json.loads(first[1].arguments)["command"] == "echo one"
    assert sorted(p.name for p in (relay_dir / "inbox").glob("*.*")) == [
        ".hidden.txt",
        "b-newer.txt",
        "notes.md",
    ]

    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": first[1].arguments}}
    reply = {"role": "assistant", "content": "[RUN_COMMAND]\necho one\n[/RUN_COMMAND]", "tool_calls": [call]}
    second = await events_of(
        provider, request(task, reply, {"role": "tool", "tool_call_id": "c1", "content": "one\n"})
    )
    assert second == [TextDelta("two"), TurnEnd("stop")]
    handle = next(iter(load_sessions(relay_dir)))
    assert sorted(p.name for p in (relay_dir / "inbox" / "processed").iterdir()) == [
        f"{handle}_seq0001_a-older.txt",
        f"{handle}_seq0002_b-newer.txt",
    ]
    continuation = (relay_dir / "outbox" / f"{handle}_seq0002.txt").read_text()
    assert "[OK] RUN_COMMAND: Ran 'echo one' (exit code 0)\n  Output: one\n" in continuation


async def test_a_reply_still_being_written_is_left_alone_until_it_settles(tmp_path: Path) -> None:
    relay_dir = tmp_path / "relay"
    write_reply(relay_dir, "fresh.txt", "[DONE]\nx\n[/DONE]")
    provider = RelayProvider(
        relay_dir,
        scope=TurnScope("s1", tmp_path),
        timing=RelayTiming(wait_timeout_s=0.1, poll_s=0.01, settle_s=30),
    )
    with pytest.raises(Unavailable):
        await events_of(provider, request({"role": "user", "content": "go"}))
    assert (relay_dir / "inbox" / "fresh.txt").exists()


async def test_an_unanswered_outbox_times_out_and_is_waited_on_again_after_a_restart(tmp_path: Path) -> None:
    relay_dir, scope = tmp_path / "relay", TurnScope("s1", tmp_path)
    turn = request({"role": "user", "content": "go"})
    impatient = RelayProvider(relay_dir, scope=scope, timing=RelayTiming(wait_timeout_s=0.05, poll_s=0.01))
    with pytest.raises(Unavailable, match=r"no reply came to .*_seq0001\.txt within 0\.05 s"):
        await events_of(impatient, turn)
    [state] = load_sessions(relay_dir).values()
    assert (state.sequence, state.answered, state.pending) == (1, 0, True)

    # A new provider (a restart) writes no new outbox: it waits for the reply to the old one.
    write_reply(relay_dir, "late.txt", "[DONE]\nlate but fine\n[/DONE]", age_s=5)
    waited: list[Path] = []
    restarted = RelayProvider(relay_dir, scope=scope, timing=FAST, on_waiting=waited.append)
    assert await events_of(restarted, turn) == [TextDelta("late but fine"), TurnEnd("stop")]
    assert waited == [relay_dir / "outbox" / f"{state.handle}_seq0001.txt"]
    assert len(list((relay_dir / "outbox").iterdir())) == 1

    # Numbering goes on from there.
    write_reply(relay_dir, "next.txt", "[DONE]\nagain\n[/DONE]", age_s=5)
    await events_of(
        restarted, request({"role": "user", "content": "go"}, {"role": "user", "content": "more"})
    )
    [state] = load_sessions(relay_dir).values()
    assert (state.sequence, state.answered, state.task) == (2, 2, "more")


async def test_cancelling_a_wait_leaves_the_outbox_pending_and_the_relay_usable(tmp_path: Path) -> None:
    relay_dir = tmp_path / "relay"
    provider = RelayProvider(relay_dir, scope=TurnScope("s1", tmp_path), timing=FAST)
    turn = request({"role": "user", "content": "go"})
    waiting = asyncio.create_task(events_of(provider, turn))
    await outbox_file(relay_dir, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert next(iter(load_sessions(relay_dir).values())).pending

    write_reply(relay_dir, "reply.txt", "[DONE]\ndone\n[/DONE]")
    async with asyncio.timeout(5):
        assert await events_of(provider, turn) == [TextDelta("done"), TurnEnd("stop")]


async def test_sessions_on_one_relay_directory_take_turns_whatever_it_is_called(tmp_path: Path) -> None:
    """Two providers (two configs naming the directory differently): one turn at a time, so each
    session reads the reply to its own outbox and sessions.json keeps both sessions' numbering."""
    relay_dir = tmp_path / "relay"
    relay_dir.mkdir()
    (tmp_path / "link").symlink_to(relay_dir, target_is_directory=True)
    providers = {
        "s1": RelayProvider(relay_dir, scope=TurnScope("s1", tmp_path), timing=FAST),
        "s2": RelayProvider(tmp_path / "link", scope=TurnScope("s2", tmp_path), timing=FAST),
    }
    turns = {
        session: asyncio.create_task(
            events_of(provider, request({"role": "user", "content": f"task {session}"}))
        )
        for session, provider in providers.items()
    }
    answered: set[Path] = set()
    async with asyncio.timeout(10):
        for _ in providers:
            waiting = await new_outboxes(relay_dir, answered)
            assert len(waiting) == 1, f"outboxes waiting at once: {sorted(p.name for p in waiting)}"
            [outbox] = waiting
            task = outbox.read_text().split("Task: ")[1].split("\n")[0]
            write_reply(relay_dir, "answer.txt", f"[DONE]\nanswer to {task}\n[/DONE]")
            answered.add(outbox)
            await replies_read(relay_dir, len(answered))
        results = {session: await turn for session, turn in turns.items()}

    assert results == {s: [TextDelta(f"answer to task {s}"), TurnEnd("stop")] for s in providers}
    states = {state.session_id: state for state in load_sessions(relay_dir).values()}
    assert {s: (state.sequence, state.answered) for s, state in states.items()} == {
        "s1": (1, 1),
        "s2": (1, 1),
    }


# The CLI


async def test_relay_new_runs_a_task_to_done(tmp_path: Path) -> None:
    workspace, relay_dir, out = tmp_path / "workspace", tmp_path / "relay", io.StringIO()
    workspace.mkdir()
    reply = '[CREATE_FILE path="hello.txt"]\nhello\n[/CREATE_FILE]\n[DONE]\nWrote hello.txt.\n[/DONE]'
    answering = asyncio.create_task(person(relay_dir, [reply]))
    code = await asyncio.to_thread(
        relay_new, "Write hello.txt", workspace=workspace, relay_dir=relay_dir, timing=FAST, out=out
    )
    await answering
    assert code == 0
    assert (workspace / "hello.txt").read_text() == "hello\n"
    [state] = load_sessions(relay_dir).values()
    printed = out.getvalue()
    assert f"Outbox: {relay_dir.resolve()}/outbox/{state.handle}_seq0001.txt" in printed
    assert "OK     write_file hello.txt" in printed and printed.endswith("\nWrote hello.txt.\n")

    out = io.StringIO()
    assert relay_resume(relay_dir=relay_dir, out=out) == 0
    assert out.getvalue() == f"Session {state.handle} is complete: Write hello.txt\n"


async def test_relay_resume_waits_again_for_the_unanswered_outbox(tmp_path: Path) -> None:
    workspace, relay_dir, out = tmp_path / "workspace", tmp_path / "relay", io.StringIO()
    workspace.mkdir()
    impatient = RelayTiming(wait_timeout_s=0.1, poll_s=0.01, settle_s=0)
    code = await asyncio.to_thread(
        relay_new, "Count", workspace=workspace, relay_dir=relay_dir, timing=impatient, out=out
    )
    assert code == 1 and "error: no reply came to" in out.getvalue()
    [state] = load_sessions(relay_dir).values()

    replies = ["[RUN_COMMAND]\necho 1 2 3\n[/RUN_COMMAND]", "[DONE]\nCounted to 3.\n[/DONE]"]
    answering = asyncio.create_task(person(relay_dir, replies))
    out = io.StringIO()
    code = await asyncio.to_thread(
        relay_resume, relay_dir=relay_dir, handle=state.handle, timing=FAST, out=out
    )
    await answering
    assert code == 0 and out.getvalue().startswith(f"Resuming session {state.handle}: Count\n")
    assert "OK     bash echo 1 2 3" in out.getvalue() and out.getvalue().endswith("\nCounted to 3.\n")
    [state] = load_sessions(relay_dir).values()
    assert (state.sequence, state.answered, state.complete) == (2, 2, True)
    assert relay_resume(relay_dir=relay_dir, handle="ffffffff", out=io.StringIO()) == 2
