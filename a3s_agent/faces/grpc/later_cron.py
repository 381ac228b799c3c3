"""A3S's cron group (a3s-string-dialect.md 4.9) in the later dialect's messages: each RPC one call
of `app.cron`. Bad input and unknown ids are statuses (INVALID_ARGUMENT naming the field,
NOT_FOUND); ParseCronSchedule alone answers a schedule it cannot read in its reply (success false
and the reason), its purpose being to tell. RunCronJob's `success` is the firing's."""

from __future__ import annotations

from typing import Any

from ...app import Application
from ...app.cron import (
    AgentConfig,
    CronExecution,
    CronJob,
    ExecutionStatus,
    JobChanges,
    NewJob,
)
from ...base.errors import InvalidArgument
from ...proto import code_agent_later_pb2 as later
from ..later_service import cron_execution, cron_job, job_type
from .errors import rpc


class LaterCronService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def ListCronJobs(
        self, request: later.ListCronJobsRequest, context: Any
    ) -> later.ListCronJobsResponse:
        return later.ListCronJobsResponse(jobs=[_job(job) for job in await self.app.cron.jobs()])

    @rpc
    async def CreateCronJob(
        self, request: later.CreateCronJobRequest, context: Any
    ) -> later.CreateCronJobResponse:
        given = request.agent_config
        new = NewJob(
            name=request.name,
            schedule=request.schedule,
            command=request.command,
            timeout_ms=request.timeout_ms if request.HasField("timeout_ms") else None,
            job_type=job_type(request.job_type),
            agent=AgentConfig(
                given.model, given.api_key, given.workspace, given.system_prompt, given.base_url
            )
            if request.HasField("agent_config")
            else None,
        )
        return later.CreateCronJobResponse(success=True, job=_job(await self.app.cron.create(new)))

    @rpc
    async def GetCronJob(self, request: later.GetCronJobRequest, context: Any) -> later.GetCronJobResponse:
        job = await self.app.cron.get(request.id or None, request.name or None)
        return later.GetCronJobResponse(job=_job(job))

    @rpc
    async def UpdateCronJob(
        self, request: later.UpdateCronJobRequest, context: Any
    ) -> later.UpdateCronJobResponse:
        changes = JobChanges(
            schedule=request.schedule if request.HasField("schedule") else None,
            command=request.command if request.HasField("command") else None,
            timeout_ms=request.timeout_ms if request.HasField("timeout_ms") else None,
        )
        job = await self.app.cron.update(request.id, changes)
        return later.UpdateCronJobResponse(success=True, job=_job(job))

    @rpc
    async def PauseCronJob(
        self, request: later.PauseCronJobRequest, context: Any
    ) -> later.PauseCronJobResponse:
        return later.PauseCronJobResponse(success=True, job=_job(await self.app.cron.pause(request.id)))

    @rpc
    async def ResumeCronJob(
        self, request: later.ResumeCronJobRequest, context: Any
    ) -> later.ResumeCronJobResponse:
        return later.ResumeCronJobResponse(success=True, job=_job(await self.app.cron.resume(request.id)))

    @rpc
    async def DeleteCronJob(
        self, request: later.DeleteCronJobRequest, context: Any
    ) -> later.DeleteCronJobResponse:
        await self.app.cron.delete(request.id)
        return later.DeleteCronJobResponse(success=True)

    @rpc
    async def GetCronHistory(
        self, request: later.GetCronHistoryRequest, context: Any
    ) -> later.GetCronHistoryResponse:
        limit = request.limit if request.HasField("limit") else None
        executions = await self.app.cron.history(request.id, limit)
        return later.GetCronHistoryResponse(executions=[_execution(e) for e in executions])

    @rpc
    async def RunCronJob(self, request: later.RunCronJobRequest, context: Any) -> later.RunCronJobResponse:
        execution = await self.app.cron.run(request.id)
        return later.RunCronJobResponse(
            success=execution.status is ExecutionStatus.SUCCESS,
            execution=_execution(execution),
            error=execution.error,
        )

    @rpc
    async def ParseCronSchedule(
        self, request: later.ParseCronScheduleRequest, context: Any
    ) -> later.ParseCronScheduleResponse:
        try:
            parsed = self.app.cron.parse(request.input)
        except InvalidArgument as exc:
            return later.ParseCronScheduleResponse(success=False, error=str(exc))
        return later.ParseCronScheduleResponse(
            success=True, cron_expression=parsed.expression, description=parsed.description
        )


def _job(job: CronJob) -> later.CronJob:
    return later.CronJob(**cron_job(job))


def _execution(execution: CronExecution) -> later.CronExecution:
    return later.CronExecution(**cron_execution(execution))
