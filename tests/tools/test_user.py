"""ask_user: its arguments are validated, and with no client to answer it fails clearly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry
from a3s_agent.tools.user import TOOLS, ask_user


async def _ask(tmp_path: Path, **args: Any) -> ToolOutput:
    return await ToolRegistry(TOOLS).run("ask_user", json.dumps(args), ToolContext(workspace=tmp_path))


async def test_called_directly_nobody_can_answer(tmp_path: Path) -> None:
    result = await _ask(tmp_path, question="  Drop Python 3.10?  ", options=["yes", " no "])
    assert not result.success
    assert result.error.startswith("nobody can answer")
    assert TOOLS[0].external  # inside a generation the host answers it
    assert result.metadata["question"] == "Drop Python 3.10?"
    assert result.metadata["options"] == ["yes", "no"]


async def test_options_are_optional(tmp_path: Path) -> None:
    result = await _ask(tmp_path, question="Which database should the cache use?")
    assert result.metadata["options"] == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({}, "question: Field required"),
        ({"question": ""}, "question"),
        ({"question": "   "}, "the question is blank"),
        ({"question": "Pick one", "options": ["a", "b", "a"]}, "options must be distinct"),
        ({"question": "Pick one", "options": ["a", " a"]}, "options must be distinct"),
        ({"question": "Pick one", "options": ["a", ""]}, "an option is blank"),
        ({"question": "Pick one", "options": "a,b"}, "options"),
        ({"question": "Pick one", "default": "a"}, "default: Extra inputs are not permitted"),
    ],
)
async def test_invalid_questions_are_rejected(tmp_path: Path, args: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid arguments for ask_user") as raised:
        await _ask(tmp_path, **args)
    assert words in str(raised.value)


def test_schema_tells_the_llm_what_to_send() -> None:
    schema = ask_user.parameters_schema
    assert schema["required"] == ["question"]
    assert schema["properties"]["options"]["items"] == {"type": "string"}
    assert schema["additionalProperties"] is False
    assert ask_user.tags == ["interaction", "query"]
