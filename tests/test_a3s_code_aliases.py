"""A3S Code's tool and argument names (`read` with `file_path`...) through the real gRPC server:
ExecuteTool, ExecuteToolBatch, the model's calls, permission rules and CheckPermission."""

from __future__ import annotations

import json

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import call, text, tool_calls

from .conftest import LiveServer, new_session, user
from .scripted_model import ScriptedProvider


async def _execute(
    live: LiveServer, tool: str, session_id: str = "", /, **arguments: object
) -> pb.ToolResult:
    reply = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=session_id, tool_name=tool, arguments=json.dumps(arguments))
    )
    return reply.result


async def _deny(server: LiveServer, session_id: str, *rules: str) -> None:
    policy = pb.PermissionPolicy(enabled=True, deny=[pb.PermissionRule(rule=rule) for rule in rules])
    await server.stub.SetPermissionPolicy(pb.SetPermissionPolicyRequest(session_id=session_id, policy=policy))


async def _check(server: LiveServer, session_id: str, tool: str, **arguments: object) -> int:
    reply = await server.stub.CheckPermission(
        pb.CheckPermissionRequest(session_id=session_id, tool_name=tool, arguments=json.dumps(arguments))
    )
    return reply.decision


# --- ExecuteTool ------------------------------------------------------------------------------


async def test_execute_tool_takes_a3s_code_names(live: LiveServer) -> None:
    written = await _execute(live, "write", file_path="src/a.txt", content="hello world\nsecond\n")
    assert written.success, written.error
    assert (live.workspace / "src/a.txt").read_text() == "hello world\nsecond\n"

    read = await _execute(live, "read", file_path="src/a.txt", offset=1, limit=1)
    assert read.success and "second" in read.output and "hello" not in read.output

    edited = await _execute(live, "edit", file_path="src/a.txt", old_string="world", new_string="there")
    assert edited.success, edited.error
    assert (live.workspace / "src/a.txt").read_text() == "hello there\nsecond\n"

    assert "src/a.txt" in (await _execute(live, "glob", pattern="**/*.txt")).output
    assert "a.txt" in (await _execute(live, "ls", path="src")).output
    found = await _execute(live, "grep", pattern="HELLO", path="src", **{"-i": True})
    assert found.success and "hello there" in found.output
    ran = await _execute(live, "bash", command="echo $((6 * 7))", timeout=5000)
    assert ran.success and ran.output.strip() == "42"
    # Our own tool takes A3S Code's argument name too, and the same value under both names.
    assert "second" in (await _execute(live, "read_file", file_path="src/a.txt")).output
    assert (await _execute(live, "read", file_path="src/a.txt", path="src/a.txt")).success


async def test_a3s_code_bash_timeout_is_milliseconds(live: LiveServer) -> None:
    result = await _execute(live, "bash", command="sleep 5", timeout=300)
    assert not result.success and "300" in result.error + result.output


async def test_execute_tool_batch_takes_a3s_code_names(live: LiveServer) -> None:
    (live.workspace / "b.txt").write_text("one\n")
    reply = await live.stub.ExecuteToolBatch(
        pb.ExecuteToolBatchRequest(
            tool_calls=[
                pb.ToolCall(name="edit", arguments=json.dumps({"file_path": "b.txt", "old_string": "one", "new_string": "two"})),
                pb.ToolCall(name="read", arguments=json.dumps({"file_path": "b.txt"})),
                pb.ToolCall(name="read", arguments=json.dumps({"file_path": "b.txt", "path": "other.txt"})),
            ]
        )
    )  # fmt: skip
    edited, read, conflicting = reply.results
    assert edited.success and "two" in read.output
    assert not conflicting.success and "'file_path'" in conflicting.error and "'path'" in conflicting.error


async def test_conflicting_names_are_invalid_argument(live: LiveServer) -> None:
    (live.workspace / "a.txt").write_text("a\n")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _execute(live, "read", file_path="a.txt", path="b.txt")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'file_path'" in (err.value.details() or "") and "'path'" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _execute(live, "bash", command="true", timeout=1000, timeout_ms=2000)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'timeout'" in (err.value.details() or "")


async def test_unknown_names_still_fail(live: LiveServer) -> None:
    for name in ("cat", "Read", "multiedit"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _execute(live, name, file_path="a.txt")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, name


async def test_an_alias_of_a_disabled_tool_is_refused_like_the_tool(live: LiveServer) -> None:
    await live.stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(tools=pb.ToolsConfig(disabled_tools=["read_file"])))
    )
    (live.workspace / "a.txt").write_text("a\n")
    for name in ("read_file", "read"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _execute(live, name, file_path="a.txt")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "read_file" in (err.value.details() or "")


async def test_execute_tool_runs_without_permission_rules_by_either_name(live: LiveServer) -> None:
    """ExecuteTool is the host's own call: a session's deny rules govern the model, not it."""
    (live.workspace / "secret").mkdir()
    (live.workspace / "secret/x").write_text("classified\n")
    session_id = await new_session(live)
    await _deny(live, session_id, "Read(secret/**)")
    for name, argument in (("read_file", "path"), ("read", "file_path")):
        result = await _execute(live, name, session_id, **{argument: "secret/x"})
        assert result.success and "classified" in result.output, name


# --- permission rules and CheckPermission -----------------------------------------------------


async def test_check_permission_sees_a3s_code_arguments(live: LiveServer) -> None:
    session_id = await new_session(live)
    await _deny(live, session_id, "Read(secret/**)", "Edit(src/**)", "Bash(rm:*)")
    deny, allow = pb.PERMISSION_DECISION_DENY, pb.PERMISSION_DECISION_ALLOW
    assert await _check(live, session_id, "read", file_path="secret/x") == deny
    assert await _check(live, session_id, "read_file", file_path="secret/x") == deny
    assert await _check(live, session_id, "read", file_path=str(live.workspace / "secret/x")) == deny
    assert await _check(live, session_id, "read", file_path="public/x") == allow
    assert (
        await _check(live, session_id, "edit", file_path="src/a.py", old_string="a", new_string="b") == deny
    )
    assert await _check(live, session_id, "write", file_path="src/a.py") == allow
    assert await _check(live, session_id, "bash", command="rm -rf build", timeout=1000) == deny
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _check(live, session_id, "read", file_path="secret/x", path="public/x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'file_path'" in (err.value.details() or "") and "'path'" in (err.value.details() or "")


# --- the model's calls ------------------------------------------------------------------------


async def test_initialize_tool_lists_take_a3s_code_names(live: LiveServer) -> None:
    await live.stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(tools=pb.ToolsConfig(disabled_tools=["read", "ls"])))
    )
    listed = {t.name for t in (await live.stub.ListTools(pb.ListToolsRequest())).tools}
    assert not listed & {"read_file", "list_files", "read", "ls"} and "write_file" in listed
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.Initialize(
            pb.InitializeRequest(config=pb.AgentConfig(tools=pb.ToolsConfig(enabled_tools=["reed"])))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reed" in (err.value.details() or "")


async def test_allowed_tools_take_a3s_code_names(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(text("done"))
    session_id = await new_session(scripted_agent)
    options = pb.GenerateOptions(enable_tools=True, allowed_tools=["read", "grep", "write_file"])
    await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")], options=options)
    )
    offered = {t["function"]["name"] for t in scripted.requests[0].tools}
    assert offered == {"read_file", "grep", "write_file"}


async def test_model_calls_by_a3s_code_names(scripted_agent: LiveServer, scripted: ScriptedProvider) -> None:
    (scripted_agent.workspace / "a.txt").write_text("alpha\n")
    scripted.script(
        tool_calls(
            [
                call("read", {"file_path": "a.txt"}),
                call("bash", {"command": "echo ran-$((1 + 1))", "timeout": 5000}),
                call("edit", {"file_path": "a.txt", "old_string": "alpha", "new_string": "beta"}),
            ]
        ),
        text("done"),
    )
    session_id = await new_session(scripted_agent)
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )
    read, ran, edited = (c.result for c in reply.tool_calls)
    assert read.success and "alpha" in read.output
    assert ran.success and "ran-2" in ran.output
    assert edited.success, edited.error
    assert (scripted_agent.workspace / "a.txt").read_text() == "beta\n"
    # The model reads its results back under the names it called.
    answers = [m for m in scripted.requests[1].messages if m["role"] == "tool"]
    assert "alpha" in answers[0]["content"] and "ran-2" in answers[1]["content"]
    # Offered by our names only.
    assert "read" not in {t["function"]["name"] for t in scripted.requests[0].tools}


async def test_model_alias_calls_are_governed_by_the_rules_of_ours(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    (scripted_agent.workspace / "secret").mkdir()
    (scripted_agent.workspace / "secret/x").write_text("classified\n")
    scripted.script(
        tool_calls(
            [
                call("read", {"file_path": "secret/x"}),
                call("read_file", {"file_path": "secret/x"}),
                call("read", {"file_path": "secret/x", "path": "a.txt"}),
            ]
        ),
        text("ok"),
    )
    session_id = await new_session(scripted_agent)
    await _deny(scripted_agent, session_id, "Read(secret/**)")
    reply = await scripted_agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    )
    aliased, ours, conflicting = (c.result for c in reply.tool_calls)
    for result in (aliased, ours):
        assert not result.success and "denied by policy: Read(secret/**)" in result.error
        assert "classified" not in result.output
    assert not conflicting.success and "'file_path'" in conflicting.error
