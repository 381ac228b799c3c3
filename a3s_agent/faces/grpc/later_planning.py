"""The planning group of the later dialect (a3s-string-dialect.md 4.5): each RPC a conversion of
code_agent_later_pb2's messages around one call of `app.planning` (app/planning.py says what they
do). Statuses and complexities are the proto's enums; a goal's progress is 0 to 1."""

from __future__ import annotations

from typing import Any

from ...app import Application
from ...base.errors import InvalidArgument
from ...base.planning import Goal
from ...proto import code_agent_later_pb2 as later
from .. import later_service as groups
from .errors import rpc


class LaterPlanningService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def CreatePlan(self, request: later.CreatePlanRequest, context: Any) -> later.CreatePlanResponse:
        plan = await self.app.planning.create_plan(request.session_id, request.prompt, request.context)
        return later.CreatePlanResponse(plan=groups.execution_plan(plan))

    @rpc
    async def GetPlan(self, request: later.GetPlanRequest, context: Any) -> later.GetPlanResponse:
        plan = await self.app.planning.plan(request.session_id, request.plan_id)
        return later.GetPlanResponse(plan=groups.execution_plan(plan))

    @rpc
    async def ExtractGoal(self, request: later.ExtractGoalRequest, context: Any) -> later.ExtractGoalResponse:
        goal = await self.app.planning.extract_goal(request.session_id, request.prompt)
        return later.ExtractGoalResponse(goal=groups.agent_goal(goal))

    @rpc
    async def CheckGoalAchievement(
        self, request: later.CheckGoalAchievementRequest, context: Any
    ) -> later.CheckGoalAchievementResponse:
        if not request.HasField("goal"):
            raise InvalidArgument("goal is required")
        goal = Goal(
            description=request.goal.description, success_criteria=tuple(request.goal.success_criteria)
        )
        done = await self.app.planning.check_goal(request.session_id, goal, request.current_state)
        return later.CheckGoalAchievementResponse(
            achieved=done.achieved, progress=done.progress, remaining_criteria=done.remaining_criteria
        )
