"""Structured generation: the agent's answer as JSON that validates against a caller's JSON Schema."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from ...base.errors import FailedPrecondition, ResourceExhausted
from ...base.jsontext import model_json, parse_json
from ...base.models import Message, Usage
from ...tools.registry import check_json_schema
from .agent import Agent, AgentEvent, DoneEvent, GenerateOptions

MAX_REPAIRS = 2
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass
class StructuredDone:
    """The validated JSON text, with usage summed over every attempt."""

    data: str
    usage: Usage
    attempts: int
    model: str


def parse_schema(text: str) -> dict[str, Any]:
    """The caller's schema, or InvalidArgument saying what is wrong with it."""
    return check_json_schema(parse_json(text, "schema"), "schema", for_arguments=False)


def schema_instruction(schema: dict[str, Any]) -> Message:
    return Message(
        role="system",
        content="Answer with a single JSON value and nothing else (no prose, no code fences). "
        f"It must validate against this JSON Schema:\n{json.dumps(schema)}",
    )


def validated_json(text: str, schema: dict[str, Any]) -> str | None:
    """The JSON text when it validates, else None; a code fence around it is tolerated."""
    import jsonschema

    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    try:
        value = model_json(stripped)
    except ValueError:
        return None
    if next(jsonschema.validators.validator_for(schema)(schema).iter_errors(value), None) is not None:
        return None
    return stripped


def validation_problem(text: str, schema: dict[str, Any]) -> str:
    import jsonschema

    try:
        value = model_json(_FENCE.sub(r"\1", text.strip()))
    except ValueError as exc:
        return f"it is not valid JSON ({exc})"
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(schema)(schema).iter_errors(value)
    )
    path = "/".join(str(p) for p in error.absolute_path) if error else ""
    return f"at '{path or '(root)'}': {error.message}" if error else "unknown"


async def run_structured(
    agent: Agent, session_id: str, messages: list[Message], options: GenerateOptions, schema_text: str
) -> AsyncIterator[AgentEvent | StructuredDone]:
    """Generate, validate, and ask the model to repair (bounded) until the answer validates."""
    schema = parse_schema(schema_text)
    options = replace(
        options,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "structured_output", "schema": schema},
        },
    )
    usage = Usage()
    outgoing = [schema_instruction(schema), *messages]
    problem = ""
    for attempt in range(1, MAX_REPAIRS + 2):
        generation = None
        async for event in agent.run(session_id, outgoing, options):
            if isinstance(event, DoneEvent):
                generation = event.generation
            else:
                yield event
        assert generation is not None
        usage += generation.usage
        if generation.budget_spent is not None:  # no answer came, nor will another attempt get one
            raise ResourceExhausted(generation.budget_spent.message)
        data = validated_json(generation.message.content, schema)
        if data is not None:
            yield StructuredDone(data=data, usage=usage, attempts=attempt, model=generation.model)
            return
        problem = validation_problem(generation.message.content, schema)
        outgoing = [
            Message(
                role="user",
                content=f"Your answer does not validate against the schema: {problem}. "
                "Reply again with only the corrected JSON.",
            )
        ]
    raise FailedPrecondition(
        f"the model's answer did not validate against the schema after {MAX_REPAIRS + 1} attempts: {problem}"
    )
