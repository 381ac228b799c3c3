"""ask_user: a question for the person behind the session.

Inside a generation the question becomes an external task (command_type `ask_user`) that the
host answers with CompleteExternalTask. Called directly (ExecuteTool) there is no run to wait in,
so the call says that nobody can answer."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .registry import RuleSubject, Tool, ToolContext, ToolFailure, ToolOutput, tool

NOBODY_CAN_ANSWER = (
    "nobody can answer: ask_user is answered by the host through external tasks during a generation"
)


class AskUserArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=4000)
    options: list[str] = Field(default_factory=list, max_length=20, description="Choices, if any.")

    @field_validator("question")
    @classmethod
    def _question_has_text(cls, question: str) -> str:
        if not question.strip():
            raise ValueError("the question is blank")
        return question.strip()

    @field_validator("options")
    @classmethod
    def _options_distinct(cls, options: list[str]) -> list[str]:
        cleaned = [option.strip() for option in options]
        if not all(cleaned):
            raise ValueError("an option is blank")
        if len(set(cleaned)) != len(cleaned):
            raise ValueError("options must be distinct")
        return cleaned


@tool(
    "ask_user",
    family="interaction",
    lane="query",
    external=True,
    rule_subject=RuleSubject("question", "text"),
)
async def ask_user(args: AskUserArgs, ctx: ToolContext) -> ToolOutput:
    """Ask the user and wait for the answer: only when you cannot go on without a decision or fact
    only they have. If nobody answers, the call fails: then choose sensibly and say so.
    """
    raise ToolFailure(NOBODY_CAN_ANSWER, question=args.question, options=args.options)


TOOLS: list[Tool] = [ask_user]
