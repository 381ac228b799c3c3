"""Tag tool mode: command blocks as tool calls, results as protocol text, and the edit_lines tool."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from a3s_agent.base.models import LLMConfig, Message, SessionConfig, ToolCall
from a3s_agent.core.loop.agent import DoneEvent, GenerateOptions
from a3s_agent.core.loop.tool_runner import tool_message
from a3s_agent.llm.messages import to_openai, tool_schema
from a3s_agent.llm.modes import tool_mode
from a3s_agent.llm.openai_compat import OpenAICompatibleProvider
from a3s_agent.llm.provider import CompletionRequest, ProviderEvent, TextDelta, ToolCallReady, TurnEnd
from a3s_agent.runtime import Runtime
from a3s_agent.testing.fake_llm import FakeLLM
from a3s_agent.text_protocol.commands import ParseError
from a3s_agent.text_protocol.parser import parse_response
from a3s_agent.text_protocol.renderer import CONTINUATION_PROMPT, PROTOCOL_INSTRUCTIONS, CommandResult
from a3s_agent.text_protocol.tag_mode import (
    TextToolProvider,
    ToolRequest,
    TurnScope,
    pending_summary,
    plan_reply,
    reply_events,
    scope_of,
    text_messages,
    turn_outcome,
    workspace_files,
)
from a3s_agent.tools.builtin import builtin_registry
from a3s_agent.tools.files import read_file
from a3s_agent.tools.line_edits import edit_lines as EDIT_LINES_TOOL
from a3s_agent.tools.registry import ToolContext, ToolOutput

from .conftest import agent_settings

TOOLS = [tool_schema(EDIT_LINES_TOOL)]


def parse_error_line(reply: str) -> str:
    error = next(item for item in parse_response(reply) if isinstance(item, ParseError))
    return CommandResult.from_parse_error(error).format()


# Choosing the mode


@pytest.mark.parametrize(
    ("provider", "default", "expected"),
    [
        ("openai+text", "native", ("openai", "text")),
        ("deepseek+native", "text", ("deepseek", "native")),
        ("openai", "text", ("openai", "text")),
        ("openai", "native", ("openai", "native")),
        ("", "native", ("", "native")),
    ],
)
def test_tool_mode_comes_from_the_provider_suffix_else_the_default(
    provider: str, default: Any, expected: tuple[str, str]
) -> None:
    assert tool_mode(provider, default) == expected


def test_the_scope_is_read_from_the_request(tmp_path: Path) -> None:
    request = CompletionRequest(model="m", messages=[])
    assert scope_of(request) == TurnScope()
    request.session_id = "s1"
    request.workspace = str(tmp_path)
    assert scope_of(request) == TurnScope("s1", tmp_path)


# Replies to tool calls


def test_each_command_becomes_its_tool_call_and_refusals_keep_their_place() -> None:
    reply = "\n".join(
        [
            "Thinking out loud first.",
            '[CREATE_FILE path="src/a.py"]',
            "x = 1",
            "[/CREATE_FILE]",
            '[EDIT_FILE path="src/a.py" start_line="1" end_line="1"]',
            "x = 2",
            "[/EDIT_FILE]",
            '[READ_FILE path="../secret"]',
            "[CREATE_FILE]",
            "no path",
            "[/CREATE_FILE]",
            '[DELETE_FILE path="old.txt"]',
            '[READ_FILE path="src/a.py"]',
            "[RUN_COMMAND]",
            "pytest -q",
            "[/RUN_COMMAND]",
            "[MESSAGE]",
            "Working on it.",
            "[/MESSAGE]",
        ]
    )
    plan = plan_reply(reply)
    assert plan.calls == [
        ToolRequest("write_file", {"path": "src/a.py", "content": "x = 1\n"}),
        ToolRequest("edit_lines", {"path": "src/a.py", "start_line": 1, "end_line": 1, "content": "x = 2\n"}),
        ToolRequest("delete_file", {"path": "old.txt"}),
        ToolRequest("read_file", {"path": "src/a.py"}),
        ToolRequest("bash", {"command": "pytest -q", "timeout_ms": 30_000}),
    ]
    refusals = [step for step in plan.steps if isinstance(step, CommandResult)]
    assert [plan.steps.index(step) for step in refusals] == [2, 3]
    assert (
        refusals[0].format()
        == "[FAILED] READ_FILE: REJECTED: Path is outside workspace (.. is not allowed): ../secret"
    )
    assert refusals[1].format() == parse_error_line(reply)
    assert plan.messages == ["Working on it."] and plan.summary is None


def test_a_reply_with_commands_is_streamed_raw_then_its_calls() -> None:
    reply = "[RUN_COMMAND]\nls\n[/RUN_COMMAND]\n[DONE]\nListed.\n[/DONE]"
    events = reply_events(reply, "stop")
    assert events[0] == TextDelta(reply)
    assert isinstance(events[1], ToolCallReady) and events[1].name == "bash"
    assert json.loads(events[1].arguments) == {"command": "ls", "timeout_ms": 30_000}
    assert events[1].id.startswith("call_")
    assert events[2] == TurnEnd("tool_calls")


@pytest.mark.parametrize(
    ("reply", "finish_reason", "expected"),
    [
        ("All good.\n[DONE]\nDid it.\n[/DONE]", "stop", [TextDelta("Did it."), TurnEnd("stop")]),
        (
            "[MESSAGE]\nA\n[/MESSAGE]\n[MESSAGE]\nB\n[/MESSAGE]",
            "stop",
            [TextDelta("A\n\nB"), TurnEnd("stop")],
        ),
        ("Just prose.", "length", [TextDelta("Just prose."), TurnEnd("length")]),
        (
            "[DELETE_FILE]\n[DONE]\nx\n[/DONE]",
            "stop",
            [TextDelta("[DELETE_FILE]\n[DONE]\nx\n[/DONE]"), TurnEnd("stop")],
        ),
        ("", "stop", [TurnEnd("stop")]),
    ],
)
def test_a_reply_without_commands_ends_the_run_with_its_answer(
    reply: str, finish_reason: str, expected: list[ProviderEvent]
) -> None:
    """DONE's summary, else the MESSAGE texts, else the reply; a reply with a refused block stays whole."""
    assert reply_events(reply, finish_reason) == expected


# Tool results to protocol text


def assistant(content: str, *calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return to_openai(
        Message(
            role="assistant",
            content=content,
            tool_calls=[ToolCall(id, name, json.dumps(arguments)) for id, name, arguments in calls],
        )
    )


def result(call_id: str, name: str, output: ToolOutput) -> dict[str, Any]:
    return to_openai(tool_message(ToolCall(call_id, name), output))


REPLY = "\n".join(
    [
        '[CREATE_FILE path="a.py"]',
        "x = 1",
        "[/CREATE_FILE]",
        "[EDIT_FILE]",
        "[/EDIT_FILE]",
        "[RUN_COMMAND]",
        "python3 a.py",
        "[/RUN_COMMAND]",
    ]
)
HISTORY = [
    {"role": "system", "content": "You are a3s-agent."},
    {"role": "user", "content": "Make a.py"},
    assistant(
        REPLY,
        ("c1", "write_file", {"path": "a.py", "content": "x = 1\n"}),
        ("c2", "bash", {"command": "python3 a.py", "timeout_ms": 30000}),
    ),
    result("c1", "write_file", ToolOutput(output="Created a.py (6 bytes)")),
    result("c2", "bash", ToolOutput(success=False, error="exited with code 1", output="Traceback\nBoom")),
]
RESULTS = "\n".join(
    [
        "## Previous Command Results",
        "[OK] CREATE_FILE: Created 'a.py'",
        parse_error_line(REPLY),
        "[FAILED] RUN_COMMAND: Ran 'python3 a.py': exited with code 1",
        "  Output: Traceback",
        "    Boom",
    ]
)


def test_the_history_is_rewritten_for_a_model_without_function_calling() -> None:
    files = [("a.py", 6)]
    assert text_messages(HISTORY, files) == [
        {
            "role": "system",
            "content": f"You are a3s-agent.\n\n{PROTOCOL_INSTRUCTIONS}\n\n## Workspace Files\n  a.py (6 bytes)",
        },
        {"role": "user", "content": "Make a.py"},
        {"role": "assistant", "content": REPLY},
        {"role": "user", "content": f"{RESULTS}\n\n{CONTINUATION_PROMPT}"},
    ]


def test_a_new_user_message_joins_the_last_results_without_the_continuation_prompt() -> None:
    messages = text_messages([*HISTORY, {"role": "user", "content": "Now fix it"}])
    assert messages[-1] == {"role": "user", "content": f"{RESULTS}\n\nNow fix it"}
    assert "## Workspace Files" not in messages[0]["content"]


def test_calls_that_are_not_from_a_text_reply_are_reported_one_by_one() -> None:
    """History from native mode, or tools a client ran: no reply text to follow."""
    history = [
        {"role": "user", "content": "go"},
        assistant(
            "", ("n1", "grep", {"pattern": "x"}), ("n2", "delete_file", {"path": "b.txt"}), ("n3", "bash", {})
        ),
        result("n1", "grep", ToolOutput(output="a.py:1:x")),
        result("n2", "delete_file", ToolOutput(success=False, error="b.txt does not exist")),
    ]
    outputs = {m["tool_call_id"]: m["content"] for m in history if m["role"] == "tool"}
    outcome = turn_outcome(history[1], outputs)
    assert [r.format() for r in outcome.results] == [
        "[OK] GREP: succeeded\n  Output: a.py:1:x",
        "[FAILED] DELETE_FILE: Could not delete 'b.txt': b.txt does not exist",
        "[FAILED] RUN_COMMAND: not run: the run stopped before this command",
    ]
    assert text_messages(history)[2] == {"role": "assistant", "content": "(ran grep, delete_file, bash)"}


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\x00"), max_size=300))
def test_requested_file_contents_are_the_file_as_read_by_read_file(content: str) -> None:
    with tempfile.TemporaryDirectory() as temp:
        workspace = Path(temp)
        (workspace / "f.txt").write_text(content, encoding="utf-8")
        args = read_file.parse_arguments({"path": "f.txt"})
        output = asyncio.run(read_file.execute(args, ToolContext(workspace)))
    reply = '[READ_FILE path="f.txt"]'
    outcome = turn_outcome(
        assistant(reply, ("r1", "read_file", {"path": "f.txt"})),
        {"r1": to_openai(tool_message(ToolCall("r1", "read_file"), output))["content"]},
    )
    assert outcome.results == [CommandResult("READ_FILE", True, "Read 'f.txt'")]
    assert outcome.files == [("f.txt", content if not content or content.endswith("\n") else content + "\n")]


def test_a_partly_shown_file_says_so() -> None:
    output = "     1\ta\n     2\tb\n(lines 1-2 of 9000; use offset=2 to read more)"
    outcome = turn_outcome(
        assistant('[READ_FILE path="big.txt"]', ("r1", "read_file", {"path": "big.txt"})), {"r1": output}
    )
    assert outcome.results[0].message == "Read 'big.txt' ((lines 1-2 of 9000; use offset=2 to read more))"
    assert outcome.files == [("big.txt", "a\nb\n")]


def test_a_done_after_commands_ends_the_run_once_their_results_are_in() -> None:
    reply = '[DELETE_FILE path="x"]\n[DONE]\nCleaned up.\n[/DONE]'
    history = [{"role": "user", "content": "clean"}, assistant(reply, ("d1", "delete_file", {"path": "x"}))]
    assert pending_summary(history) is None
    history.append(result("d1", "delete_file", ToolOutput(output="Deleted x")))
    assert pending_summary(history) == "Cleaned up."
    assert pending_summary([*history, {"role": "user", "content": "more"}]) is None


def test_the_workspace_listing_leaves_out_hidden_ignored_and_relay_files(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / ".env").write_text("SECRET=1\n")
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "run.log").write_text("noise\n")
    (tmp_path / "relay" / "outbox").mkdir(parents=True)
    (tmp_path / "relay" / "outbox" / "x.txt").write_text("outbox\n")
    (tmp_path / "README.md").write_text("hi\n")
    assert workspace_files(tmp_path, skip=tmp_path / "relay") == [("README.md", 3), ("src/a.py", 6)]
    assert workspace_files(tmp_path / "src") == [("a.py", 6)]


# The provider


@dataclass
class Recorder:
    """An inner provider that records requests and answers with fixed events."""

    events: list[ProviderEvent]
    requests: list[CompletionRequest] = field(default_factory=list)
    closed: bool = False

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        for event in self.events:
            yield event

    async def close(self) -> None:
        self.closed = True


async def test_requests_without_tools_pass_through_untouched() -> None:
    inner = Recorder([TextDelta("a summary"), TurnEnd("stop")])
    provider = TextToolProvider(inner)
    request = CompletionRequest(model="m", messages=[{"role": "user", "content": "summarise"}])
    assert [e async for e in provider.stream(request)] == inner.events
    assert inner.requests == [request]
    await provider.close()
    assert inner.closed


async def test_the_model_sees_no_schemas_and_the_workspace_when_the_request_names_it(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("abc")
    inner = Recorder([TextDelta("[DONE]\n"), TextDelta("ok\n[/DONE]"), TurnEnd("stop")])
    request = CompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
    request.workspace = str(tmp_path)
    events = [e async for e in TextToolProvider(inner).stream(request)]
    assert events == [TextDelta("ok"), TurnEnd("stop")]
    sent = inner.requests[0]
    assert sent.tools == [] and sent.model == "m"
    assert sent.messages[0]["content"].endswith("## Workspace Files\n  a.txt (3 bytes)")


# The edit_lines tool


async def edit(workspace: Path, **arguments: Any) -> ToolOutput:
    return await EDIT_LINES_TOOL.execute(EDIT_LINES_TOOL.parse_arguments(arguments), ToolContext(workspace))


async def test_edit_lines_replaces_a_range_keeping_line_endings_and_mode(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    target.chmod(0o640)
    result = await edit(tmp_path, path="a.txt", start_line=2, end_line=3, content="2\n2b\n3\n")
    assert result.success and result.output == "Replaced lines 2-3 of a.txt"
    assert target.read_bytes() == b"one\r\n2\r\n2b\r\n3\r\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert (await edit(tmp_path, path="a.txt", start_line=1, end_line=1, content="")).success
    assert target.read_bytes() == b"2\r\n2b\r\n3\r\n"
    assert os.listdir(tmp_path) == ["a.txt"]  # no temporary file left behind


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"path": "a.txt", "start_line": 2, "end_line": 5}, "'a.txt': line range 2-5 is outside the file"),
        ({"path": "a.txt", "start_line": 2, "end_line": 1}, "'a.txt': start_line (2) is after end_line (1)"),
        ({"path": "missing.txt", "start_line": 1, "end_line": 1}, "File 'missing.txt' not found"),
        ({"path": "../a.txt", "start_line": 1, "end_line": 1}, "is outside the workspace"),
    ],
)
async def test_edit_lines_failures_name_the_problem(
    tmp_path: Path, arguments: dict[str, Any], error: str
) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    result = await edit(tmp_path, content="x\n", **arguments)
    assert not result.success and error in result.error
    assert (tmp_path / "a.txt").read_text() == "one\ntwo\n"


# End to end: the agent loop against a model answering in tags


@asynccontextmanager
async def tag_mode_session(workspace: Path, data: Path, fake: FakeLLM) -> AsyncIterator[tuple[Any, str]]:
    """A runtime, its agent (in text mode for the session: `openai+text`) whose model is the fake
    LLM, and a session in `workspace`."""

    def connect(llm: LLMConfig) -> OpenAICompatibleProvider:
        return OpenAICompatibleProvider(llm, timeout_s=5, max_retries=0)

    runtime = Runtime(agent_settings(workspace, data), registry=builtin_registry(), connect=connect)
    await runtime.start()
    llm = LLMConfig(provider="openai+text", model="fake-model", base_url=fake.base_url)
    try:
        session = await runtime.sessions.create(None, SessionConfig(workspace=str(workspace), llm=llm), [])
        yield runtime.agent, session.id
    finally:
        await runtime.close()


async def generate(agent: Any, session_id: str, prompt: str) -> DoneEvent:
    events = [
        e async for e in agent.run(session_id, [Message(role="user", content=prompt)], GenerateOptions())
    ]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return done


TURN_1 = """I will write the module and try it.
[CREATE_FILE path="greet.py"]
def greet(name):
    return "Hello, " + name
[/CREATE_FILE]
[CREATE_FILE]
print(greet("Ada"))
[/CREATE_FILE]
[CREATE_FILE path="scratch.txt"]
temporary
[/CREATE_FILE]
[RUN_COMMAND]
python3 -c "import greet; print(greet.greet('Ada'))"
[/RUN_COMMAND]
"""
TURN_2 = """The main file needs its path.
[CREATE_FILE path="main.py"]
from greet import greet
print(greet("Ada"))
[/CREATE_FILE]
[EDIT_FILE path="greet.py" start_line="2" end_line="2"]
    return f"Hi, {name}!"
[/EDIT_FILE]
[READ_FILE path="greet.py"]
[DELETE_FILE path="scratch.txt"]
"""
TURN_3 = """[MESSAGE]
greet.py now says Hi.
[/MESSAGE]
[DONE]
Added greet() in greet.py and a main.py that uses it.
[/DONE]
"""


async def test_tag_mode_end_to_end(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    fake.script(TURN_1, TURN_2, TURN_3)
    async with tag_mode_session(workspace, tmp_path / "data", fake) as (agent, session_id):
        done = await generate(agent, session_id, "Add a greeting module")

    generation = done.generation
    assert generation.message.content == "Added greet() in greet.py and a main.py that uses it."
    assert generation.finish_reason == "stop" and generation.turns == 3
    assert [call.name for call, _ in generation.tool_calls] == [
        "write_file", "write_file", "bash", "write_file", "edit_lines", "read_file", "delete_file",
    ]  # fmt: skip
    assert (workspace / "greet.py").read_text() == 'def greet(name):\n    return f"Hi, {name}!"\n'
    assert (workspace / "main.py").exists() and not (workspace / "scratch.txt").exists()

    first, second, third = fake.requests
    assert first.tools is None and second.tools is None
    assert PROTOCOL_INSTRUCTIONS in first.messages[0]["content"]
    assert first.messages[1:] == [{"role": "user", "content": "Add a greeting module"}]
    results_1 = "\n".join(
        [
            "## Previous Command Results",
            "[OK] CREATE_FILE: Created 'greet.py'",
            parse_error_line(TURN_1),
            "[OK] CREATE_FILE: Created 'scratch.txt'",
            """[OK] RUN_COMMAND: Ran 'python3 -c "import greet; print(greet.greet('Ada'))"' (exit code 0)""",
            "  Output: Hello, Ada",
        ]
    )
    assert second.messages[1:] == [
        {"role": "user", "content": "Add a greeting module"},
        {"role": "assistant", "content": TURN_1},
        {"role": "user", "content": f"{results_1}\n\n{CONTINUATION_PROMPT}"},
    ]
    results_2 = """## Previous Command Results
[OK] CREATE_FILE: Created 'main.py'
[OK] EDIT_FILE: Replaced lines 2-2 of 'greet.py'
[OK] READ_FILE: Read 'greet.py'
[OK] DELETE_FILE: Deleted 'scratch.txt'

## Requested File Contents
--- greet.py ---
def greet(name):
    return f"Hi, {name}!"
--- end greet.py ---"""
    assert third.messages[1:] == [
        *second.messages[1:3],
        {"role": "user", "content": results_1},
        {"role": "assistant", "content": TURN_2},
        {"role": "user", "content": f"{results_2}\n\n{CONTINUATION_PROMPT}"},
    ]


async def test_done_with_commands_ends_after_they_ran_without_asking_again(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    reply = '[CREATE_FILE path="a.txt"]\nA\n[/CREATE_FILE]\n[DONE]\nWrote a.txt.\n[/DONE]'
    fake.script(reply)
    async with tag_mode_session(workspace, tmp_path / "data", fake) as (agent, session_id):
        done = await generate(agent, session_id, "write a.txt")
        assert done.generation.message.content == "Wrote a.txt." and done.generation.turns == 2
        assert (workspace / "a.txt").read_text() == "A\n" and len(fake.requests) == 1

        # The next task starts afresh: the summary was the model's last word.
        fake.script("Nothing to do.")
        done = await generate(agent, session_id, "anything else?")
    assert done.generation.message.content == "Nothing to do."
    assert fake.requests[1].messages[1:] == [
        {"role": "user", "content": "write a.txt"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "## Previous Command Results\n[OK] CREATE_FILE: Created 'a.txt'"},
        {"role": "assistant", "content": "Wrote a.txt."},
        {"role": "user", "content": "anything else?"},
    ]
