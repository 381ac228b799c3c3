"""The plan tool: the model keeps a list of steps, which the editor shows as the session's plan
(`session/update` plan entries). It exists in `a3s-agent acp` only, where someone sees the plan.

The list is the session's todo list too (what GetTodos answers, and the steps of a plan CreatePlan
made: docs/agent/planning.md): each entry keeps the id of the item at its place, so a plan's
steps follow the statuses the model sets here. Loading a session shows the list as it is now."""

from __future__ import annotations

from typing import Literal

from acp.schema import AgentPlanUpdate, PlanEntry
from pydantic import BaseModel, ConfigDict, Field

from ...app.tool_kit import ToolContext, tool
from ...app.types import ToolOutput
from ...base.jsontext import model_json
from ...base.models import Todo

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
    if ctx.todos is not None and ctx.session_id:
        kept = await ctx.todos.get(ctx.session_id)
        await ctx.todos.set(ctx.session_id, _todos(args.entries, [item.id for item in kept]))
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


def todo_plan(todos: list[Todo]) -> AgentPlanUpdate:
    """The session's todo list as the plan the editor shows (ACP has no status for a cancelled
    item: those are left out)."""
    entries = [
        PlanEntry(content=t.content, status=t.status, priority=t.priority)
        for t in todos
        if t.status != "cancelled"
    ]
    return AgentPlanUpdate(session_update="plan", entries=entries)


def _todos(entries: list[Step], ids: list[str]) -> list[Todo]:
    """The entries as todo items: each with the id of the item at its place (a new place: its
    number, made distinct)."""
    taken = set(ids[: len(entries)])
    todos = []
    for place, step in enumerate(entries):
        if place < len(ids):
            item_id = ids[place]
        else:
            item_id = str(place + 1)
            while item_id in taken:
                item_id += "+"
            taken.add(item_id)
        todos.append(Todo(id=item_id, content=step.content, status=step.status, priority=step.priority))
    return todos
