"""GenerateStructured and StreamGenerateStructured against the fake LLM."""

from __future__ import annotations

import json
from dataclasses import replace

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, error, text

from .conftest import LiveServer, new_session, user

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
)


def _request(session_id: str) -> pb.GenerateStructuredRequest:
    return pb.GenerateStructuredRequest(session_id=session_id, messages=[user("Ada, 36")], schema=SCHEMA)


async def test_valid_answer_uses_response_format_and_is_returned(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(text('{"name": "Ada", "age": 36}'))
    reply = await agent.stub.GenerateStructured(_request(await new_session(agent)))
    assert json.loads(reply.data) == {"name": "Ada", "age": 36}
    assert reply.usage.total_tokens > 0 and reply.metadata["attempts"] == "1"
    body = fake.requests[0].body
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == json.loads(SCHEMA)
    assert "JSON Schema" in body["messages"][1]["content"]  # the instruction, for servers without json_schema


async def test_an_invalid_answer_is_repaired(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(text('{"name": "Ada", "age": -1}'), text('```json\n{"name": "Ada", "age": 36}\n```'))
    reply = await agent.stub.GenerateStructured(_request(await new_session(agent)))
    assert json.loads(reply.data) == {"name": "Ada", "age": 36}
    assert reply.metadata["attempts"] == "2"
    repair = fake.requests[1].messages[-1]
    assert repair["role"] == "user" and "age" in repair["content"] and "minimum" in repair["content"]


async def test_failing_every_repair_reports_the_validation_error(agent: LiveServer, fake: FakeLLM) -> None:
    fake.fallback = text("not json at all")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.GenerateStructured(_request(await new_session(agent)))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "did not validate" in err.value.details() and "not valid JSON" in err.value.details()
    assert len(fake.requests) == 3


async def test_servers_without_json_schema_support_fall_back_to_the_instruction(
    agent: LiveServer, fake: FakeLLM
) -> None:
    fake.script(error(400, "response_format json_schema is not supported"), text('{"name": "Bo", "age": 2}'))
    reply = await agent.stub.GenerateStructured(_request(await new_session(agent)))
    assert json.loads(reply.data)["name"] == "Bo"
    assert "response_format" not in fake.requests[-1].body


@pytest.mark.parametrize("schema", ["{not json", "[1, 2]", '{"type": "no-such-type"}'])
async def test_an_invalid_schema_is_invalid_argument(agent: LiveServer, schema: str) -> None:
    request = pb.GenerateStructuredRequest(
        session_id=await new_session(agent), messages=[user("x")], schema=schema
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.GenerateStructured(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "schema" in err.value.details()


async def test_stream_sends_the_json_as_it_arrives_then_the_validated_whole(
    agent: LiveServer, fake: FakeLLM
) -> None:
    # Its deltas come apart (deltas that come together go on as one chunk).
    fake.script(replace(text('{"name": "Grace", "age": 85}'), chunk_delay=0.02))
    chunks = [c async for c in agent.stub.StreamGenerateStructured(_request(await new_session(agent)))]
    assert len(chunks) > 2 and not any(c.done for c in chunks[:-1])
    assert "".join(c.data for c in chunks[:-1]) == '{"name": "Grace", "age": 85}'
    assert chunks[-1].done and json.loads(chunks[-1].data) == {"name": "Grace", "age": 85}
