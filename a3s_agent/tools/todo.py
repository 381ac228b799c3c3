"""todo: the session's todo list, which the model keeps while it works (as OpenCode's todowrite and
Claude Code's TodoWrite): it sends the whole list, which replaces the last one, and gets it back.

`checked_todos` is the one check of a list, wherever it comes from (this tool, SetTodos): the
session keeps it in its stored settings (core/sessions/todos.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..base.errors import InvalidArgument
from ..base.models import Todo
from .registry import Tool, ToolContext, ToolFailure, ToolOutput, tool

Status = Literal["pending", "in_progress", "completed", "cancelled"]
Priority = Literal["high", "medium", "low"]
STATUSES: tuple[str, ...] = get_args(Status)
PRIORITIES: tuple[str, ...] = get_args(Priority)
MAX_TODOS = 100
MAX_CONTENT_CHARS = 2000
MAX_ID_CHARS = 200


def checked_todos(todos: Sequence[Todo]) -> list[Todo]:
    """The list as given, or InvalidArgument naming the first item and field at fault."""
    if len(todos) > MAX_TODOS:
        raise InvalidArgument(f"todos has {len(todos)} items; at most {MAX_TODOS}")
    seen: set[str] = set()
    for index, item in enumerate(todos):
        where = f"todos[{index}]"
        for name in ("id", "content", "status", "priority"):
            if not isinstance(getattr(item, name), str):
                raise InvalidArgument(f"{where}.{name} must be a string")
        if not item.id.strip():
            raise InvalidArgument(f"{where}.id is empty")
        if len(item.id) > MAX_ID_CHARS:
            raise InvalidArgument(f"{where}.id has {len(item.id)} characters; at most {MAX_ID_CHARS}")
        where = f"{where} (id {item.id!r})"
        if item.id in seen:
            raise InvalidArgument(f"{where}.id is a duplicate: ids must be distinct")
        seen.add(item.id)
        if not item.content.strip():
            raise InvalidArgument(f"{where}.content is empty")
        if len(item.content) > MAX_CONTENT_CHARS:
            raise InvalidArgument(
                f"{where}.content has {len(item.content)} characters; at most {MAX_CONTENT_CHARS}"
            )
        if item.status not in STATUSES:
            raise InvalidArgument(f"{where}.status {item.status[:40]!r} is not one of {', '.join(STATUSES)}")
        if item.priority not in PRIORITIES:
            raise InvalidArgument(
                f"{where}.priority {item.priority[:40]!r} is not one of {', '.join(PRIORITIES)}"
            )
    return list(todos)


class TodoItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    content: str
    status: Status = "pending"
    priority: Priority = "medium"


class TodoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    todos: list[TodoItem] = Field(default_factory=list)

    @model_validator(mode="after")
    def _checked(self) -> TodoArgs:
        try:
            checked_todos(self.items())
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None
        return self

    def items(self) -> list[Todo]:
        return [Todo(**item.model_dump()) for item in self.todos]


@tool("todo", family="interaction", lane="query")
async def todo(args: TodoArgs, ctx: ToolContext) -> ToolOutput:
    """Your todo list for a task of several steps. Send the whole list to replace it, one item
    in_progress at a time, marking items completed as you finish them; without todos, read it."""
    if ctx.todos is None or not ctx.session_id:
        raise ToolFailure("the todo list belongs to a session: call todo within one")
    if "todos" in args.model_fields_set:
        todos = await ctx.todos.set(ctx.session_id, args.items())
    else:
        todos = await ctx.todos.get(ctx.session_id)
    done = sum(item.status == "completed" for item in todos)
    return ToolOutput(
        output=json.dumps({"todos": [item.to_json() for item in todos]}),
        metadata={"count": len(todos), "completed": done},
    )


TOOLS: list[Tool] = [todo]
