"""Plans and goals (A3S's planning group): the session's model draws up a plan, kept as the
session's (core/sessions/plans.py: its steps are the todo list), states a request's goal, and
judges how far the session's work has come towards one, from what the session did (work_facts.py)
as much as from what the client says. The domain types are base/planning.py's.

Each is one model call outside the conversation: nothing is added to the session's history.
Without a model: FailedPrecondition saying how to configure one, as Generate; an answer that does
not validate, after the repairs: FailedPrecondition naming the problem."""

from __future__ import annotations

from dataclasses import replace

from ..base.errors import InvalidArgument, NotFound
from ..base.planning import Goal, GoalCheck, Plan
from ..core.loop.planning import check_goal, create_plan, extract_goal
from ..core.loop.work_facts import work_facts
from ..core.sessions.plans import Plans
from ..core.store.events import now_ms
from ..core.store.session import Session
from ..runtime import Runtime

MAX_INPUT_CHARS = 60_000
"""The most characters of each text a client gives (prompt, context, current_state)."""
MAX_GOAL_CHARS = 2_000
"""Of a goal's description, and of each of its criteria."""
MAX_GOAL_CRITERIA = 50
CURRENT_PLAN_IDS = ("", "current", "latest")
"""The plan ids GetPlan takes: a session keeps one plan, and no message gives a plan an id."""


class Planning:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._plans = Plans(runtime.sessions)

    async def create_plan(self, session_id: str, prompt: str, context: str) -> Plan:
        """The model's plan for `prompt`, made the session's plan (its steps the todo list)."""
        _checked_text(prompt, "prompt", required=True)
        _checked_text(context, "context")
        session = await self._session(session_id)
        tools = sorted({tool.name for tool in self._rt.tools_for(session)})
        plan = await create_plan(self._rt, self._rt.sessions, session_id, prompt, context, tools)
        return await self._plans.keep(session_id, replace(plan, created_at=now_ms()))

    async def plan(self, session_id: str, plan_id: str) -> Plan:
        """The session's plan, its steps' statuses as the todo list has them now; NotFound naming
        the session when it has none (or the plan id, when it names no plan it has)."""
        await self._session(session_id)
        if plan_id not in CURRENT_PLAN_IDS:
            raise _no_plan(session_id, f"no plan {plan_id[:64]!r}")
        plan = await self._plans.get(session_id)
        if plan is None:
            raise _no_plan(session_id, "no plan")
        return plan

    async def extract_goal(self, session_id: str, prompt: str) -> Goal:
        _checked_text(prompt, "prompt", required=True)
        await self._session(session_id)
        goal = await extract_goal(self._rt, self._rt.sessions, session_id, prompt)
        return replace(goal, created_at=now_ms())

    async def check_goal(self, session_id: str, goal: Goal, current_state: str) -> GoalCheck:
        """The model's judgement of the session's work against `goal`: the client's
        `current_state`, and the session's plan, todo list, changed files and history."""
        _checked_text(goal.description, "goal.description", required=True, limit=MAX_GOAL_CHARS)
        if len(goal.success_criteria) > MAX_GOAL_CRITERIA:
            raise InvalidArgument(
                f"goal.success_criteria has {len(goal.success_criteria)} items; at most {MAX_GOAL_CRITERIA}"
            )
        for index, criterion in enumerate(goal.success_criteria):
            _checked_text(criterion, f"goal.success_criteria[{index}]", required=True, limit=MAX_GOAL_CHARS)
        _checked_text(current_state, "current_state")
        session = await self._session(session_id)
        facts = work_facts(
            await self._plans.get(session_id),
            session.settings.todos,
            await self._rt.sessions.history(session_id),
            self._rt.tool_context(session).workspace,
            frozenset(
                t.name for t in self._rt.registry.registered() if t.family == "file" and t.lane == "execute"
            ),
        )
        return await check_goal(self._rt, self._rt.sessions, session_id, goal, current_state, facts)

    async def _session(self, session_id: str) -> Session:
        await self._rt.sessions.refresh(session_id)
        return self._rt.sessions.get(session_id)


def _checked_text(text: str, field: str, required: bool = False, limit: int = MAX_INPUT_CHARS) -> None:
    if required and not text.strip():
        raise InvalidArgument(f"{field} is required")
    if len(text) > limit:
        raise InvalidArgument(f"{field} has {len(text)} characters; at most {limit}")


def _no_plan(session_id: str, what: str) -> NotFound:
    return NotFound(
        f"session {session_id} has {what}: a session keeps one plan, its latest CreatePlan's"
        " (ask GetPlan with an empty plan_id)"
    )
