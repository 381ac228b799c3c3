"""Agent Spaces: the spec examples as written, validation limits, each operation, policies, approval, cancel.

Commands the examples run with `bun run` are replaced by ones that exist here (echo, date, cp, grep).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from a3s_agent.app.standalone import run_operations_file
from a3s_agent.base.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.spaces.policies import build_policy
from a3s_agent.spaces.runner import apply_edits
from a3s_agent.spaces.service import Space, Spaces
from a3s_agent.spaces.store import RunRecord, SpacesStore
from a3s_agent.spaces.validation import (
    MAX_CONTENT_BYTES,
    OPERATION_TYPES,
    MessageInvalid,
    check_message,
    operation_problems,
    path_problem,
)
from a3s_agent.tools.builtin import builtin_registry
from a3s_agent.tools.registry import ToolFailure

from .conftest import eventually, new_session
from .test_spaces_http import spaces_server

DATA = Path(__file__).parent / "data" / "spaces"
ISO_8601 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


@pytest.fixture
async def spaces(tmp_path: Path) -> AsyncIterator[Spaces]:
    service = Spaces(tmp_path / "data", builtin_registry(), env=lambda: {"FROM_HOST": "host"})
    await service.open()
    yield service
    await service.close()


@pytest.fixture
async def space(spaces: Spaces) -> Space:
    return await spaces.create_space(policy="standard")


def message(*operations: Any) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


async def run(spaces: Spaces, space: Space, *operations: Any) -> dict[str, Any]:
    return dict(await spaces.start_run(space.id, message(*operations)))


def bare(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events without their timestamps, after checking each is ISO 8601 and none goes back."""
    stamps = [event["timestamp"] for event in events]
    for stamp in stamps:
        assert ISO_8601.fullmatch(stamp), stamp
        datetime.fromisoformat(stamp)
    assert stamps == sorted(stamps)
    return [{key: value for key, value in event.items() if key != "timestamp"} for event in events]


def shell_result(event: dict[str, Any]) -> dict[str, Any]:
    """A shell event with durationMs checked (a whole number) and left out."""
    assert isinstance(event["durationMs"], int) and event["durationMs"] >= 0
    return {key: value for key, value in event.items() if key not in ("timestamp", "durationMs")}


# --- the execution protocol document, example by example -----------------------------------------


async def test_operation_type_examples_each_produce_their_event(spaces: Spaces, space: Space) -> None:
    (space.workspace / "config").mkdir()
    (space.workspace / "config" / "settings.json").write_text('{"theme": "dark"}')
    (space.workspace / "temp").mkdir()
    (space.workspace / "temp" / "scratch.txt").write_text("scratch")
    script = "const trips = await fetch('https://api.trains.com/schedule');\nconsole.log(trips);"
    result = await run(
        spaces,
        space,
        {
            "type": "message",
            "id": "msg-1",
            "content": "I'm going to create a script to fetch the train schedule.",
        },
        {
            "type": "createFile",
            "id": "file-1",
            "path": "scripts/fetch-schedule.ts",
            "content": script,
            "overwrite": False,
        },
        {"type": "readFile", "id": "read-1", "path": "config/settings.json"},
        {
            "type": "editFile",
            "id": "edit-1",
            "path": "scripts/fetch-schedule.ts",
            "edits": [
                {
                    "oldContent": "console.log(trips);",
                    "newContent": "console.log(JSON.stringify(trips, null, 2));",
                }
            ],
        },
        {"type": "deleteFile", "id": "del-1", "path": "temp/scratch.txt"},
        # was: bun run scripts/fetch-schedule.ts
        {
            "type": "shell",
            "id": "shell-1",
            "command": "grep -c JSON scripts/fetch-schedule.ts",
            "timeout": 60000,
        },
    )
    assert result["protocolVersion"] == "1.0" and result["status"] == "completed"
    assert re.fullmatch(r"run_[0-9a-f]{16}", result["runId"])
    events = bare(result["events"])
    assert events[:5] == [
        {"type": "message", "operationId": "msg-1", "success": True},
        {
            "type": "createFile",
            "operationId": "file-1",
            "path": "scripts/fetch-schedule.ts",
            "success": True,
            "bytesWritten": len(script),
        },
        {
            "type": "readFile",
            "operationId": "read-1",
            "path": "config/settings.json",
            "success": True,
            "content": '{"theme": "dark"}',
            "encoding": "utf-8",
            "size": 17,
        },
        {
            "type": "editFile",
            "operationId": "edit-1",
            "path": "scripts/fetch-schedule.ts",
            "success": True,
            "editsApplied": 1,
        },
        {"type": "deleteFile", "operationId": "del-1", "path": "temp/scratch.txt", "success": True},
    ]
    assert shell_result(result["events"][5]) == {
        "type": "shell",
        "operationId": "shell-1",
        "command": "grep -c JSON scripts/fetch-schedule.ts",
        "success": True,
        "exitCode": 0,
        "stdout": "1\n",
        "stderr": "",
    }
    assert (
        (space.workspace / "scripts" / "fetch-schedule.ts")
        .read_text()
        .endswith("console.log(JSON.stringify(trips, null, 2));")
    )
    assert not (space.workspace / "temp" / "scratch.txt").exists()


async def test_operation_ordering_example(spaces: Spaces, space: Space) -> None:
    result = await run(
        spaces,
        space,
        {"type": "createFile", "path": "a.ts", "content": "..."},
        {"type": "shell", "command": "cp a.ts output.txt"},  # was: bun run a.ts
        {"type": "readFile", "path": "output.txt"},
    )
    assert [event["type"] for event in result["events"]] == ["createFile", "shell", "readFile"]
    assert result["events"][2]["content"] == "..."


async def test_partial_failure_example(spaces: Spaces, space: Space) -> None:
    result = await run(
        spaces,
        space,
        {"type": "createFile", "path": "a.ts", "content": "..."},
        {"type": "readFile", "path": "nonexistent.txt"},
        {"type": "shell", "command": "echo hello"},
    )
    events = bare(result["events"])
    assert events[0] == {"type": "createFile", "path": "a.ts", "success": True, "bytesWritten": 3}
    assert events[1] == {
        "type": "readFile",
        "path": "nonexistent.txt",
        "success": False,
        "error": "File not found",
    }
    assert events[2]["type"] == "shell" and events[2]["success"] is True and events[2]["stdout"] == "hello\n"
    assert result["status"] == "completed"


async def test_example_1_simple_script_execution(spaces: Spaces, space: Space) -> None:
    content = "console.log(new Date().toISOString());"
    result = await run(
        spaces,
        space,
        {"type": "message", "content": "I'll create a simple script to print the current date."},
        {"type": "createFile", "path": "date-script.ts", "content": content},
        {"type": "shell", "command": "date -u +%Y-%m-%dT%H:%M:%SZ"},  # was: bun run date-script.ts
    )
    assert result["status"] == "completed"
    events = bare(result["events"])
    # The spec shows "operationId": null here and leaves it out elsewhere: we leave it out.
    assert events[0] == {"type": "message", "success": True}
    assert events[1] == {
        "type": "createFile",
        "path": "date-script.ts",
        "success": True,
        "bytesWritten": len(content),
    }
    shell = shell_result(result["events"][2])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\n", shell.pop("stdout"))
    assert shell == {
        "type": "shell",
        "command": "date -u +%Y-%m-%dT%H:%M:%SZ",
        "success": True,
        "exitCode": 0,
        "stderr": "",
    }


async def test_example_2_train_schedule_and_final_message(spaces: Spaces, space: Space) -> None:
    reminder = (
        "import { getTrainSchedule, createNote } from '@company/sdk';\n\n"
        "const trips = await getTrainSchedule();\n"
        "const trip = trips.find(t => t.hour === 8);\n"
        "if (trip) {\n"
        "  await createNote(`Train at ${trip.hour}:00 - ${trip.destination}`);\n"
        "  console.log('Reminder created');\n"
        "} else {\n"
        "  console.log('No 8am trip found');\n"
        "}"
    )
    command = "grep -q createNote reminder.ts && echo 'Reminder created'"  # was: bun run reminder.ts
    result = await run(
        spaces,
        space,
        {"type": "message", "content": "I'm going to create a train schedule reminder for the 8am trip."},
        {"type": "createFile", "path": "reminder.ts", "content": reminder},
        {"type": "shell", "command": command},
    )
    events = bare(result["events"])
    assert events[0] == {"type": "message", "success": True}
    assert events[1] == {
        "type": "createFile",
        "path": "reminder.ts",
        "success": True,
        "bytesWritten": len(reminder.encode()),
    }
    assert shell_result(result["events"][2]) == {
        "type": "shell",
        "command": command,
        "success": True,
        "exitCode": 0,
        "stdout": "Reminder created\n",
        "stderr": "",
    }
    final = await run(
        spaces, space, {"type": "message", "content": "Done! I created a reminder for the 8am train trip."}
    )
    assert final["status"] == "completed" and bare(final["events"]) == [{"type": "message", "success": True}]
    assert final["runId"] != result["runId"]


async def test_example_3_sensitive_operation_with_approval(spaces: Spaces, space: Space) -> None:
    (space.workspace / "temp").mkdir()
    (space.workspace / "temp" / "old.log").write_text("old")
    paused = await run(
        spaces,
        space,
        {"type": "message", "content": "I need to clean up the temp directory."},
        {"type": "shell", "id": "cleanup-1", "command": "rm -rf temp/*"},
    )
    assert paused["status"] == "awaiting_approval"
    assert bare(paused["events"]) == [
        {"type": "message", "success": True},
        {
            "type": "approvalRequired",
            "operationId": "cleanup-1",
            "operationType": "shell",
            "reason": "Destructive command requires approval",
            # The reference's label; the execution spec's example says "destructive_commands_approval".
            "details": {"command": "rm -rf temp/*", "policy": "shell.approvalRequired"},
        },
    ]
    assert (space.workspace / "temp" / "old.log").exists()
    resumed = await spaces.resume_run(
        space.id, paused["runId"], {"operationId": "cleanup-1", "decision": "approved"}
    )
    assert resumed["protocolVersion"] == "1.0" and resumed["runId"] == paused["runId"]
    assert resumed["status"] == "completed"
    assert [shell_result(event) for event in resumed["events"]] == [
        {
            "type": "shell",
            "operationId": "cleanup-1",
            "command": "rm -rf temp/*",
            "success": True,
            "exitCode": 0,
            "stdout": "",
            "stderr": "",
        }
    ]
    assert list((space.workspace / "temp").iterdir()) == []


async def test_approval_flow_section_with_a_user_message(spaces: Spaces, space: Space) -> None:
    (space.workspace / "temp").mkdir()
    paused = await run(
        spaces,
        space,
        {"type": "createFile", "path": "keep.txt", "content": "x"},
        {"type": "shell", "id": "shell-1", "command": "rm -rf temp/"},
    )
    assert [event["type"] for event in paused["events"]] == ["createFile", "approvalRequired"]
    assert paused["events"][1]["details"] == {"command": "rm -rf temp/", "policy": "shell.approvalRequired"}
    resumed = await spaces.resume_run(
        space.id, paused["runId"], {"type": "userMessage", "content": "approved"}
    )
    assert bare(resumed["events"])[0] == {"type": "userMessage", "content": "approved"}
    assert resumed["events"][1]["operationId"] == "shell-1" and resumed["events"][1]["success"] is True
    assert not (space.workspace / "temp").exists()


# --- the protocol reference document -------------------------------------------------------------


async def test_reference_operations_message_example(spaces: Spaces, space: Space) -> None:
    result = await run(
        spaces,
        space,
        {"type": "message", "content": "Starting..."},
        {"type": "createFile", "path": "app.ts", "content": "..."},
        {"type": "shell", "command": "cat app.ts"},  # was: bun run app.ts
    )
    assert [event["success"] for event in result["events"]] == [True, True, True]
    assert result["events"][2]["stdout"] == "..."


async def test_reference_event_examples(spaces: Spaces, space: Space) -> None:
    (space.workspace / "config.json").write_text('{"key": "value"}')
    (space.workspace / "src").mkdir()
    (space.workspace / "src" / "app.ts").write_text("const x = 1;\n")
    (space.workspace / "temp.txt").write_text("temp")
    utils = {
        "type": "createFile",
        "id": "file-1",
        "path": "src/utils.ts",
        "content": "export const helper = () => {};",
        "encoding": "utf-8",
        "overwrite": False,
    }
    result = await run(
        spaces,
        space,
        {"type": "message", "id": "msg-1", "content": "Processing data..."},
        utils,
        {"type": "readFile", "id": "read-1", "path": "config.json", "encoding": "utf-8"},
        {
            "type": "editFile",
            "id": "edit-1",
            "path": "src/app.ts",
            "edits": [{"oldContent": "const x = 1;", "newContent": "const x = 42;"}],
        },
        {"type": "deleteFile", "id": "del-1", "path": "temp.txt"},
        utils,
    )
    assert bare(result["events"]) == [
        {"type": "message", "operationId": "msg-1", "success": True},
        {
            "type": "createFile",
            "operationId": "file-1",
            "path": "src/utils.ts",
            "success": True,
            "bytesWritten": 31,
        },
        {
            "type": "readFile",
            "operationId": "read-1",
            "path": "config.json",
            "success": True,
            "content": '{"key": "value"}',
            "encoding": "utf-8",
            "size": 16,
        },
        {
            "type": "editFile",
            "operationId": "edit-1",
            "path": "src/app.ts",
            "success": True,
            "editsApplied": 1,
        },
        {"type": "deleteFile", "operationId": "del-1", "path": "temp.txt", "success": True},
        {
            "type": "createFile",
            "operationId": "file-1",
            "path": "src/utils.ts",
            "success": False,
            "error": "File already exists",
        },
    ]
    assert (space.workspace / "src" / "app.ts").read_text() == "const x = 42;\n"


async def test_reference_shell_example_with_cwd_timeout_and_env(spaces: Spaces, space: Space) -> None:
    (space.workspace / "src").mkdir()
    # was: bun run test.ts
    command = 'test "$DEBUG" = true && test "$(basename "$PWD")" = src && echo "All tests passed!"'
    result = await run(
        spaces,
        space,
        {
            "type": "shell",
            "id": "shell-1",
            "command": command,
            "cwd": "src",
            "timeout": 30000,
            "env": {"DEBUG": "true"},
        },
    )
    assert shell_result(result["events"][0]) == {
        "type": "shell",
        "operationId": "shell-1",
        "command": command,
        "success": True,
        "exitCode": 0,
        "stdout": "All tests passed!\n",
        "stderr": "",
    }


async def test_reference_shell_timeout_example(spaces: Spaces, space: Space) -> None:
    result = await run(spaces, space, {"type": "shell", "command": "sleep 1000", "timeout": 1000})
    event = result["events"][0]
    assert {key: event[key] for key in ("type", "command", "success", "timedOut", "exitCode")} == {
        "type": "shell",
        "command": "sleep 1000",
        "success": False,
        "timedOut": True,
        "exitCode": 124,
    }
    assert 1000 <= event["durationMs"] < 5000
    assert "error" not in event


async def test_reference_approval_and_policy_denied_examples(spaces: Spaces, space: Space) -> None:
    denied = await run(spaces, space, {"type": "shell", "command": "sudo ls"})
    assert bare(denied["events"]) == [
        {
            "type": "policyDenied",
            "operationType": "shell",
            "reason": "Command 'sudo' is blocked",
            "suggestion": "Remove sudo from command",
        }
    ]
    paused = await run(spaces, space, {"type": "shell", "id": "shell-1", "command": "rm -rf data/"})
    assert bare(paused["events"]) == [
        {
            "type": "approvalRequired",
            "operationId": "shell-1",
            "operationType": "shell",
            "reason": "Destructive command requires approval",
            "details": {"command": "rm -rf data/", "policy": "shell.approvalRequired"},
        }
    ]


async def test_reference_error_event_shape(spaces: Spaces, space: Space) -> None:
    result = await run(spaces, space, {"type": "runCode", "id": "x-1", "code": "1+1"})
    assert bare(result["events"]) == [
        {
            "type": "error",
            "operationId": "x-1",
            "category": "validation",
            "message": "operations[0]: type must be one of message, createFile, readFile, editFile, "
            "deleteFile, shell ('runCode')",
            "details": {
                "index": 0,
                "problems": [
                    {
                        "field": "type",
                        "message": "type must be one of message, createFile, readFile, editFile, "
                        "deleteFile, shell ('runCode')",
                    }
                ],
            },
        }
    ]


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "fault"),
    [
        ([], "must be a JSON object, not a list"),
        ("{}", "must be a JSON object, not a string"),
        (None, "must be a JSON object, not null"),
        ({"operations": []}, "protocolVersion is required"),
        ({"protocolVersion": "1.1", "operations": []}, "protocolVersion must be \"1.0\", not '1.1'"),
        ({"protocolVersion": 1.0, "operations": []}, 'protocolVersion must be "1.0", not 1.0'),
        ({"protocolVersion": "1.0"}, "operations is required"),
        ({"protocolVersion": "1.0", "operations": {}}, "operations must be a list, not an object"),
        ({"protocolVersion": "1.0", "operations": "ls"}, "operations must be a list, not a string"),
    ],
)
async def test_malformed_message_raises_message_invalid(
    spaces: Spaces, space: Space, bad: Any, fault: str
) -> None:
    with pytest.raises(MessageInvalid, match=re.escape(fault)) as caught:
        await spaces.start_run(space.id, bad)
    assert isinstance(caught.value, InvalidArgument)


async def test_an_empty_batch_completes_with_no_events(spaces: Spaces, space: Space) -> None:
    result = await run(spaces, space)
    assert result["status"] == "completed" and result["events"] == []


def faults(operation: Any) -> list[str]:
    return [problem.field for problem in operation_problems(operation)]


@pytest.mark.parametrize(
    "operation",
    [
        {"type": "message", "content": "x" * 100_000},
        {"type": "createFile", "path": "p" * 255, "content": ""},
        {"type": "createFile", "path": "a.txt", "content": "", "encoding": "base64", "overwrite": True},
        {"type": "readFile", "path": "a.txt", "encoding": "utf-8"},
        {"type": "editFile", "path": "a.txt", "edits": []},
        {"type": "deleteFile", "path": "a.txt", "id": "d"},
        {"type": "shell", "command": "c" * 4096, "timeout": 1000, "cwd": "src", "env": {"A": "1"}},
        {"type": "shell", "command": "", "timeout": 3_600_000},
        {"type": "shell", "command": "ls", "timeout": 60000.0},  # JSON Schema integers include 60000.0
        {"type": "message", "content": "", "extra": "fields the schema does not name are allowed"},
        {"type": "createFile", "path": "é" * 255, "content": ""},
    ],
)
def test_valid_operations_at_their_limits(operation: dict[str, Any]) -> None:
    assert operation_problems(operation) == []


@pytest.mark.parametrize(
    ("operation", "fields"),
    [
        ("ls", [""]),
        ({"content": "x"}, ["type"]),
        ({"type": "Message", "content": "x"}, ["type"]),
        ({"type": 5}, ["type"]),
        ({"type": "message"}, ["content"]),
        ({"type": "message", "content": "x" * 100_001}, ["content"]),
        ({"type": "message", "content": 5, "id": 7}, ["id", "content"]),
        ({"type": "createFile", "content": ""}, ["path"]),
        ({"type": "createFile", "path": "a"}, ["content"]),
        ({"type": "createFile", "path": "p" * 256, "content": ""}, ["path"]),
        ({"type": "createFile", "path": "/etc/passwd", "content": ""}, ["path"]),
        ({"type": "createFile", "path": "a/../b", "content": ""}, ["path"]),
        ({"type": "createFile", "path": "a..b", "content": ""}, ["path"]),  # the spec refuses any '..'
        ({"type": "createFile", "path": "a\0b", "content": ""}, ["path"]),
        ({"type": "createFile", "path": 5, "content": ""}, ["path"]),
        ({"type": "createFile", "path": "a", "content": "", "encoding": "utf8"}, ["encoding"]),
        ({"type": "createFile", "path": "a", "content": "", "overwrite": "yes"}, ["overwrite"]),
        ({"type": "readFile", "path": "a", "encoding": None}, ["encoding"]),
        ({"type": "editFile", "path": "a"}, ["edits"]),
        ({"type": "editFile", "path": "a", "edits": {}}, ["edits"]),
        ({"type": "editFile", "path": "a", "edits": ["x"]}, ["edits"]),
        ({"type": "editFile", "path": "a", "edits": [{"oldContent": "x"}]}, ["edits"]),
        ({"type": "editFile", "path": "a", "edits": [{"oldContent": "x", "newContent": 1}]}, ["edits"]),
        ({"type": "deleteFile"}, ["path"]),
        ({"type": "shell"}, ["command"]),
        ({"type": "shell", "command": "c" * 4097}, ["command"]),
        ({"type": "shell", "command": "ls", "timeout": 999}, ["timeout"]),
        ({"type": "shell", "command": "ls", "timeout": 3_600_001}, ["timeout"]),
        ({"type": "shell", "command": "ls", "timeout": 1000.5}, ["timeout"]),
        ({"type": "shell", "command": "ls", "timeout": True}, ["timeout"]),
        ({"type": "shell", "command": "ls", "timeout": "1000"}, ["timeout"]),
        ({"type": "shell", "command": "ls", "cwd": "../x"}, ["cwd"]),
        ({"type": "shell", "command": "ls", "cwd": "/tmp"}, ["cwd"]),
        ({"type": "shell", "command": "ls", "env": ["A=1"]}, ["env"]),
        ({"type": "shell", "command": "ls", "env": {"A": 1}}, ["env"]),
    ],
)
def test_invalid_operations_name_their_fields(operation: Any, fields: list[str]) -> None:
    assert faults(operation) == fields


def test_content_limit_is_ten_megabytes_of_utf8() -> None:
    def create(content: str) -> dict[str, Any]:
        return {"type": "createFile", "path": "big.bin", "content": content}

    assert faults(create("x" * MAX_CONTENT_BYTES)) == []
    assert faults(create("x" * (MAX_CONTENT_BYTES + 1))) == ["content"]
    assert faults(create("é" * (MAX_CONTENT_BYTES // 2))) == []  # 2 bytes each
    assert faults(create("é" * (MAX_CONTENT_BYTES // 2) + "x")) == ["content"]


def test_path_rule_is_the_specs_is_valid_path() -> None:
    assert path_problem("src/app.ts") is None
    assert path_problem("./a") is None
    assert path_problem("/a") == "must be relative (no leading '/')"
    assert path_problem("..") == "must not contain '..'"
    assert path_problem("a\0") == "must not contain a NUL byte"
    assert path_problem("x" * 256) == "must be at most 255 characters (got 256)"


async def test_content_at_the_limit_is_written_and_beyond_it_is_refused(spaces: Spaces, space: Space) -> None:
    result = await run(
        spaces,
        space,
        {"type": "createFile", "path": "big.txt", "content": "x" * MAX_CONTENT_BYTES},
        {
            "type": "createFile",
            "id": "too-big",
            "path": "bigger.txt",
            "content": "x" * (MAX_CONTENT_BYTES + 1),
        },
        {"type": "message", "content": "still running"},
    )
    assert result["events"][0]["bytesWritten"] == MAX_CONTENT_BYTES
    error = result["events"][1]
    assert (
        error["type"] == "error" and error["category"] == "validation" and error["operationId"] == "too-big"
    )
    assert "content must be at most 10485760 bytes" in error["message"]
    assert not (space.workspace / "bigger.txt").exists()
    assert result["events"][2]["success"] is True


async def test_malformed_operations_are_skipped_and_the_batch_goes_on(spaces: Spaces, space: Space) -> None:
    result = await run(
        spaces,
        space,
        "not an operation",
        {"type": "createFile", "id": 42, "path": "/abs", "content": "x"},
        {"type": "shell", "id": "s", "command": "echo ok", "timeout": 10},
        {"type": "createFile", "id": "good", "path": "ok.txt", "content": "ok"},
    )
    assert result["status"] == "completed"
    first, second, third, fourth = result["events"]
    assert first["type"] == "error" and "operationId" not in first
    assert first["message"] == "operations[0]: an operation must be a JSON object, not a string"
    assert second["type"] == "error" and "operationId" not in second  # the id itself is invalid
    assert [p["field"] for p in second["details"]["problems"]] == ["id", "path"]
    assert third["operationId"] == "s" and third["details"]["index"] == 2
    assert "timeout must be between 1000 and 3600000 ms (got 10)" in third["message"]
    assert fourth == fourth | {"type": "createFile", "operationId": "good", "success": True}


SCHEMA = json.loads((DATA / "protocol-1.0.schema.json").read_text())
OPERATION_VALIDATOR = jsonschema.Draft7Validator(
    {"definitions": SCHEMA["definitions"], "$ref": "#/definitions/Operation"}
)
_PATH_FIELDS = {
    "createFile": "path",
    "readFile": "path",
    "editFile": "path",
    "deleteFile": "path",
    "shell": "cwd",
}

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=3_600_005),
    st.sampled_from([999, 3_600_001, 1000.0, 1000.5, [], {}, ["x"], {"oldContent": "x"}]),
    st.text(max_size=6),
)
_paths = st.one_of(
    st.text(alphabet="ab/.\0", max_size=6),  # finds leading '/', '..' and NUL
    st.sampled_from(["src/app.ts", "x" * 255, "y" * 256, "é" * 255]),
)
_edit = st.fixed_dictionaries({"oldContent": st.text(max_size=3), "newContent": st.text(max_size=3)})
_VALID_FIELDS = {
    "id": st.text(max_size=4),
    "content": st.text(max_size=6),
    "path": _paths,
    "encoding": st.sampled_from(["utf-8", "base64"]),
    "overwrite": st.booleans(),
    "edits": st.lists(st.one_of(_edit, _edit.map(lambda edit: {**edit, "extra": 1})), max_size=2),
    "command": st.text(max_size=6),
    "cwd": _paths,
    "timeout": st.one_of(st.integers(1000, 3_600_000), st.sampled_from([1000, 3_600_000, 60000.0])),
    "env": st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
}


@st.composite
def _operations(draw: st.DrawFn) -> dict[str, Any]:
    """Operations of every type whose fields are mostly valid, sometimes missing, sometimes junk."""
    kind = draw(st.sampled_from([*OPERATION_TYPES, "runCode"]))
    operation: dict[str, Any] = {"type": kind if draw(st.integers(0, 9)) else draw(_junk)}
    for name, valid in _VALID_FIELDS.items():
        choice = draw(st.sampled_from(["valid", "valid", "valid", "absent", "junk"]))
        if choice == "valid":
            operation[name] = draw(valid)
        elif choice == "junk":
            operation[name] = draw(_junk)
    return operation


@settings(max_examples=300, deadline=None)
@given(_operations())
def test_validation_agrees_with_the_json_schema_plus_the_path_rule(operation: dict[str, Any]) -> None:
    expected = OPERATION_VALIDATOR.is_valid(operation)
    field = _PATH_FIELDS.get(operation["type"]) if isinstance(operation["type"], str) else None
    if expected and field in operation and path_problem(operation[field]) is not None:
        expected = False  # the spec's path rule, which the schema cannot say
    assert (operation_problems(operation) == []) == expected


def test_check_message_accepts_extra_top_level_fields() -> None:
    assert check_message({"protocolVersion": "1.0", "operations": [1], "note": "x"}) == [1]


# --- operations: success and failure -------------------------------------------------------------


async def test_create_file_overwrite_encoding_and_parents(spaces: Spaces, space: Space) -> None:
    png = bytes(range(256))
    result = await run(
        spaces,
        space,
        {"type": "createFile", "path": "deep/er/new.txt", "content": "one"},
        {"type": "createFile", "path": "deep/er/new.txt", "content": "two"},
        {"type": "createFile", "path": "deep/er/new.txt", "content": "three", "overwrite": True},
        {
            "type": "createFile",
            "path": "logo.png",
            "content": base64.b64encode(png).decode(),
            "encoding": "base64",
        },
        {"type": "createFile", "path": "bad.bin", "content": "!!not base64!!", "encoding": "base64"},
        {"type": "createFile", "path": "deep", "content": "x", "overwrite": True},
    )
    events = result["events"]
    assert [event["success"] for event in events] == [True, False, True, True, False, False]
    assert events[1]["error"] == "File already exists"
    assert events[2]["bytesWritten"] == 5
    assert events[3]["bytesWritten"] == 256
    assert "not valid base64" in events[4]["error"]
    assert events[5]["error"] == "Path is a directory"
    assert (space.workspace / "deep/er/new.txt").read_text() == "three"
    assert (space.workspace / "logo.png").read_bytes() == png


async def test_file_operations_stay_inside_the_workspace(
    spaces: Spaces, space: Space, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (space.workspace / "link").symlink_to(outside)
    result = await run(
        spaces,
        space,
        {"type": "createFile", "path": "link/new.txt", "content": "x"},
        {"type": "readFile", "path": "link/secret.txt"},
        {"type": "editFile", "path": "link/secret.txt", "edits": [{"oldContent": "s", "newContent": "S"}]},
        {"type": "deleteFile", "path": "link/secret.txt"},
        {"type": "shell", "command": "pwd", "cwd": "link"},
    )
    assert [event["success"] for event in result["events"]] == [False] * 5
    assert all("outside the workspace" in event["error"] for event in result["events"])
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret"


async def test_read_file_encodings_and_failures(spaces: Spaces, space: Space) -> None:
    (space.workspace / "text.txt").write_text("héllo\n")
    (space.workspace / "blob.bin").write_bytes(b"\xff\x00\xfe")
    (space.workspace / "dir").mkdir()
    result = await run(
        spaces,
        space,
        {"type": "readFile", "path": "text.txt"},
        {"type": "readFile", "path": "blob.bin", "encoding": "base64"},
        {"type": "readFile", "path": "blob.bin"},
        {"type": "readFile", "path": "dir"},
        {"type": "readFile", "path": "missing/file.txt"},
    )
    text, blob, undecodable, directory, missing = bare(result["events"])
    assert text == {
        "type": "readFile",
        "path": "text.txt",
        "success": True,
        "content": "héllo\n",
        "encoding": "utf-8",
        "size": 7,
    }
    assert blob == {
        "type": "readFile",
        "path": "blob.bin",
        "success": True,
        "content": "/wD+",
        "encoding": "base64",
        "size": 3,
    }
    assert undecodable["success"] is False and 'encoding "base64"' in undecodable["error"]
    assert directory["error"] == "Path is a directory, not a file"
    assert missing["error"] == "File not found"


async def test_read_file_respects_the_policys_size_limit(spaces: Spaces) -> None:
    space = await spaces.create_space(policy={"preset": "standard", "maxFileSize": 10})
    (space.workspace / "small.txt").write_text("0123456789")
    (space.workspace / "large.txt").write_text("0123456789A")
    result = await run(
        spaces,
        space,
        {"type": "readFile", "path": "small.txt"},
        {"type": "readFile", "path": "large.txt"},
        {"type": "createFile", "path": "new.txt", "content": "0123456789A"},
    )
    assert [event["success"] for event in result["events"]] == [True, False, False]
    assert result["events"][1]["error"] == "File size 11 bytes exceeds the policy's limit of 10 bytes"
    assert not (space.workspace / "new.txt").exists()


async def test_edit_file_applies_all_edits_in_order_or_none(spaces: Spaces, space: Space) -> None:
    target = space.workspace / "app.py"
    target.write_text("a = 1\na = 1\nb = 2\n")
    target.chmod(0o751)
    result = await run(
        spaces,
        space,
        {
            "type": "editFile",
            "id": "ordered",
            "path": "app.py",
            "edits": [
                {"oldContent": "a = 1", "newContent": "a = 10"},  # the first occurrence only
                {"oldContent": "a = 10\na = 1", "newContent": "a = 10\na = 11"},  # sees the first edit
            ],
        },
        {
            "type": "editFile",
            "id": "all-or-none",
            "path": "app.py",
            "edits": [
                {"oldContent": "b = 2", "newContent": "b = 20"},
                {"oldContent": "c = 3", "newContent": "c = 30"},
            ],
        },
        {"type": "editFile", "path": "app.py", "edits": [{"oldContent": "", "newContent": "x"}]},
        {"type": "editFile", "path": "app.py", "edits": []},
        {"type": "editFile", "path": "missing.py", "edits": [{"oldContent": "a", "newContent": "b"}]},
    )
    ordered, failed, empty, nothing, missing = bare(result["events"])
    assert ordered == {
        "type": "editFile",
        "operationId": "ordered",
        "path": "app.py",
        "success": True,
        "editsApplied": 2,
    }
    assert failed == {
        "type": "editFile",
        "operationId": "all-or-none",
        "path": "app.py",
        "success": False,
        "error": "Edit 2 of 2 failed: oldContent 'c = 3' was not found; no edits were applied",
    }
    assert empty["error"] == "Edit 1 of 1 failed: oldContent is empty; no edits were applied"
    assert nothing["success"] is True and nothing["editsApplied"] == 0
    assert missing["error"] == "File not found"
    assert target.read_text() == "a = 10\na = 11\nb = 2\n"
    assert target.stat().st_mode & 0o777 == 0o751  # the atomic write keeps permissions


def test_apply_edits_replaces_first_occurrences_in_order() -> None:
    edits = [{"oldContent": "x", "newContent": "y"}, {"oldContent": "yx", "newContent": "z"}]
    assert apply_edits("xxx", edits) == "zx"
    with pytest.raises(ToolFailure, match="Edit 1 of 1 failed"):
        apply_edits("abc", [{"oldContent": "q" * 100, "newContent": ""}])


async def test_delete_file_refuses_directories_and_missing_files(spaces: Spaces, space: Space) -> None:
    (space.workspace / "dir").mkdir()
    (space.workspace / "file.txt").write_text("x")
    (space.workspace / "dangling").symlink_to(space.workspace / "nowhere")
    result = await run(
        spaces,
        space,
        {"type": "deleteFile", "path": "file.txt"},
        {"type": "deleteFile", "path": "file.txt"},
        {"type": "deleteFile", "path": "dir"},
        {"type": "deleteFile", "path": "dangling"},
    )
    assert [(event["success"], event.get("error")) for event in result["events"]] == [
        (True, None),
        (False, "File not found"),
        (False, "Path is a directory; deleteFile deletes only files"),
        (True, None),
    ]
    assert (space.workspace / "dir").is_dir()
    assert not (space.workspace / "dangling").is_symlink()


async def test_shell_reports_streams_exit_codes_env_and_system_errors(spaces: Spaces, space: Space) -> None:
    result = await run(
        spaces,
        space,
        {"type": "shell", "command": "echo out; echo err >&2; exit 3"},
        {"type": "shell", "command": 'echo "$FROM_HOST $OWN"', "env": {"OWN": "own"}},
        {"type": "shell", "command": 'echo "$FROM_HOST"', "env": {"FROM_HOST": "operation wins"}},
        {"type": "shell", "command": "pwd", "cwd": "missing"},
    )
    failed, env, override, no_cwd = result["events"]
    assert shell_result(failed) == {
        "type": "shell",
        "command": "echo out; echo err >&2; exit 3",
        "success": False,
        "exitCode": 3,
        "stdout": "out\n",
        "stderr": "err\n",
    }
    assert "error" not in failed  # a failing command is not a system error
    assert env["stdout"] == "host own\n"
    assert override["stdout"] == "operation wins\n"
    assert bare([no_cwd]) == [
        {"type": "shell", "command": "pwd", "success": False, "error": "Working directory not found: missing"}
    ]


async def test_shell_default_timeout_comes_from_the_policy(spaces: Spaces) -> None:
    space = await spaces.create_space(policy={"preset": "standard", "timeout": 1000})
    result = await run(spaces, space, {"type": "shell", "command": "sleep 10"})
    assert result["events"][0]["timedOut"] is True and result["events"][0]["exitCode"] == 124
    assert build_policy("standard").default_timeout_ms == 30_000


async def test_failures_do_not_stop_the_batch(spaces: Spaces, space: Space) -> None:
    result = await run(
        spaces,
        space,
        {"type": "readFile", "path": "nope.txt"},
        {"type": "shell", "command": "exit 1"},
        {"type": "createFile", "path": ".env", "content": "SECRET=1"},
        {"type": "deleteFile", "path": "nope.txt"},
        {"type": "editFile", "path": "nope.txt", "edits": []},
        {"type": "bogus"},
        {"type": "createFile", "id": "last", "path": "done.txt", "content": "done"},
    )
    assert result["status"] == "completed"
    assert [event["type"] for event in result["events"]] == [
        "readFile",
        "shell",
        "policyDenied",
        "deleteFile",
        "editFile",
        "error",
        "createFile",
    ]
    assert result["events"][-1]["success"] is True
    assert (space.workspace / "done.txt").read_text() == "done"


# --- policies ------------------------------------------------------------------------------------


def test_presets_are_permission_engine_rules() -> None:
    standard = build_policy("standard").permissions
    assert "Bash(sudo:*)" in standard.deny and "Bash(rm -rf /:*)" in standard.deny
    assert "Write(**/*.env/**)" in standard.deny and "Read(**/node_modules/**)" in standard.deny
    assert standard.ask == ["Bash(rm -rf:*)", "Bash(rm -r:*)"]
    restrictive = build_policy("restrictive").permissions
    assert {"Write", "Edit", "Delete", "Bash"} <= set(restrictive.deny)
    permissive = build_policy("permissive").permissions
    assert "Bash(chmod:*)" in permissive.ask and "Bash(curl:*)" not in permissive.deny
    assert build_policy("permissive").default_timeout_ms == 300_000
    assert build_policy("restrictive").max_file_size == 1024 * 1024


@pytest.mark.parametrize(
    ("preset", "operation", "decision"),
    [
        ("standard", {"type": "createFile", "path": ".env", "content": ""}, "deny"),
        ("standard", {"type": "readFile", "path": "config/.secrets/a"}, "deny"),
        ("standard", {"type": "editFile", "path": "certs/server.pem", "edits": []}, "deny"),
        ("standard", {"type": "deleteFile", "path": "node_modules/x/index.js"}, "deny"),
        ("standard", {"type": "readFile", "path": "id.key"}, "deny"),
        ("standard", {"type": "readFile", "path": "src/environment.ts"}, "allow"),
        ("standard", {"type": "shell", "command": "curl https://example.com"}, "deny"),
        ("standard", {"type": "shell", "command": "wget x"}, "deny"),
        ("standard", {"type": "shell", "command": "ssh host"}, "deny"),
        ("standard", {"type": "shell", "command": "cd src && sudo make install"}, "deny"),
        ("standard", {"type": "shell", "command": "rm -rf /"}, "deny"),
        ("standard", {"type": "shell", "command": "rm -rf ~"}, "deny"),
        ("standard", {"type": "shell", "command": "chmod +x run.sh"}, "deny"),
        ("standard", {"type": "shell", "command": "rm -r build"}, "ask"),
        ("standard", {"type": "shell", "command": "echo sudo"}, "allow"),
        ("standard", {"type": "shell", "command": "python3 -c 'print(1)'"}, "allow"),
        ("standard", {"type": "message", "content": "sudo"}, "allow"),
        ("standard", {"type": "shell", "command": "nohup /bin/rm --recursive --force /"}, "deny"),
        ("standard", {"type": "shell", "command": 'rm "$TARGET"'}, "ask"),  # could be rm -rf /
        ("standard", {"type": "shell", "command": "case x in x) ls;; esac"}, "ask"),  # cannot be parsed
        ("permissive", {"type": "shell", "command": "case x in x) ls;; esac"}, "allow"),
        ("standard", {"type": "shell", "command": "echo hi", "env": {"LD_PRELOAD": "x.so"}}, "deny"),
        ("permissive", {"type": "shell", "command": "echo hi", "env": {"LD_PRELOAD": "x.so"}}, "allow"),
        ("standard", {"type": "readFile", "path": "keys/id_ed25519"}, "deny"),
        ("restrictive", {"type": "readFile", "path": "src/a.ts"}, "allow"),
        ("restrictive", {"type": "readFile", "path": "prod.env"}, "deny"),
        ("restrictive", {"type": "createFile", "path": "a.txt", "content": ""}, "deny"),
        ("restrictive", {"type": "editFile", "path": "a.txt", "edits": []}, "deny"),
        ("restrictive", {"type": "deleteFile", "path": "a.txt"}, "deny"),
        ("restrictive", {"type": "shell", "command": "ls"}, "deny"),
        ("permissive", {"type": "createFile", "path": ".env", "content": ""}, "allow"),
        ("permissive", {"type": "createFile", "path": "tls.key", "content": ""}, "deny"),
        ("permissive", {"type": "shell", "command": "curl https://example.com"}, "allow"),
        ("permissive", {"type": "shell", "command": "chmod 600 f"}, "ask"),
        ("permissive", {"type": "shell", "command": "sudo ls"}, "deny"),
    ],
)
def test_preset_decisions(preset: str, operation: dict[str, Any], decision: str) -> None:
    assert build_policy(preset).check(operation).decision == decision


async def test_denied_operations_do_not_run_and_the_batch_goes_on(spaces: Spaces, space: Space) -> None:
    (space.workspace / "run.sh").write_text("echo hi")
    (space.workspace / "run.sh").chmod(0o644)
    result = await run(
        spaces,
        space,
        {"type": "createFile", "id": "env", "path": "app/.env", "content": "KEY=1"},
        {"type": "shell", "id": "chmod", "command": "chmod 777 run.sh"},
        {"type": "message", "content": "after"},
    )
    assert bare(result["events"]) == [
        {
            "type": "policyDenied",
            "operationId": "env",
            "operationType": "createFile",
            "reason": "Path 'app/.env' is blocked (pattern '.*')",
            "suggestion": "Use a path that does not match '.*'",
        },
        {
            "type": "policyDenied",
            "operationId": "chmod",
            "operationType": "shell",
            "reason": "Command 'chmod' is blocked",
            "suggestion": "Remove chmod from command",
        },
        {"type": "message", "success": True},
    ]
    assert not (space.workspace / "app").exists()
    assert (space.workspace / "run.sh").stat().st_mode & 0o777 == 0o644


async def test_restrictive_space_reads_but_does_not_write_or_run(spaces: Spaces) -> None:
    space = await spaces.create_space(policy="restrictive")
    (space.workspace / "notes.txt").write_text("notes")
    result = await run(
        spaces,
        space,
        {"type": "readFile", "path": "notes.txt"},
        {"type": "createFile", "path": "new.txt", "content": "x"},
        {"type": "shell", "command": "touch made.txt"},
    )
    read, create, shell = bare(result["events"])
    assert read["success"] is True
    assert create == {
        "type": "policyDenied",
        "operationType": "createFile",
        "reason": "The 'restrictive' policy makes the workspace read-only",
        "suggestion": "Use a policy that allows writes, such as standard",
    }
    assert shell["reason"] == "Shell commands are disabled by the 'restrictive' policy"
    assert sorted(os.listdir(space.workspace)) == ["notes.txt"]


async def test_custom_rules_on_top_of_a_preset_and_alone(spaces: Spaces) -> None:
    space = await spaces.create_space(
        policy={"preset": "standard", "deny": ["shell(git push:*)"], "ask": ["createFile(dist/**)"]}
    )
    result = await run(
        spaces,
        space,
        {"type": "shell", "id": "push", "command": "git push origin main"},
        {"type": "createFile", "id": "dist", "path": "dist/app.js", "content": "x"},
    )
    denied, approval = bare(result["events"])
    assert denied["reason"] == "The command 'git push origin main' is denied by the rule 'shell(git push:*)'"
    assert "suggestion" not in denied
    assert approval["details"] == {"path": "dist/app.js", "policy": "createFile(dist/**)"}
    assert result["status"] == "awaiting_approval"

    allow_list = await spaces.create_space(policy={"allow": ["Bash(echo:*)"], "defaultDecision": "deny"})
    result = await run(
        spaces, allow_list, {"type": "shell", "command": "echo ok"}, {"type": "shell", "command": "ls"}
    )
    assert result["events"][0]["stdout"] == "ok\n"
    assert result["events"][1]["type"] == "policyDenied"
    assert result["events"][1]["reason"] == "No allow rule of the policy matches this shell operation"


@pytest.mark.parametrize(
    ("policy", "fault"),
    [
        ("lenient", "policy.preset must be one of restrictive, standard, permissive"),
        ({"preset": "standard", "color": "red"}, "policy has unknown fields: color"),
        ({"deny": ["Bash("]}, "policy.deny[0]: permission rule 'Bash('"),
        ({"deny": "Bash"}, "policy.deny must be a list of rule strings"),
        ({"defaultDecision": "maybe"}, "policy.defaultDecision must be one of"),
        ({"timeout": 10}, "policy.timeout must be an integer from 1000 to 3600000 ms"),
        ({"maxFileSize": 0}, "policy.maxFileSize must be a positive integer"),
        (5, "policy must be a preset name or an object"),
    ],
)
async def test_invalid_policies_are_refused(spaces: Spaces, policy: Any, fault: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(fault)):
        await spaces.create_space(policy=policy)


BAD_RULES = ["Bash(", "Bash(:*)", "WebFetch(domain:-x/)", "Read()", "sudo rm", "Bash\x07"]


@pytest.mark.parametrize("rule", BAD_RULES)
async def test_a_space_refuses_a_bad_rule_in_the_permission_engines_words(
    workspace: Path, tmp_path: Path, rule: str
) -> None:
    """A space policy's rules are checked by the engine's own validator: the HTTP client creating
    a space hears what a gRPC client setting a session's policy hears, under `policy.`."""
    async with spaces_server(workspace, tmp_path / "data") as served:
        session = await new_session(served.live)
        request = pb.SetPermissionPolicyRequest(
            session_id=session, policy=pb.PermissionPolicy(ask=[pb.PermissionRule(rule=rule)], enabled=True)
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.live.stub.SetPermissionPolicy(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        async with served.http.post("/v1/spaces", json={"policy": {"ask": [rule]}}) as reply:
            assert reply.status == 400, await reply.text()
            error = (await reply.json())["error"]
        assert error["message"] == f"policy.{refused.value.details()}", error


# --- approval, restart, cancel -------------------------------------------------------------------


async def test_approval_round_trip_approve(spaces: Spaces, space: Space) -> None:
    (space.workspace / "build").mkdir()
    paused = await run(
        spaces,
        space,
        {"type": "createFile", "path": "a.txt", "content": "a"},
        {"type": "shell", "id": "clean", "command": "rm -r build"},
        {"type": "createFile", "path": "b.txt", "content": "b"},
    )
    assert paused["status"] == "awaiting_approval"
    assert not (space.workspace / "b.txt").exists()
    stored = await spaces.get_run(space.id, paused["runId"])
    assert stored == paused
    resumed = await spaces.resume_run(
        space.id, paused["runId"], {"operationId": "clean", "decision": "approved"}
    )
    assert resumed["status"] == "completed"
    assert [event["type"] for event in resumed["events"]] == ["shell", "createFile"]
    assert not (space.workspace / "build").exists() and (space.workspace / "b.txt").exists()
    whole = await spaces.get_run(space.id, paused["runId"])
    assert whole["status"] == "completed"
    assert whole["events"] == paused["events"] + resumed["events"]
    with pytest.raises(FailedPrecondition, match="is completed, not awaiting approval"):
        await spaces.resume_run(space.id, paused["runId"], {"operationId": "clean", "decision": "approved"})


async def test_approval_round_trip_deny(spaces: Spaces, space: Space) -> None:
    (space.workspace / "build").mkdir()
    paused = await run(
        spaces,
        space,
        {"type": "shell", "id": "clean", "command": "rm -rf build"},
        {"type": "createFile", "path": "b.txt", "content": "b"},
    )
    resumed = await spaces.resume_run(
        space.id, paused["runId"], {"operationId": "clean", "decision": "denied", "reason": "keep the build"}
    )
    assert resumed["status"] == "completed"
    assert bare(resumed["events"])[0] == {
        "type": "policyDenied",
        "operationId": "clean",
        "operationType": "shell",
        "reason": "Denied by the user: keep the build",
    }
    assert resumed["events"][1]["type"] == "createFile"
    assert (space.workspace / "build").is_dir()


async def test_a_batch_can_pause_more_than_once_and_ids_are_given_when_missing(
    spaces: Spaces, space: Space
) -> None:
    paused = await run(
        spaces,
        space,
        {"type": "message", "content": "two deletions"},
        {"type": "shell", "command": "rm -rf one"},
        {"type": "shell", "command": "rm -rf two"},
    )
    assert paused["events"][-1]["operationId"] == "op-1"
    second = await spaces.resume_run(
        space.id, paused["runId"], {"operationId": "op-1", "decision": "approved"}
    )
    assert second["status"] == "awaiting_approval"
    assert second["events"][0]["operationId"] == "op-1" and second["events"][0]["success"] is True
    assert second["events"][1]["type"] == "approvalRequired" and second["events"][1]["operationId"] == "op-2"
    third = await spaces.resume_run(space.id, paused["runId"], {"type": "userMessage", "content": "denied"})
    assert third["status"] == "completed"
    assert [event["type"] for event in third["events"]] == ["userMessage", "policyDenied"]
    assert third["events"][1]["reason"] == "Denied by the user"


async def test_resume_errors_name_the_fault(spaces: Spaces, space: Space) -> None:
    paused = await run(spaces, space, {"type": "shell", "id": "rm", "command": "rm -rf x"})
    run_id = paused["runId"]
    with pytest.raises(InvalidArgument, match="awaits approval of operation 'rm', not 'other'"):
        await spaces.resume_run(space.id, run_id, {"operationId": "other", "decision": "approved"})
    with pytest.raises(InvalidArgument, match='decision must be "approved" or "denied"'):
        await spaces.resume_run(space.id, run_id, {"operationId": "rm", "decision": "yes"})
    with pytest.raises(InvalidArgument, match="operationId is required"):
        await spaces.resume_run(space.id, run_id, {"decision": "approved"})
    with pytest.raises(InvalidArgument, match='must say "approved" or "denied"'):
        await spaces.resume_run(space.id, run_id, {"type": "userMessage", "content": "sure"})
    with pytest.raises(NotFound, match="run 'run_nope' does not exist"):
        await spaces.resume_run(space.id, "run_nope", {"operationId": "rm", "decision": "approved"})
    other = await spaces.create_space()
    with pytest.raises(NotFound):
        await spaces.get_run(other.id, run_id)
    with pytest.raises(NotFound, match="space 'nope' does not exist"):
        await spaces.start_run("nope", message())
    assert (await spaces.get_run(space.id, run_id))["status"] == "awaiting_approval"  # nothing changed


async def test_a_paused_run_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Spaces(data, builtin_registry())
    await first.open()
    space = await first.create_space(space_id="persisted", policy={"preset": "standard", "timeout": 5000})
    (space.workspace / "tmp").mkdir()
    paused = await first.start_run(
        space.id,
        message(
            {"type": "createFile", "path": "before.txt", "content": "1"},
            {"type": "shell", "id": "wipe", "command": "rm -rf tmp"},
            {"type": "createFile", "path": "after.txt", "content": "2"},
        ),
    )
    await first.close()

    second = Spaces(data, builtin_registry())
    await second.open()
    try:
        again = await second.get_space("persisted")
        assert again.workspace == space.workspace and again.policy.spec == {
            "preset": "standard",
            "timeout": 5000,
        }
        assert await second.get_run("persisted", paused["runId"]) == paused
        resumed = await second.resume_run(
            "persisted", paused["runId"], {"operationId": "wipe", "decision": "approved"}
        )
        assert resumed["status"] == "completed"
        assert [event["type"] for event in resumed["events"]] == ["shell", "createFile"]
        assert not (space.workspace / "tmp").exists() and (space.workspace / "after.txt").exists()
        whole = await second.get_run("persisted", paused["runId"])
        assert [event["type"] for event in whole["events"]] == [
            "createFile",
            "approvalRequired",
            "shell",
            "createFile",
        ]
    finally:
        await second.close()


async def test_runs_left_running_by_a_stopped_process_become_errors(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Spaces(data, builtin_registry())
    await first.open()
    space = await first.create_space()
    await first.close()
    store = SpacesStore(data / "spaces.db")  # what a killed process leaves behind
    await store.open()
    now = "2025-01-15T10:30:00.000Z"
    await store.insert_run(
        RunRecord("run_crashed", space.id, "running", {"preset": "standard"}, None, 0, now, now)
    )
    await store.close()

    second = Spaces(data, builtin_registry())
    await second.open()
    try:
        crashed = await second.get_run(space.id, "run_crashed")
        assert crashed["status"] == "error"
        assert bare(crashed["events"]) == [
            {
                "type": "error",
                "category": "system",
                "message": "The run was interrupted: the server stopped while it ran",
                "details": {},
            }
        ]
    finally:
        await second.close()


async def until_exists(path: Path) -> None:
    await eventually(lambda: asyncio.to_thread(path.exists), f"{path} exists")


async def test_cancel_a_run_awaiting_approval(spaces: Spaces, space: Space) -> None:
    paused = await run(spaces, space, {"type": "shell", "id": "rm", "command": "rm -rf x"})
    cancelled = await spaces.cancel_run(space.id, paused["runId"])
    assert cancelled["status"] == "cancelled" and cancelled["events"] == paused["events"]
    with pytest.raises(FailedPrecondition, match="is cancelled, not awaiting approval"):
        await spaces.resume_run(space.id, paused["runId"], {"operationId": "rm", "decision": "approved"})
    with pytest.raises(FailedPrecondition, match="is cancelled; only a running run"):
        await spaces.cancel_run(space.id, paused["runId"])


async def test_cancel_a_running_run_kills_its_command(spaces: Spaces, space: Space) -> None:
    started = space.workspace / "started"
    task = asyncio.create_task(
        run(
            spaces,
            space,
            {"type": "shell", "id": "slow", "command": "touch started; sleep 30"},
            {"type": "createFile", "path": "never.txt", "content": "x"},
        )
    )
    await until_exists(started)
    run_id = next(iter(spaces._active))
    during = await spaces.get_run(space.id, run_id)
    assert during["status"] == "running"
    cancelled = await spaces.cancel_run(space.id, run_id)
    result = await task
    assert result["status"] == cancelled["status"] == "cancelled"
    assert bare(cancelled["events"]) == [
        {
            "type": "shell",
            "operationId": "slow",
            "command": "touch started; sleep 30",
            "success": False,
            "error": "Cancelled: the run was cancelled while the command ran, and the command was killed",
        }
    ]
    assert not (space.workspace / "never.txt").exists()


async def test_a_caller_that_goes_away_leaves_the_run_cancelled(spaces: Spaces, space: Space) -> None:
    task = asyncio.create_task(run(spaces, space, {"type": "shell", "command": "touch started; sleep 30"}))
    await until_exists(space.workspace / "started")
    run_id = next(iter(spaces._active))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await spaces.get_run(space.id, run_id))["status"] == "cancelled"


# --- spaces and the CLI entry --------------------------------------------------------------------


async def test_spaces_workspaces_and_ids(spaces: Spaces, tmp_path: Path) -> None:
    own = await spaces.create_space(space_id="my-space_1")
    assert own.workspace == (tmp_path / "data" / "spaces" / "my-space_1" / "workspace").resolve()
    assert own.workspace.is_dir() and own.policy.name == "standard"
    assert own.to_dict() == {
        "spaceId": "my-space_1",
        "workspace": str(own.workspace),
        "policy": {"preset": "standard"},
        "createdAt": own.created_at,
    }
    session_dir = tmp_path / "session"
    session_dir.mkdir()
    shared = await spaces.create_space(workspace=session_dir, policy="permissive")
    assert shared.id.startswith("space_") and shared.workspace == session_dir.resolve()
    assert (await spaces.get_space(shared.id)).policy.name == "permissive"
    with pytest.raises(AlreadyExists):
        await spaces.create_space(space_id="my-space_1")
    with pytest.raises(InvalidArgument, match="spaceId must be"):
        await spaces.create_space(space_id="../escape")
    with pytest.raises(InvalidArgument, match="is not an existing directory"):
        await spaces.create_space(workspace=tmp_path / "missing")
    with pytest.raises(NotFound):
        await spaces.get_space("missing")


async def test_run_operations_file(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = await run_operations_file(DATA / "partial-failure.json", workspace, "standard")
    assert result["status"] == "completed"
    assert [event["success"] for event in result["events"]] == [True, False, True]
    assert (workspace / "a.ts").read_text() == "..."

    paused_file = tmp_path / "approval.json"
    paused_file.write_text(json.dumps(message({"type": "shell", "id": "rm", "command": "rm -rf a.ts"})))
    paused = await run_operations_file(paused_file, workspace, "standard")
    assert paused["status"] == "awaiting_approval" and (workspace / "a.ts").exists()

    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(MessageInvalid, match=r"broken\.json.: not valid JSON"):
        await run_operations_file(broken, workspace, "standard")
    with pytest.raises(NotFound):
        await run_operations_file(tmp_path / "missing.json", workspace, "standard")


async def test_many_operations_are_stored_in_one_go(spaces: Spaces, space: Space) -> None:
    operations = [{"type": "createFile", "path": f"f{i}.txt", "content": str(i)} for i in range(100)]
    result = await run(spaces, space, *operations)
    assert result["status"] == "completed" and len(result["events"]) == 100
    assert (await spaces.get_run(space.id, result["runId"])) == result
