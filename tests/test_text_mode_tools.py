"""edit_lines, the tool of the text protocol's EDIT_FILE, is offered to text-protocol sessions only,
through the real gRPC server: ListTools, GetCapabilities, ExecuteTool and Initialize's tool lists."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from a3s_agent.config import Settings
from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import LiveServer, new_session, running
from .test_tools_rpc import ALL_TOOLS

EDIT = {"path": "a.txt", "start_line": 2, "end_line": 2, "content": "TWO\n"}


async def _tools(server: LiveServer, session_id: str = "") -> list[str]:
    reply = await server.stub.ListTools(pb.ListToolsRequest(session_id=session_id))
    return [tool.name for tool in reply.tools]


async def _session(server: LiveServer, provider: str) -> str:
    return await new_session(server, llm=pb.LLMConfig(provider=provider, model="m"))


async def _edit(server: LiveServer, session_id: str) -> pb.ToolResult:
    request = pb.ExecuteToolRequest(session_id=session_id, tool_name="edit_lines", arguments=json.dumps(EDIT))
    return (await server.stub.ExecuteTool(request)).result


@pytest.mark.parametrize("provider", ["openai+text", "relay"])
async def test_a_text_protocol_session_lists_and_runs_edit_lines(live: LiveServer, provider: str) -> None:
    (live.workspace / "a.txt").write_text("one\ntwo\nthree\n")
    session_id = await _session(live, provider)
    assert await _tools(live, session_id) == [*ALL_TOOLS, "edit_lines", "task"]
    result = await _edit(live, session_id)
    assert result.success, result.error
    assert (live.workspace / "a.txt").read_text() == "one\nTWO\nthree\n"


@pytest.mark.parametrize("provider", ["openai", "openai+native"])
async def test_a_native_session_neither_lists_nor_runs_edit_lines(live: LiveServer, provider: str) -> None:
    (live.workspace / "a.txt").write_text("one\ntwo\nthree\n")
    session_id = await _session(live, provider)
    assert await _tools(live, session_id) == [*ALL_TOOLS, "task"]
    assert await _tools(live) == [*ALL_TOOLS, "task"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _edit(live, session_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert (live.workspace / "a.txt").read_text() == "one\ntwo\nthree\n"


async def test_the_server_default_text_mode_offers_it_but_capabilities_do_not_list_it(
    workspace: Path, tmp_path: Path
) -> None:
    settings = Settings(
        listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data", llm_tool_mode="text"
    )
    async with running(settings) as server:
        assert await _tools(server) == [*ALL_TOOLS, "edit_lines", "task"]  # no session: the server's model
        assert await _tools(server, await _session(server, "openai+native")) == [*ALL_TOOLS, "task"]
        caps = await server.stub.GetCapabilities(pb.GetCapabilitiesRequest())
        assert [tool.name for tool in caps.tools] == ALL_TOOLS


async def test_initialize_tool_lists_neither_name_nor_hide_it(live: LiveServer) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.Initialize(
            pb.InitializeRequest(config=pb.AgentConfig(tools=pb.ToolsConfig(disabled_tools=["edit_lines"])))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "edit_lines" in err.value.details()
    await live.stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(tools=pb.ToolsConfig(enabled_tools=["read_file"])))
    )
    assert await _tools(live, await _session(live, "openai+text")) == ["read_file", "edit_lines"]
