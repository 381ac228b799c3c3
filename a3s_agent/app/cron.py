"""Scheduled jobs (A3S's cron group): jobs kept in the store that fire a shell command or an agent
prompt on a cron schedule (runtime/cron/), each in a session of its own, `cron-<job id>`.

Off unless the operator turned scheduling on (--enable-cron): then every operation here raises
FailedPrecondition saying how, so that no client can leave a command running every minute on the
machine without the operator's say.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..base.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from ..core.store.cron import (
    HISTORY_KEPT,
    AgentSettings,
    CronExecution,
    CronJob,
    ExecutionStatus,
    JobSpec,
    JobType,
)
from ..runtime import Runtime
from ..runtime.cron.schedule import Schedule
from ..runtime.cron.scheduler import Scheduler
from ..tools.shell import MAX_TIMEOUT_MS
from .sessions import Sessions

__all__ = [
    "AgentConfig",
    "CronExecution",
    "CronJob",
    "CronJobs",
    "ExecutionStatus",
    "JobChanges",
    "JobType",
    "NewJob",
    "ParsedSchedule",
]

DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUTS_MS = {JobType.SHELL: MAX_TIMEOUT_MS, JobType.AGENT: 3_600_000}
"""A shell job's timeout is bash's (tools/shell.py); an agent job's, its generation's."""
DEFAULT_HISTORY = 10
MAX_NAME_CHARS = 128
MAX_COMMAND_CHARS = 100_000
UPCOMING = 5
"""The next times ParseCronSchedule lists."""
_Change = Callable[[CronJob], CronJob]
CHANGE_TRIES = 5
"""Read-change-write rounds of one change before giving up (another client changes the job too)."""
DISABLED = (
    "scheduled jobs are off on this server: its operator turns them on with --enable-cron"
    " (A3S_ENABLE_CRON=1); until then the cron RPCs (ListCronJobs, CreateCronJob, GetCronJob,"
    " UpdateCronJob, PauseCronJob, ResumeCronJob, DeleteCronJob, GetCronHistory, RunCronJob,"
    " ParseCronSchedule) answer this"
)


@dataclass(frozen=True)
class AgentConfig:
    """An agent job's model and session, as a request gives them."""

    model: str = ""
    api_key: str = ""
    workspace: str = ""
    system_prompt: str = ""
    base_url: str = ""


@dataclass(frozen=True)
class NewJob:
    name: str
    schedule: str  # a cron expression or a phrase (runtime/cron/phrases.py)
    command: str  # the command line, or an agent job's prompt
    timeout_ms: int | None = None  # None: DEFAULT_TIMEOUT_MS
    job_type: JobType = JobType.SHELL
    agent: AgentConfig | None = None  # required for an agent job, refused for a shell one


@dataclass(frozen=True)
class JobChanges:
    """What UpdateCronJob changes; None keeps it."""

    schedule: str | None = None
    command: str | None = None
    timeout_ms: int | None = None


@dataclass(frozen=True)
class ParsedSchedule:
    expression: str
    description: str
    """What it means, its time zone and its next times."""


class CronJobs:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def _scheduler(self) -> Scheduler:
        if not self._rt.cron.enabled:
            raise FailedPrecondition(DISABLED)
        return self._rt.cron

    def _now(self) -> int:
        return self._rt.cron.clock.now_ms()

    async def jobs(self) -> list[CronJob]:
        self._scheduler()
        return await self._rt.store.cron.jobs(self._now())

    async def create(self, new: NewJob) -> CronJob:
        """A stored job and its session; InvalidArgument names the field at fault, AlreadyExists a
        name taken."""
        scheduler = self._scheduler()
        name = _name(new.name)
        schedule = self._parse(new.schedule, "schedule")
        command = _command(new.command)
        timeout_ms = _timeout(new.timeout_ms, new.job_type)
        agent = _agent(new.job_type, new.agent)
        now = self._now()
        if await self._rt.store.cron.job_named(name, now) is not None:
            raise _taken(name)
        spec = JobSpec(
            schedule.expression,
            command,
            timeout_ms,
            new.job_type,
            (agent.workspace if agent else "") or str(self._rt.workspace),
            agent,
        )
        job = CronJob(uuid.uuid4().hex, name, spec, False, now, now, schedule.after(now))
        try:
            session = await scheduler.firings.session_of(job, new.agent.api_key if new.agent else "")
        except InvalidArgument as exc:
            raise InvalidArgument(f"agent_config: {exc}") from None
        job = replace(job, spec=replace(spec, working_dir=session.config.workspace))
        try:
            await self._rt.store.cron.add_job(job)
        except BaseException:
            await self._forget_session(job)
            raise
        scheduler.changed()
        return job

    async def get(self, job_id: str | None, name: str | None) -> CronJob:
        """By id (first) or by name; NotFound when none has it."""
        self._scheduler()
        if job_id:
            return await self._job(job_id)
        if not name:
            raise InvalidArgument("id or name is required")
        found = await self._rt.store.cron.job_named(name, self._now())
        if found is None:
            raise NotFound(f"no cron job is named {name!r}")
        return found

    async def update(self, job_id: str, changes: JobChanges) -> CronJob:
        """A new schedule takes effect from now (its next time after now); the other changes from
        the next firing."""

        def changed(job: CronJob) -> CronJob:
            spec = job.spec
            if changes.schedule is not None:
                spec = replace(spec, schedule=self._parse(changes.schedule, "schedule").expression)
            if changes.command is not None:
                spec = replace(spec, command=_command(changes.command))
            if changes.timeout_ms is not None:
                spec = replace(spec, timeout_ms=_timeout(changes.timeout_ms, spec.job_type))
            rescheduled = changes.schedule is not None and not job.paused
            next_run = (
                self._rt.cron.schedule(spec.schedule).after(self._now()) if rescheduled else job.next_run
            )
            return job.changed(self._now(), spec=spec, next_run=next_run)

        return await self._change(job_id, changed)

    async def pause(self, job_id: str) -> CronJob:
        """No firing is scheduled until it is resumed (RunCronJob still fires it)."""
        return await self._change(job_id, lambda job: job.changed(self._now(), paused=True, next_run=None))

    async def resume(self, job_id: str) -> CronJob:
        """Scheduled again from its next time after now: what was due while paused is not fired."""

        def resumed(job: CronJob) -> CronJob:
            next_run = self._rt.cron.schedule(job.spec.schedule).after(self._now())
            return job.changed(self._now(), paused=False, next_run=next_run)

        return await self._change(job_id, resumed)

    async def delete(self, job_id: str) -> None:
        """The job, its history and its session go; a firing of it running here is cancelled (one
        running on another replica ends by its timeout, unrecorded)."""
        scheduler = self._scheduler()
        job = await self._job(job_id)
        if not await self._rt.store.cron.delete_job(job.id):
            raise _unknown(job_id)
        scheduler.stop_job(job.id)
        await self._forget_session(job)

    async def history(self, job_id: str, limit: int | None) -> list[CronExecution]:
        """The newest `limit` records (None or 0: DEFAULT_HISTORY; at most HISTORY_KEPT, the records
        kept), newest first."""
        self._scheduler()
        job = await self._job(job_id)
        wanted = min(limit or DEFAULT_HISTORY, HISTORY_KEPT)
        return await self._rt.store.cron.history(job.id, wanted)

    async def run(self, job_id: str) -> CronExecution:
        """Fire the job now, paused or not, and return its record once the firing ended."""
        scheduler = self._scheduler()
        return await scheduler.run_now(await self._job(job_id))

    def parse(self, text: str) -> ParsedSchedule:
        """A cron expression or a phrase, explained: InvalidArgument (naming `input`) when neither."""
        self._scheduler()
        schedule = self._parse(text, "input")
        upcoming = ", ".join(schedule.shown(t) for t in schedule.upcoming(self._now(), UPCOMING))
        zone = self._rt.cron.settings.timezone
        return ParsedSchedule(schedule.expression, f"{schedule.explain()} ({zone}); next runs: {upcoming}")

    def _parse(self, text: str, field: str) -> Schedule:
        return Schedule.parse(text, self._rt.cron.settings.zone, field)

    async def _job(self, job_id: str) -> CronJob:
        if not job_id:
            raise InvalidArgument("id is required")
        found = await self._rt.store.cron.job(job_id, self._now())
        if found is None:
            raise _unknown(job_id)
        return found

    async def _change(self, job_id: str, change: _Change) -> CronJob:
        """Write `change` of the job as the store holds it, again when another write came first."""
        scheduler = self._scheduler()
        for _ in range(CHANGE_TRIES):
            job = await self._job(job_id)
            changed = change(job)
            if await self._rt.store.cron.save_job(changed, since=job.updated_at):
                scheduler.changed()
                return changed
        raise FailedPrecondition(f"cron job {job_id!r} kept changing under this change; send it again")

    async def _forget_session(self, job: CronJob) -> None:
        try:
            await Sessions(self._rt).destroy(job.session_id)
        except NotFound:
            pass


def _name(name: str) -> str:
    given = name.strip()
    if not given:
        raise InvalidArgument("name is required")
    if len(given) > MAX_NAME_CHARS or not given.isprintable():
        raise InvalidArgument(f"name must be at most {MAX_NAME_CHARS} printable characters")
    return given


def _command(command: str) -> str:
    if not command.strip():
        raise InvalidArgument("command is required: a shell command, or an agent job's prompt")
    if len(command) > MAX_COMMAND_CHARS or "\x00" in command:
        raise InvalidArgument(f"command must be at most {MAX_COMMAND_CHARS} characters, without NUL")
    return command


def _timeout(timeout_ms: int | None, job_type: JobType) -> int:
    if timeout_ms is None:
        return DEFAULT_TIMEOUT_MS
    most = MAX_TIMEOUTS_MS[job_type]
    if not 1 <= timeout_ms <= most:
        raise InvalidArgument(f"timeout_ms must be 1-{most} for a {job_type.value} job, not {timeout_ms}")
    return timeout_ms


def _agent(job_type: JobType, given: AgentConfig | None) -> AgentSettings | None:
    if job_type is JobType.SHELL:
        if given is not None:
            raise InvalidArgument(
                "agent_config is for CRON_JOB_TYPE_AGENT jobs; a shell job runs its command"
            )
        return None
    if given is None:
        raise InvalidArgument("agent_config is required for a CRON_JOB_TYPE_AGENT job (its model at least)")
    return AgentSettings(given.model, given.base_url, given.workspace, given.system_prompt)


def _unknown(job_id: str) -> NotFound:
    return NotFound(f"no cron job has the id {job_id!r}")


def _taken(name: str) -> AlreadyExists:
    return AlreadyExists(f"a cron job named {name!r} exists already")
