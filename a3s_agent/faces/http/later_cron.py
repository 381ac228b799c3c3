"""The later dialect's scheduled-jobs group over HTTP, as faces/grpc/later_cron.py serves it over
gRPC: bad input and unknown ids are errors (400, 404); ParseCronSchedule alone answers a schedule
it cannot read in its reply."""

from __future__ import annotations

from ...app import Application
from ...app.cron import AgentConfig, ExecutionStatus, JobChanges, NewJob
from ...base.errors import InvalidArgument
from ..later_service import cron_execution, cron_job, job_type
from .convert import Given, Plain
from .rpc_table import Handlers

HANDLERS = Handlers()


@HANDLERS.rpc("ListCronJobs")
async def _list(app: Application, request: Given) -> Plain:
    return {"jobs": [cron_job(job) for job in await app.cron.jobs()]}


@HANDLERS.rpc("CreateCronJob")
async def _create(app: Application, request: Given) -> Plain:
    kind, given = job_type(request["job_type"]), request["agent_config"]
    agent = None
    if given is not None:
        optional = (given[name] or "" for name in ("workspace", "system_prompt", "base_url"))
        agent = AgentConfig(given["model"], given["api_key"], *optional)
    new = NewJob(request["name"], request["schedule"], request["command"], request["timeout_ms"], kind, agent)
    return {"success": True, "job": cron_job(await app.cron.create(new))}


@HANDLERS.rpc("GetCronJob")
async def _get(app: Application, request: Given) -> Plain:
    return {"job": cron_job(await app.cron.get(request["id"] or None, request["name"] or None))}


@HANDLERS.rpc("UpdateCronJob")
async def _update(app: Application, request: Given) -> Plain:
    changes = JobChanges(request["schedule"], request["command"], request["timeout_ms"])
    return {"success": True, "job": cron_job(await app.cron.update(request["id"], changes))}


@HANDLERS.rpc("PauseCronJob")
async def _pause(app: Application, request: Given) -> Plain:
    return {"success": True, "job": cron_job(await app.cron.pause(request["id"]))}


@HANDLERS.rpc("ResumeCronJob")
async def _resume(app: Application, request: Given) -> Plain:
    return {"success": True, "job": cron_job(await app.cron.resume(request["id"]))}


@HANDLERS.rpc("DeleteCronJob")
async def _delete(app: Application, request: Given) -> Plain:
    await app.cron.delete(request["id"])
    return {"success": True}


@HANDLERS.rpc("GetCronHistory")
async def _history(app: Application, request: Given) -> Plain:
    executions = await app.cron.history(request["id"], request["limit"])
    return {"executions": [cron_execution(e) for e in executions]}


@HANDLERS.rpc("RunCronJob")
async def _run(app: Application, request: Given) -> Plain:
    execution = await app.cron.run(request["id"])
    return {
        "success": execution.status is ExecutionStatus.SUCCESS,
        "execution": cron_execution(execution),
        "error": execution.error,
    }


@HANDLERS.rpc("ParseCronSchedule")
async def _parse(app: Application, request: Given) -> Plain:
    try:
        parsed = app.cron.parse(request["input"])
    except InvalidArgument as exc:
        return {"success": False, "error": str(exc)}
    return {"success": True, "cron_expression": parsed.expression, "description": parsed.description}
