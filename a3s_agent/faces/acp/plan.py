"""The plan tool: the model keeps a list of steps, which the editor shows as the session's plan
(`session/update` plan entries). It exists in `a3s-agent acp` only, where someone sees the plan."""

from __future__ import annotations

from typing import Literal

from acp.schema import AgentPlanUpdate, PlanEntry
from pydantic import BaseModel, ConfigDict, Field

from ...app.tool_kit import ToolContext, tool
from ...app.types import ToolOutput
from ...base.jsontext import model_json

PLAN_TOOL = "update_plan"


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1, max_length=1000, description="What the step does, in a few words.")
    status: Literal["pending", "in_progress", "completed"] = Field("pending", description="Where it stands.")
    priority: Literal["high", "medium", "low"] = Field("medium", description="How much it matters.")


class PlanArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entries: list[Step] = Field(max_length=100, description="Every step of the plan, in order.")


@tool(PLAN_TOOL, family="interaction", lane="query")
async def update_plan(args: PlanArgs, ctx: ToolContext) -> ToolOutput:
    """Show the user your plan for a task of several steps, and keep it current.

    Send the whole list every time (it replaces the previous one): when you start, when a step
    starts (status "in_progress", one at a time) and when one is done ("completed"). Skip it for
    a task of one or two steps. Example: {"entries": [{"content": "Find the failing test",
    "status": "completed"}, {"content": "Fix the parser", "status": "in_progress"}]}
    """
    done = sum(step.status == "completed" for step in args.entries)
    return ToolOutput(output=f"plan updated: {done} of {len(args.entries)} steps done")


def plan_update(arguments: str) -> AgentPlanUpdate | None:
    """The plan a call of the tool set (its arguments as the model wrote them), or None if invalid."""
    try:
        plan = PlanArgs.model_validate(model_json(arguments or "{}"))
    except ValueError:  # the JSON, or the plan in it (pydantic's ValidationError is one)
        return None
    entries = [PlanEntry(content=s.content, status=s.status, priority=s.priority) for s in plan.entries]
    return AgentPlanUpdate(session_update="plan", entries=entries)
