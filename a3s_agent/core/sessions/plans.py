"""Sessions' plans (CreatePlan, GetPlan): kept in the session's settings, so in its store row, where
a restart and every replica find them. A session has one plan, its latest; keeping one makes its
steps the session's todo list (one todo item per step, of the step's id) in the same transaction,
and a step's status is then what the todo list says of its item (the `todo` tool, SetTodos)."""

from __future__ import annotations

from dataclasses import replace

from ...base.planning import Plan, status_of_todo, step_todo
from ...tools.todo import checked_todos
from ..store.events import EventType, event_entry
from .manager import SessionManager
from .todos import todos_updated

PLAN_CREATED = "plan_created"


class Plans:
    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions

    async def keep(self, session_id: str, plan: Plan) -> Plan:
        """Make `plan` the session's (replacing its plan and its todo list); the plan."""
        todos = checked_todos([step_todo(step) for step in plan.steps])
        created = event_entry(
            EventType.INFO,
            session_id,
            f"plan created: {len(plan.steps)} steps",
            {"kind": PLAN_CREATED, "goal": plan.goal, "steps": len(plan.steps)},
        )
        await self._sessions.refresh(session_id)
        await self._sessions.update_settings(
            session_id,
            lambda s: replace(s, plan=plan, todos=todos),
            log=[created, todos_updated(session_id, todos)],
        )
        return plan

    async def get(self, session_id: str) -> Plan | None:
        """The session's plan, each step's status as its todo item now has it (a step whose item
        is gone keeps the status it had); None when it has none. NotFound for an unknown session."""
        await self._sessions.refresh(session_id)
        settings = self._sessions.get(session_id).settings
        if settings.plan is None:
            return None
        todos = {item.id: item for item in settings.todos}
        steps = tuple(
            replace(step, status=status_of_todo(step, todos[step.id])) if step.id in todos else step
            for step in settings.plan.steps
        )
        return replace(settings.plan, steps=steps)
