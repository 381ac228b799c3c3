"""The later dialect's planning group over HTTP, as faces/grpc/later_planning.py serves it over
gRPC (faces/later_service.py builds both faces' plans and goals)."""

from __future__ import annotations

from ...app import Application
from ...base.errors import InvalidArgument
from ...base.planning import Goal
from .. import later_service as groups
from .convert import Given, Plain
from .rpc_table import Handlers

HANDLERS = Handlers()


@HANDLERS.rpc("CreatePlan")
async def _create_plan(app: Application, request: Given) -> Plain:
    context = request["context"] or ""
    plan = await app.planning.create_plan(request["session_id"], request["prompt"], context)
    return {"plan": groups.execution_plan(plan)}


@HANDLERS.rpc("GetPlan")
async def _get_plan(app: Application, request: Given) -> Plain:
    plan = await app.planning.plan(request["session_id"], request["plan_id"])
    return {"plan": groups.execution_plan(plan)}


@HANDLERS.rpc("ExtractGoal")
async def _extract_goal(app: Application, request: Given) -> Plain:
    goal = await app.planning.extract_goal(request["session_id"], request["prompt"])
    return {"goal": groups.agent_goal(goal)}


@HANDLERS.rpc("CheckGoalAchievement")
async def _check_goal(app: Application, request: Given) -> Plain:
    given = request["goal"]
    if given is None:
        raise InvalidArgument("goal is required")
    goal = Goal(description=given["description"], success_criteria=tuple(given["success_criteria"]))
    done = await app.planning.check_goal(request["session_id"], goal, request["current_state"])
    return {
        "achieved": done.achieved,
        "progress": done.progress,
        "remaining_criteria": done.remaining_criteria,
    }
