"""ExecuteTool, ExecuteToolBatch and ListTools through the real gRPC server."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import LiveServer

ALL_TOOLS = [
    "read_file", "write_file", "edit_file", "delete_file", "list_files", "search_files",
    "grep", "find_definition", "find_references", "format_code", "lint_code",
    "bash", "run_script",
    "git_status", "git_diff", "git_commit", "git_log",
    "web_search", "web_fetch", "ask_user", "todo",
]  # fmt: skip
READ_ONLY = {
    "task",
    "read_file", "list_files", "search_files", "grep", "find_definition", "find_references",
    "git_status", "git_diff", "git_log", "web_search", "web_fetch", "ask_user", "todo",
}  # fmt: skip


async def _execute(live: LiveServer, tool: str, session_id: str = "", **arguments: object) -> pb.ToolResult:
    reply = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=session_id, tool_name=tool, arguments=json.dumps(arguments))
    )
    return reply.result


async def test_list_tools_has_all_twenty_one_with_schemas_and_tags(live: LiveServer) -> None:
    reply = await live.stub.ListTools(pb.ListToolsRequest())
    assert [t.name for t in reply.tools] == [*ALL_TOOLS, "task"]  # task: made per session (subagents)
    for item in reply.tools:
        schema = json.loads(item.parameters_schema)
        assert schema["type"] == "object" and schema["properties"], item.name
        assert len(item.description) > 40, item.name
        family, lane = item.tags
        assert family in {"file", "code", "command", "git", "web", "interaction"}
        assert lane == ("query" if item.name in READ_ONLY else "execute"), item.name
    read_file = next(t for t in reply.tools if t.name == "read_file")
    schema = json.loads(read_file.parameters_schema)
    assert schema["required"] == ["path"]
    assert schema["properties"]["encoding"]["enum"] == ["utf-8", "ascii", "base64"]


async def test_capabilities_tools_come_from_the_same_registry(live: LiveServer) -> None:
    caps = await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert [t.name for t in caps.tools] == ALL_TOOLS
    grep = next(t for t in caps.tools if t.name == "grep")
    assert "pattern" in grep.parameters and "case_insensitive" in grep.parameters
    assert "tool_execution" in caps.features


async def test_disabled_tools_disappear_and_are_refused(live: LiveServer) -> None:
    await live.stub.Initialize(
        pb.InitializeRequest(
            config=pb.AgentConfig(tools=pb.ToolsConfig(disabled_tools=["bash", "web_fetch"]))
        )
    )
    names = [t.name for t in (await live.stub.ListTools(pb.ListToolsRequest())).tools]
    assert "bash" not in names and "web_fetch" not in names and len(names) == 20
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _execute(live, "bash", command="echo hi")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "disabled" in err.value.details()
    await live.stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(tools=pb.ToolsConfig(enabled_tools=["read_file", "grep"])))
    )
    names = [t.name for t in (await live.stub.ListTools(pb.ListToolsRequest())).tools]
    assert names == ["read_file", "grep"]
    await live.stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(tools=pb.ToolsConfig(disabled_tools=["task"])))
    )
    names = [t.name for t in (await live.stub.ListTools(pb.ListToolsRequest())).tools]
    assert names == ALL_TOOLS


async def test_unknown_tool_is_not_found(live: LiveServer) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _execute(live, "rm_rf")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "rm_rf" in err.value.details()


async def test_bad_arguments_are_invalid_argument_listing_every_error(live: LiveServer) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.ExecuteTool(pb.ExecuteToolRequest(tool_name="read_file", arguments="{not json"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not valid JSON" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _execute(live, "read_file", offset=-1, encoding="latin-1", bogus=1)
    details = err.value.details()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for field in ("path", "offset", "encoding", "bogus"):
        assert field in details, details


async def test_a_failing_tool_is_a_result_not_an_rpc_error(live: LiveServer) -> None:
    result = await _execute(live, "read_file", path="missing.txt")
    assert not result.success
    assert "missing.txt" in result.error
    result = await _execute(live, "bash", command="echo out; exit 3")
    assert not result.success and result.output.strip() == "out"
    assert result.metadata["exit_code"] == "3"
    assert float(result.metadata["duration_ms"]) >= 0


async def test_tools_run_in_the_session_workspace_and_are_recorded(live: LiveServer) -> None:
    (live.workspace / "proj").mkdir()
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(workspace="proj"))
    )
    session_id = created.session_id
    written = await _execute(live, "write_file", session_id, path="notes.md", content="hello\n")
    assert written.success
    assert (live.workspace / "proj" / "notes.md").read_text() == "hello\n"
    read = await _execute(live, "read_file", session_id, path="notes.md")
    assert "hello" in read.output
    session = (await live.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.context_usage.message_count == 4
    history = await live.runtime.sessions.history(session_id)
    assert history[0].role == "assistant" and history[0].tool_calls[0].name == "write_file"
    assert history[1].role == "tool" and history[1].tool_call_id == history[0].tool_calls[0].id
    assert "hello" in history[3].content


async def test_execute_tool_with_an_unknown_session_is_not_found(live: LiveServer) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _execute(live, "list_files", "ghost")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_initialize_env_reaches_tool_subprocesses(live: LiveServer) -> None:
    await live.stub.Initialize(pb.InitializeRequest(env={"A3S_TEST_MARK": "marked-42"}))
    result = await _execute(live, "bash", command="echo $A3S_TEST_MARK")
    assert result.output.strip() == "marked-42"


async def test_batch_runs_in_order_and_failures_do_not_stop_it(live: LiveServer) -> None:
    created = await live.stub.CreateSession(pb.CreateSessionRequest())
    calls = [
        pb.ToolCall(id="a", name="write_file", arguments=json.dumps({"path": "x.txt", "content": "1"})),
        pb.ToolCall(id="b", name="no_such_tool", arguments="{}"),
        pb.ToolCall(id="c", name="read_file", arguments="{broken"),
        pb.ToolCall(
            id="d",
            name="edit_file",
            arguments=json.dumps({"path": "x.txt", "old_string": "1", "new_string": "2"}),
        ),
        pb.ToolCall(id="e", name="read_file", arguments=json.dumps({"path": "x.txt"})),
    ]
    reply = await live.stub.ExecuteToolBatch(
        pb.ExecuteToolBatchRequest(session_id=created.session_id, tool_calls=calls)
    )
    assert [r.success for r in reply.results] == [True, False, False, True, True]
    assert "no_such_tool" in reply.results[1].error
    assert "JSON" in reply.results[2].error
    assert "2" in reply.results[4].output
    history = await live.runtime.sessions.history(created.session_id)
    assert [c.id for c in history[0].tool_calls] == ["a", "b", "c", "d", "e"]
    assert [m.tool_call_id for m in history[1:]] == ["a", "b", "c", "d", "e"]


async def test_batch_size_is_limited(live: LiveServer) -> None:
    limit = live.runtime.settings.max_tools_per_request
    calls = [pb.ToolCall(name="list_files", arguments="{}")] * (limit + 1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.ExecuteToolBatch(pb.ExecuteToolBatchRequest(tool_calls=calls))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_git_tools_explain_a_workspace_that_is_not_a_repository(
    live: LiveServer, tmp_path: Path
) -> None:
    result = await _execute(live, "git_status")
    assert not result.success and "not inside a git repository" in result.error


# --- skill tools run as ListTools lists them; client tools are the client's ------------------------


async def test_execute_tool_runs_a_session_skill_tool_that_list_tools_lists(live: LiveServer) -> None:
    created = await live.stub.CreateSession(pb.CreateSessionRequest())
    session_id = created.session_id
    await live.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="word-count"))
    listed = [t.name for t in (await live.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools]
    assert "count_lines" in listed
    (live.workspace / "poem.txt").write_text("roses are red\nviolets are blue\n")
    result = await _execute(live, "count_lines", session_id, path="poem.txt")
    assert result.success, result.error
    assert result.output.strip() == "poem.txt: 2 lines, 6 words, 31 bytes"
    history = await live.runtime.sessions.history(session_id)
    assert history[0].tool_calls[0].name == "count_lines" and "2 lines" in history[1].content
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _execute(live, "count_lines", session_id, bogus="x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "path" in err.value.details()
    for elsewhere in ("", (await live.stub.CreateSession(pb.CreateSessionRequest())).session_id):
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the skill is loaded in one session only
            await _execute(live, "count_lines", elsewhere, path="poem.txt")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "count_lines" in err.value.details()


async def test_execute_tool_batch_runs_server_wide_skill_tools(live: LiveServer) -> None:
    await live.stub.LoadSkill(pb.LoadSkillRequest(skill_name="word-count"))
    assert "count_lines" in [t.name for t in (await live.stub.ListTools(pb.ListToolsRequest())).tools]
    (live.workspace / "a.txt").write_text("one\n")
    calls = [
        pb.ToolCall(id="a", name="count_lines", arguments=json.dumps({"path": "a.txt"})),
        pb.ToolCall(id="b", name="count_lines", arguments=json.dumps({"path": "../outside.txt"})),
    ]
    reply = await live.stub.ExecuteToolBatch(pb.ExecuteToolBatchRequest(tool_calls=calls))
    assert reply.results[0].success and reply.results[0].output.strip() == "a.txt: 1 lines, 1 words, 4 bytes"
    assert not reply.results[1].success and "outside the workspace" in reply.results[1].output
    session_id = (await live.stub.CreateSession(pb.CreateSessionRequest())).session_id
    single = await _execute(live, "count_lines", session_id, path="a.txt")
    assert single.success, single.error


async def test_a_client_tool_is_refused_saying_the_client_runs_it(live: LiveServer) -> None:
    session_id = (await live.stub.CreateSession(pb.CreateSessionRequest())).session_id
    await live.stub.RegisterTool(pb.RegisterToolRequest(tool=pb.Tool(name="open_ticket", description="d")))
    await live.stub.RegisterTool(
        pb.RegisterToolRequest(session_id=session_id, tool=pb.Tool(name="page_oncall", description="d"))
    )
    for name, where in (("open_ticket", ""), ("open_ticket", session_id), ("page_oncall", session_id)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _execute(live, name, where)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, (name, where)
        assert name in err.value.details() and "client runs it" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:  # lent to one session, unknown elsewhere
        await _execute(live, "page_oncall")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    reply = await live.stub.ExecuteToolBatch(
        pb.ExecuteToolBatchRequest(
            session_id=session_id, tool_calls=[pb.ToolCall(id="t", name="page_oncall", arguments="{}")]
        )
    )
    assert not reply.results[0].success and "client runs it" in reply.results[0].error
