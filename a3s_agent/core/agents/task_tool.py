"""The `task` tool: how a model starts a subagent. Its description lists the agents the session
may start and when to use each, within a byte bound (the tool schemas a model is sent have a
budget: tests/test_tool_schemas.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field

from ...tools.registry import RuleSubject, Tool, ToolContext, ToolOutput
from .catalog import Agents

TASK = "task"
MAX_LISTING_BYTES = 1600
"""What the agents' lines of the description may take; the agents beyond it are named only."""
MAX_AGENT_LINE = 240
MAX_NAMES = 600
"""What the names of the agents beyond the listing may take; those beyond are counted only."""

_ABOUT = (
    "Start a subagent: a fresh agent with its own context does one task and returns only its final"
    " answer; its tool calls and what it reads never reach your context. Use it for searching and"
    " reading that would fill your context, and for independent pieces of work: several task calls"
    " in one turn run at once. The subagent sees nothing of this conversation: give it all it needs"
    " in prompt."
)


class TaskArguments(BaseModel):
    agent: str = Field(description="The agent to run: one of those listed.", min_length=1, max_length=64)
    description: str = Field(description="The task in a few words, shown to the user.", max_length=200)
    prompt: str = Field(
        description="The task itself, with everything the agent needs to know.",
        min_length=1,
        max_length=100_000,
    )


def describe(agents: Agents) -> str:
    """What the model reads of the tool: when to use it, then each agent and when to use it, as
    far as MAX_LISTING_BYTES go; the others named, then counted."""
    lines: list[str] = []
    size = 0
    left: list[str] = []
    for agent in agents.available.values():
        line = f"- {agent.name}: {agent.description}"
        if len(line) > MAX_AGENT_LINE:
            line = line[: MAX_AGENT_LINE - 3].rstrip() + "..."
        if left or size + len(line.encode()) > MAX_LISTING_BYTES:
            left.append(agent.name)
            continue
        lines.append(line)
        size += len(line.encode()) + 1
    if left:
        named = [name for count, name in enumerate(left) if len(", ".join(left[: count + 1])) <= MAX_NAMES]
        rest = len(left) - len(named)
        more = f" and {rest} more (a task naming an unknown agent is told them all)" if rest else ""
        lines.append(f"- also: {', '.join(named)}{more}")
    return "\n".join([_ABOUT, "Agents:", *lines])


def task_tool(description: str, run: Callable[[TaskArguments, ToolContext], Awaitable[ToolOutput]]) -> Tool:
    """The tool described by `description` (`describe`'s), started by `run`. It is in the query
    lane: a turn's task calls run at once (runtime/subagents.py bounds how many); a permission rule `task(<agent>)` is
    about the agent it names."""

    async def start(args: TaskArguments, ctx: ToolContext) -> ToolOutput:
        return await run(args, ctx)

    return Tool(
        TASK,
        description,
        TaskArguments,
        start,
        "interaction",
        "query",
        truncation_hint="the whole answer is in the subagent's session (GetMessages)",
        rule_subject=RuleSubject("agent", "text"),
    )
