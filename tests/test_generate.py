"""Generate and StreamGenerate through the real gRPC server against the fake OpenAI-compatible LLM."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, broken_stream, call, error, hang, text, tool_call, tool_calls

from .conftest import (
    LiveServer,
    agent_settings,
    alive,
    eventually,
    host_pid,
    initialize,
    new_session,
    running,
    user,
)
from .scripted_model import ScriptedProvider, after


async def test_multi_step_tool_use_edits_files_and_runs_bash(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(
        tool_call("write_file", {"path": "hello.py", "content": "print('hi from the agent')\n"}),
        tool_calls(
            [call("bash", {"command": "python3 hello.py"}), call("read_file", {"path": "hello.py"})],
            content="Let me run it.",
        ),
        text("Created hello.py and ran it."),
    )
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("write hello.py")])
    )

    assert (agent.workspace / "hello.py").read_text() == "print('hi from the agent')\n"
    assert reply.message.role == pb.Message.ROLE_ASSISTANT
    assert reply.message.content == "Created hello.py and ran it."
    assert reply.finish_reason == pb.FINISH_REASON_STOP
    assert [c.name for c in reply.tool_calls] == ["write_file", "bash", "read_file"]
    assert all(c.result.success and c.id for c in reply.tool_calls), reply.tool_calls
    assert reply.tool_calls[1].result.output.strip() == "hi from the agent"
    assert json.loads(reply.tool_calls[0].arguments)["path"] == "hello.py"
    assert reply.metadata["turns"] == "3" and reply.metadata["model"] == "fake-model"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens > 0

    # What the model saw: system prompt, the user task, its own calls and every result with its id.
    first, last = fake.requests[0], fake.requests[-1]
    assert first.messages[0]["role"] == "system" and "workspace" in first.messages[0]["content"]
    assert first.messages[-1] == {"role": "user", "content": "write hello.py"}
    assert first.tools is not None
    assert {t["function"]["name"] for t in first.tools} >= {"read_file", "bash", "git_status"}
    assert [m["role"] for m in last.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
    ]
    call_ids = [c["id"] for m in last.messages if m["role"] == "assistant" for c in m["tool_calls"]]
    assert [m["tool_call_id"] for m in last.messages if m["role"] == "tool"] == call_ids
    assert "hi from the agent" in last.messages[5]["content"]

    session = (await agent.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session
    assert session.context_usage.message_count == 7  # user + 3 assistant + 3 tool results
    assert session.context_usage.completion_tokens > 0  # what the model wrote, counted offline
    assert session.context_usage.prompt_tokens > 1000  # system prompt, messages and 20 tool schemas


async def test_stream_sends_text_tool_calls_results_usage_and_done_in_order(
    agent: LiveServer, fake: FakeLLM
) -> None:
    fake.script(  # the first reply's deltas apart (deltas one network read brings go on as one)
        replace(
            tool_call("read_file", {"path": "notes.txt"}, content="Reading the notes first."),
            chunk_delay=0.005,
        ),
        text("The notes say: remember the milk."),
    )
    (agent.workspace / "notes.txt").write_text("remember the milk\n")
    session_id = await new_session(agent)
    chunks = [
        c
        async for c in agent.stub.StreamGenerate(
            pb.GenerateRequest(session_id=session_id, messages=[user("notes?")])
        )
    ]
    kinds = [pb.GenerateChunk.ChunkType.Name(c.type).removeprefix("CHUNK_TYPE_") for c in chunks]
    first_turn = kinds[: kinds.index("TOOL_CALL")]
    assert set(first_turn) == {"CONTENT"} and len(first_turn) > 1  # text deltas as they arrived
    assert "".join(c.content for c in chunks[: len(first_turn)]) == "Reading the notes first."
    tool_call_chunk = chunks[kinds.index("TOOL_CALL")]
    result_chunk = chunks[kinds.index("TOOL_RESULT")]
    assert tool_call_chunk.tool_call.id and tool_call_chunk.tool_call.name == "read_file"
    assert json.loads(tool_call_chunk.tool_call.arguments) == {"path": "notes.txt"}
    assert result_chunk.tool_call.id == tool_call_chunk.tool_call.id
    assert result_chunk.tool_result.success and "remember the milk" in result_chunk.tool_result.output
    assert kinds.index("TOOL_CALL") < kinds.index("METADATA") < kinds.index("TOOL_RESULT")
    assert kinds[-1] == "DONE" and kinds.count("DONE") == 1 and kinds.count("METADATA") == 2
    done = chunks[-1]
    assert done.metadata["finish_reason"] == "stop"
    assert int(done.metadata["total_tokens"]) > 0
    assert done.content == "The notes say: remember the milk."
    second_turn_text = "".join(c.content for c in chunks[kinds.index("TOOL_RESULT") + 1 : -1] if c.type == 1)
    assert second_turn_text == "The notes say: remember the milk."
    assert all(c.session_id == session_id for c in chunks)


async def test_history_survives_a_restart_and_the_next_generate_continues(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    fake.script(text("Nice to meet you, Ada."), text("Your name is Ada."))
    async with running(agent_settings(workspace, tmp_path / "data")) as first:
        await initialize(first, fake)
        session_id = await new_session(first, system_prompt="You are terse.")
        await first.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("I am Ada.")]))
    async with running(agent_settings(workspace, tmp_path / "data")) as second:
        await initialize(second, fake)
        reply = await second.stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("Who am I?")])
        )
    assert reply.message.content == "Your name is Ada."
    system = fake.requests[1].messages[0]
    assert system == fake.requests[0].messages[0]  # the same prompt after the restart
    assert system["content"].startswith("You are terse.\n\n# Workspace\n")  # its own prompt, then the facts
    assert fake.requests[1].messages[1:] == [
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "Who am I?"},
    ]


async def test_options_and_roles_are_passed_through(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(text("ok"), text("ok"))
    session_id = await new_session(agent)
    options = pb.GenerateOptions(
        temperature=0.25, max_tokens=77, stop_sequences=["END"], allowed_tools=["grep", "read_file"]
    )
    await agent.stub.Generate(
        pb.GenerateRequest(
            session_id=session_id,
            messages=[
                pb.Message(role=pb.Message.ROLE_SYSTEM, content="Extra rule."),
                pb.Message(role=pb.Message.ROLE_ASSISTANT, content="Earlier answer."),
                user("go"),
            ],
            options=options,
        )
    )
    body = fake.requests[0].body
    assert body["temperature"] == pytest.approx(0.25)
    assert body["max_tokens"] == 77 and body["stop"] == ["END"]
    assert sorted(t["function"]["name"] for t in body["tools"]) == ["grep", "read_file"]
    assert [m["role"] for m in body["messages"]] == ["system", "system", "assistant", "user"]
    await agent.stub.Generate(
        pb.GenerateRequest(
            session_id=session_id, messages=[user("no tools")], options=pb.GenerateOptions(enable_tools=False)
        )
    )
    body = fake.requests[1].body
    assert "tools" not in body and "temperature" not in body and "max_tokens" not in body


async def test_attachments_become_image_parts_and_named_text_blocks(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(text("seen"))
    session_id = await new_session(agent)
    message = pb.Message(
        role=pb.Message.ROLE_USER,
        content="look",
        attachments=[
            pb.Attachment(
                type=pb.Attachment.TYPE_IMAGE, name="shot.png", mime_type="image/png", content=b"\x89PNG"
            ),
            pb.Attachment(type=pb.Attachment.TYPE_CODE, name="main.py", content=b"print(1)"),
        ],
    )
    await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[message]))
    parts = fake.requests[0].messages[-1]["content"]
    assert parts[0] == {"type": "text", "text": "look"}
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )
    assert parts[2]["type"] == "text" and "main.py" in parts[2]["text"] and "print(1)" in parts[2]["text"]


async def test_max_tool_calls_stops_the_loop(agent: LiveServer, fake: FakeLLM) -> None:
    fake.fallback = tool_call("list_files", {})
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(
        pb.GenerateRequest(
            session_id=session_id,
            messages=[user("loop")],
            options=pb.GenerateOptions(enable_tools=True, max_tool_calls=3),
        )
    )
    assert reply.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert len(reply.tool_calls) == 3
    assert "max_tool_calls limit (3)" in reply.message.content


async def test_malformed_tool_arguments_go_back_to_the_model_as_an_error(
    agent: LiveServer, fake: FakeLLM
) -> None:
    fake.script(tool_calls([call("read_file", '{"path": "a.txt"')]), text("I will fix my call."))
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(
        pb.GenerateRequest(session_id=session_id, messages=[user("read a.txt")])
    )
    assert reply.message.content == "I will fix my call."
    assert not reply.tool_calls[0].result.success
    assert "not valid JSON" in reply.tool_calls[0].result.error
    tool_message = fake.requests[1].messages[-1]
    assert tool_message["role"] == "tool" and "not valid JSON" in tool_message["content"]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("length", pb.FINISH_REASON_LENGTH), ("content_filter", pb.FINISH_REASON_CONTENT_FILTER)],
)
async def test_finish_reasons_are_mapped(
    agent: LiveServer, fake: FakeLLM, reason: str, expected: int
) -> None:
    fake.script(text("partial", finish_reason=reason))
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("x")]))
    assert reply.finish_reason == expected


async def test_rate_limit_then_success_is_retried(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(error(429, retry_after=0.01), text("after retry"))
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("x")]))
    assert reply.message.content == "after retry"
    assert len(fake.requests) == 2


async def _generate_error(server: LiveServer, content: str = "x") -> grpc.aio.AioRpcError:
    session_id = await new_session(server)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user(content)]))
    return err.value


async def test_server_errors_until_failure_are_unavailable_with_the_provider_message(
    agent: LiveServer, fake: FakeLLM
) -> None:
    fake.fallback = error(500, "the model is on fire", retry_after=0.01)
    err = await _generate_error(agent)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "the model is on fire" in err.details()
    assert len(fake.requests) == 3  # first try and two retries


async def test_a_hanging_provider_hits_the_timeout(agent: LiveServer, fake: FakeLLM) -> None:
    fake.fallback = hang(30)
    err = await _generate_error(agent)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "timed out" in err.details()


async def test_a_rejected_key_says_so_without_echoing_it(agent: LiveServer, fake: FakeLLM) -> None:
    fake.api_key = "sk-right"
    await agent.stub.Initialize(
        pb.InitializeRequest(
            config=pb.AgentConfig(
                llm=pb.LLMConfig(model="fake-model", base_url=fake.base_url, api_key="sk-wrong-key")
            )
        )
    )
    err = await _generate_error(agent)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "rejected the API key" in err.details() and "sk-wrong-key" not in err.details()


async def test_session_llm_config_wins_over_initialize(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(text("ok"))
    session_id = await new_session(agent, llm=pb.LLMConfig(model="session-model"))
    await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("x")]))
    assert fake.requests[0].model == "session-model"


async def test_a_stream_failing_midway_ends_with_a_status(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(broken_stream(text("this reply will be cut off before the end"), after_chunks=3))
    session_id = await new_session(agent)
    call_ = agent.stub.StreamGenerate(pb.GenerateRequest(session_id=session_id, messages=[user("x")]))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for chunk in call_:
            received.append(chunk)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert received and all(c.type == pb.GenerateChunk.CHUNK_TYPE_CONTENT for c in received)


async def test_request_errors(live: LiveServer, agent: LiveServer) -> None:
    # No LLM configured anywhere: say how to configure one.
    session_id = await new_session(live)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("x")]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "A3S_LLM_MODEL" in err.value.details() and "Initialize" in err.value.details()
    session_id = await new_session(agent)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.Generate(pb.GenerateRequest(session_id=session_id))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "messages" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.Generate(pb.GenerateRequest(session_id="ghost", messages=[user("x")]))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.Generate(
            pb.GenerateRequest(
                session_id=session_id,
                messages=[user("x")],
                options=pb.GenerateOptions(allowed_tools=["nope"]),
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "nope" in err.value.details()


async def test_a_busy_session_serves_generations_one_after_the_other(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    scripted.script(text("first answer", delay=0.3), text("second answer"))  # a slow model
    session_id = await new_session(scripted_agent)
    first = scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("one")]))
    await eventually(lambda: scripted.requests, "the first generation's model call")
    second = scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("two")]))
    replies = await asyncio.gather(first, second)
    assert [r.message.content for r in replies] == ["first answer", "second answer"]
    assert [m["content"] for m in scripted.requests[1].messages[1:]] == ["one", "first answer", "two"]


async def test_intermediate_steps_on_request(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(tool_call("list_files", {}, content="Looking around."), text("done"))
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(
        pb.GenerateRequest(
            session_id=session_id,
            messages=[user("x")],
            options=pb.GenerateOptions(enable_tools=True, return_intermediate_steps=True),
        )
    )
    steps = json.loads(reply.metadata["intermediate_steps"])
    assert steps[0]["content"] == "Looking around." and steps[0]["tool_calls"][0]["name"] == "list_files"


async def test_a_run_goes_on_when_its_client_disconnects_until_cancel_stops_it(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    # A client that goes away (a network drop) no longer stops the generation: it may resume the
    # stream from the last seq it saw (tests/test_resume.py). Cancel, from any call, stops it.
    marker = scripted_agent.workspace / "pid"
    scripted.script(tool_call("bash", {"command": f"echo $$ > {marker}; sleep 30"}), text("never"))
    session_id = await new_session(scripted_agent)
    stream = scripted_agent.stub.StreamGenerate(
        pb.GenerateRequest(session_id=session_id, messages=[user("x")])
    )
    async for chunk in stream:
        if chunk.type == pb.GenerateChunk.CHUNK_TYPE_TOOL_CALL:
            break
    pid = host_pid(int(await eventually(lambda: marker.exists() and marker.read_text().strip(), "bash runs")))
    stream.cancel()
    await eventually(lambda: scripted_agent.runtime.events.subscriber_count == 0, "the stream is gone")
    await asyncio.sleep(0.2)  # what a disconnect would have stopped by now
    assert alive(pid) and scripted_agent.runtime.runs.running == 1
    assert (await scripted_agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    await eventually(lambda: not alive(pid), "bash is gone")
    await eventually(lambda: scripted_agent.runtime.runs.running == 0, "the run ended")
    assert len(scripted.requests) == 1  # the run stopped; the model was not called again


async def test_generations_beyond_the_server_limit_are_resource_exhausted(
    workspace: Path, tmp_path: Path, scripted: ScriptedProvider
) -> None:
    settings = agent_settings(workspace, tmp_path / "data")
    settings.max_generations = 1
    answer = asyncio.Event()
    scripted.script(after(answer, "slow"), text("second"))
    async with running(settings, connect=scripted.connect) as server:
        await initialize(server)
        first_session, second_session = await new_session(server), await new_session(server)
        first = asyncio.ensure_future(
            server.stub.Generate(pb.GenerateRequest(session_id=first_session, messages=[user("a")]))
        )
        await eventually(lambda: scripted.requests, "the first generation's model call")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.stub.Generate(pb.GenerateRequest(session_id=second_session, messages=[user("b")]))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        answer.set()
        assert (await first).message.content == "slow"
        reply = await server.stub.Generate(
            pb.GenerateRequest(session_id=second_session, messages=[user("b")])
        )
        assert reply.message.content == "second"
