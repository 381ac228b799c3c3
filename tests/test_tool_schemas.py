"""The tool schemas a model is sent (flat, small, in the subset every provider takes) and the full
ones clients list, through the real server against the fake LLMs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_anthropic import text as claude_text
from a3s_agent.testing.fake_llm import FakeLLM, text
from a3s_agent.tools.builtin import builtin_tools
from a3s_agent.tools.compact_schema import model_schema

from .conftest import LiveServer, agent_settings, new_session, running, user

BUDGET = 16_384
"""Bytes of the default `tools` array as sent to the model (compact JSON)."""
REFUSED = {
    "$ref",
    "$defs",
    "definitions",
    "title",
    "additionalProperties",
    "const",
    "oneOf",
    "allOf",
    "format",
}
"""Keywords some provider refuses in a function declaration (Gemini refuses the whole request)."""


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def keywords(schema: Any) -> Iterator[tuple[str, Any]]:
    """Every (keyword, value) of a schema at any depth; property names are names, not keywords."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            yield key, value
            children = value.values() if key == "properties" and isinstance(value, dict) else [value]
            for child in children:
                yield from keywords(child)
    elif isinstance(schema, list):
        for item in schema:
            yield from keywords(item)


async def test_the_default_tools_fit_the_budget_flat_as_sent(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(text("ok"))
    session_id = await new_session(agent)
    await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("hi")]))

    sent = fake.requests[0].tools
    assert sent is not None
    listed = (await agent.stub.ListTools(pb.ListToolsRequest())).tools
    assert [t["function"]["name"] for t in sent] == [t.name for t in listed]  # every default tool counted
    assert len(compact(sent)) <= BUDGET, len(compact(sent))
    for entry in sent:
        parameters = entry["function"]["parameters"]
        assert parameters["type"] == "object" and isinstance(parameters["properties"], dict)
        found = {key for key, _ in keywords(parameters)}
        assert not found & REFUSED, (entry["function"]["name"], found & REFUSED)
        assert all(value is not None for key, value in keywords(parameters) if key == "default")
    by_name = {t["function"]["name"]: t["function"] for t in sent}
    read_file = by_name["read_file"]["parameters"]
    assert read_file["required"] == ["path"]
    assert read_file["properties"]["encoding"]["enum"] == ["utf-8", "ascii", "base64"]
    # todo's items were a reference to $defs: inlined, required and enums kept.
    item = by_name["todo"]["parameters"]["properties"]["todos"]["items"]
    assert item["required"] == ["id", "content"] and "in_progress" in item["properties"]["status"]["enum"]
    # An optional parameter is its type alone (no anyOf with null, no default null).
    assert by_name["grep"]["parameters"]["properties"]["glob"] == {
        "type": "string",
        "description": by_name["grep"]["parameters"]["properties"]["glob"]["description"],
    }
    # Each description says when to reach for another tool instead.
    assert "edit_file" in by_name["write_file"]["description"]
    assert (
        "grep" in by_name["search_files"]["description"] and "search_files" in by_name["grep"]["description"]
    )


async def test_list_tools_keeps_the_full_schema(live: LiveServer) -> None:
    listed = {t.name: t for t in (await live.stub.ListTools(pb.ListToolsRequest())).tools}
    for tool in builtin_tools():
        if tool.name in listed:
            full = json.loads(listed[tool.name].parameters_schema)
            assert full == tool.parameters_schema and listed[tool.name].description == tool.description
    todo = json.loads(listed["todo"].parameters_schema)
    assert todo["properties"]["todos"]["items"] == {"$ref": "#/$defs/TodoItem"}
    assert todo["$defs"]["TodoItem"]["additionalProperties"] is False
    max_depth = json.loads(listed["list_files"].parameters_schema)["properties"]["max_depth"]
    assert max_depth["default"] is None and {"type": "null"} in max_depth["anyOf"]


async def test_the_messages_api_gets_the_same_flat_schemas(workspace: Path, tmp_path: Path) -> None:
    async with (
        FakeAnthropic(api_key="sk-ant-test") as claude,
        running(agent_settings(workspace, tmp_path / "data")) as live,
    ):
        llm = pb.LLMConfig(
            provider="anthropic", model="claude-sonnet-4-5", base_url=claude.base_url, api_key="sk-ant-test"
        )
        await live.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))
        claude.script(claude_text("ok"))
        session_id = await new_session(live)
        await live.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("hi")]))

    sent = claude.requests[0].body["tools"]
    expected = {t.name: t for t in builtin_tools() if not t.text_protocol_only}
    assert [t["name"] for t in sent] == [*expected, "task"]  # and the subagents' (runtime/subagents.py)
    for entry in sent[:-1]:
        assert entry["input_schema"] == model_schema(expected[entry["name"]].parameters_schema)
        assert entry["description"] == expected[entry["name"]].description
    without_cache_marks = [{k: v for k, v in t.items() if k != "cache_control"} for t in sent]
    assert len(compact(without_cache_marks)) <= BUDGET


# --- schemas from MCP servers, clients and skills ---------------------------------------------


def test_references_are_inlined_and_siblings_kept() -> None:
    schema = {
        "type": "object",
        "$defs": {"Point": {"type": "object", "title": "Point", "properties": {"x": {"type": "number"}}}},
        "properties": {"at": {"$ref": "#/$defs/Point", "description": "Where."}},
        "required": ["at"],
        "additionalProperties": False,
    }
    assert model_schema(schema) == {
        "type": "object",
        "properties": {
            "at": {"type": "object", "properties": {"x": {"type": "number"}}, "description": "Where."}
        },
        "required": ["at"],
    }


def test_combinators_nulls_and_consts_become_the_portable_subset() -> None:
    schema = {
        "type": "object",
        "properties": {
            "mode": {"oneOf": [{"const": "fast"}, {"const": "slow"}]},
            "name": {"type": ["string", "null"], "format": "email"},
            "size": {"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "null"}], "default": None},
            "both": {"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
            "either": {"type": ["string", "integer"]},
        },
    }  # fmt: skip
    assert model_schema(schema)["properties"] == {
        "mode": {"anyOf": [{"enum": ["fast"]}, {"enum": ["slow"]}]},
        "name": {"type": "string"},
        "size": {"type": "integer"},
        "both": {"properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a", "b"]},
        "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    }


def test_a_recursive_schema_ends() -> None:
    schema = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/Node"}},
        "$defs": {"Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
    }  # fmt: skip
    flat = model_schema(schema)
    depth, node = 0, flat["properties"]["tree"]
    while node:
        depth, node = depth + 1, node.get("properties", {}).get("children", {}).get("items", {})
    assert 1 < depth <= 10
    assert "$ref" not in json.dumps(flat)


def test_references_that_fan_out_are_bounded() -> None:
    """Ten references to the next definition, twelve deep: 10**12 nodes if all were inlined."""
    defs = {
        f"D{level}": {
            "type": "object",
            "properties": {f"p{i}": {"$ref": f"#/$defs/D{level + 1}"} for i in range(10)},
        }
        for level in range(12)
    }
    defs["D12"] = {"type": "string"}
    flat = model_schema({"type": "object", "properties": {"root": {"$ref": "#/$defs/D0"}}, "$defs": defs})
    assert len(compact(flat)) < 2_000_000


@pytest.mark.parametrize(
    "ref", ["#/$defs/Missing", "http://example.com/schema.json", "#anchor", "#/properties/~1x", "#/$defs/a/0"]
)
def test_references_that_lead_nowhere_allow_anything(ref: str) -> None:
    schema = {"type": "object", "$defs": {"a": [1]}, "properties": {"x": {"$ref": ref, "description": "X."}}}
    assert model_schema(schema)["properties"]["x"] == {"description": "X."}


def test_what_is_no_schema_does_not_break_it() -> None:
    schema = {
        "properties": {"a": True, "b": {"anyOf": "nope", "items": 3, "properties": []}},
        "required": ["a"],
    }
    assert model_schema(schema) == {
        "type": "object",
        "properties": {"a": {}, "b": {"items": {}}},
        "required": ["a"],
    }
