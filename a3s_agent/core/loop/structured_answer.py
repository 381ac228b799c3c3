"""One question to the session's model answered as JSON that validates against a schema: no agent
loop, no tools, nothing added to the session's history (the planning group's calls). Billed to the
session as any model turn, under its token budget. An answer that does not validate, or that
`check` finds wrong, is sent back to the model to be corrected, at most MAX_REPAIRS times."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...base.errors import FailedPrecondition, ResourceExhausted
from ...base.jsontext import model_json
from ...llm.provider import CompletionRequest, TextDelta, TurnEnd
from ..sessions.manager import SessionManager
from .budget import budget_spent
from .host import AgentHost
from .memory_summary import required_model
from .structured import MAX_REPAIRS, schema_instruction, validated_json, validation_problem

Check = Callable[[Any], str | None]
"""What is wrong with a value that validates against the schema (None: nothing)."""


async def structured_answer(
    host: AgentHost,
    sessions: SessionManager,
    session_id: str,
    question: str,
    material: str,
    schema: dict[str, Any],
    what: str,
    check: Check = lambda _: None,
    max_tokens: int = 4_000,
) -> Any:
    """The model's answer to `question` about `material`, as the JSON value. FailedPrecondition
    without a model (saying how to configure one) or when no answer validates after the repairs
    (naming `what` and the last problem); ResourceExhausted when the session's budget is spent."""
    llm = required_model(host, sessions.get(session_id))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"{question}\n\n{schema_instruction(schema).content}"},
        {"role": "user", "content": material},
    ]
    problem = ""
    for _ in range(MAX_REPAIRS + 1):
        session = sessions.get(session_id)
        spent = budget_spent(session, host.token_budget_for(session))
        if spent is not None:
            raise ResourceExhausted(spent.message)
        request = CompletionRequest(
            model=llm.model,
            messages=messages,
            max_tokens=max_tokens,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": what.replace(" ", "_"), "schema": schema},
            },
            session_id=session_id,
        )
        pieces: list[str] = []
        async for event in host.provider_for(llm).stream(request):
            if isinstance(event, TextDelta):
                pieces.append(event.text)
            elif isinstance(event, TurnEnd) and event.usage is not None:  # billed as any model turn
                await sessions.append_messages(session_id, [], usage=event.usage)
        answer = "".join(pieces)
        data = validated_json(answer, schema)
        value = model_json(data) if data is not None else None
        problem = validation_problem(answer, schema) if data is None else check(value) or ""
        if not problem:
            return value
        messages += [
            {"role": "assistant", "content": answer},
            {
                "role": "user",
                "content": f"Your answer is not right: {problem}. Reply again with only the corrected JSON.",
            },
        ]
    raise FailedPrecondition(f"the model's {what} was not valid after {MAX_REPAIRS + 1} attempts: {problem}")
