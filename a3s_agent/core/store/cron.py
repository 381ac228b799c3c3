"""Scheduled jobs (A3S's cron group) as the store keeps them: the jobs, their firings' records (the
history) and the lease each running firing holds, so that replicas on one store fire each scheduled
time once. The scheduler that uses them is runtime/cron/.

Every time is in ms since the epoch, given by the caller (its clock), never read by the store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any, Protocol


class JobType(StrEnum):
    SHELL = "shell"  # a command line, run as the bash tool runs one
    AGENT = "agent"  # a prompt, answered by a generation in the job's session


class ExecutionStatus(StrEnum):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class AgentSettings:
    """What an agent job's session is made with, but its API key (kept in memory only, as every
    session's is)."""

    model: str = ""
    base_url: str = ""
    workspace: str = ""
    system_prompt: str = ""


@dataclass(frozen=True)
class JobSpec:
    """What a client says about a job (and may change): stored as one JSON value."""

    schedule: str  # a 5-field cron expression
    command: str  # the command line, or an agent job's prompt
    timeout_ms: int
    job_type: JobType
    working_dir: str  # the job's session's workspace
    agent: AgentSettings | None = None

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "job_type": self.job_type.value})

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        data: dict[str, Any] = json.loads(text)
        agent = data.pop("agent", None)
        return cls(
            **{**data, "job_type": JobType(data["job_type"])},
            agent=AgentSettings(**agent) if agent is not None else None,
        )


@dataclass(frozen=True)
class CronJob:
    id: str
    name: str
    spec: JobSpec
    paused: bool
    created_at: int
    updated_at: int  # moved by every change a client makes: the stamp `save_job` compares
    next_run: int | None  # the next scheduled time; None while paused
    last_run: int | None = None  # when its last firing started
    run_count: int = 0  # firings that ended
    fail_count: int = 0  # of which did not succeed
    running: bool = False  # a firing holds its lease now (read with the job)

    @property
    def session_id(self) -> str:
        """The job's session: its workspace, permission rules and (agent jobs) conversation."""
        return f"cron-{self.id}"

    def changed(self, at: int, **fields: Any) -> CronJob:
        return replace(self, updated_at=max(at, self.updated_at + 1), **fields)


@dataclass(frozen=True)
class CronExecution:
    """One firing of a job: scheduled (`scheduled_at` its time) or asked for (RunCronJob: None)."""

    id: str
    job_id: str
    status: ExecutionStatus
    started_at: int
    owner: str  # the replica running it
    lease_until: int  # its lease: renewed while it runs; past it, another replica closes the record
    scheduled_at: int | None = None
    ended_at: int | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str = ""

    @property
    def duration_ms(self) -> int | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    def closed(
        self,
        status: ExecutionStatus,
        ended_at: int,
        *,
        exit_code: int | None = None,
        stdout: str = "",
        stderr: str = "",
        error: str = "",
    ) -> CronExecution:
        """The record of this firing ended so."""
        return replace(
            self,
            status=status,
            ended_at=ended_at,
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            error=error,
        )


HISTORY_KEPT = 100
"""Records kept per job, the newest: an older one goes when a firing ends."""
OVERLAP = "not run: the job's previous firing was still running"
"""The error of a firing recorded CANCELLED because another firing of its job held the lease."""

# --- the rows both stores read and write ---------------------------------------------------------

JOB_COLUMNS = "j.id, j.name, j.spec, j.paused, j.created_at, j.updated_at, j.next_run, j.last_run, j.run_count, j.fail_count"
"""A job's columns (table alias j), in `job_of`'s order; a store adds whether it is running."""
EXECUTION_COLUMNS = (
    "id, job_id, status, started_at, owner, lease_until, scheduled_at, ended_at, exit_code, stdout,"
    " stderr, error"
)
"""A firing's columns, in `execution_of`'s and `execution_row`'s order."""


def job_of(row: Sequence[Any]) -> CronJob:
    """A job from JOB_COLUMNS and then whether it is running."""
    return CronJob(
        id=row[0],
        name=row[1],
        spec=JobSpec.from_json(row[2]),
        paused=bool(row[3]),
        created_at=row[4],
        updated_at=row[5],
        next_run=row[6],
        last_run=row[7],
        run_count=row[8],
        fail_count=row[9],
        running=bool(row[10]),
    )


def execution_of(row: Sequence[Any]) -> CronExecution:
    """A firing from EXECUTION_COLUMNS (its outputs as text)."""
    return CronExecution(
        id=row[0],
        job_id=row[1],
        status=ExecutionStatus(row[2]),
        started_at=row[3],
        owner=row[4],
        lease_until=row[5],
        scheduled_at=row[6],
        ended_at=row[7],
        exit_code=row[8],
        stdout=row[9],
        stderr=row[10],
        error=row[11],
    )


def execution_row(e: CronExecution) -> tuple[Any, ...]:
    """EXECUTION_COLUMNS' values of a firing."""
    return (
        e.id, e.job_id, e.status.value, e.started_at, e.owner, e.lease_until, e.scheduled_at, e.ended_at,
        e.exit_code, e.stdout, e.stderr, e.error,
    )  # fmt: skip


class CronStore(Protocol):
    """The jobs and their history; each method one transaction. `now` (ms) tells which leases are
    still held: a job is `running` while one of its firings' leases is."""

    async def add_job(self, job: CronJob) -> None:
        """Store a new job; AlreadyExists when its name is taken."""

    async def jobs(self, now: int) -> list[CronJob]:
        """Every job, oldest first."""

    async def job(self, job_id: str, now: int) -> CronJob | None: ...

    async def job_named(self, name: str, now: int) -> CronJob | None: ...

    async def save_job(self, job: CronJob, since: int) -> bool:
        """Write what a client changes (spec, paused, next_run, updated_at) if the stored job is still
        the one stamped `since` (its updated_at); False when it changed meanwhile or is gone."""

    async def delete_job(self, job_id: str) -> bool:
        """Remove a job and its history; False when there was none."""

    async def due(self, now: int) -> list[CronJob]:
        """The jobs whose next_run is at or before `now`."""

    async def next_due(self) -> int | None:
        """The earliest next_run of any job, or None."""

    async def claim(
        self, job_id: str, due: int, next_run: int | None, firing: CronExecution | None
    ) -> CronExecution | None:
        """Move the job's next_run from `due` on to `next_run` and, when given, record `firing`
        (its last_run set), unless the job's next_run is no longer `due` (another replica claimed
        this time, or a client changed the job): then None. The firing is recorded CANCELLED when
        another firing of the job still holds its lease (one at a time); the stored record."""

    async def start(self, execution: CronExecution) -> bool:
        """Record a firing asked for now (its job's last_run set), unless another firing of the
        job holds its lease (False). NotFound when the job is gone."""

    async def renew(self, execution: CronExecution, lease_until: int) -> bool:
        """Extend a running firing's lease; False when it is no longer this owner's running one."""

    async def finish(self, execution: CronExecution) -> bool:
        """Write a running firing's outcome and count it in its job, keeping HISTORY_KEPT records of
        the job; False when it was no longer running (closed as abandoned, or its job deleted)."""

    async def abandon(self, now: int, error: str) -> int:
        """Close as FAILED (ended when its lease ran out, with `error`) every running firing whose
        lease ran out before `now`: its replica stopped. How many."""

    async def history(self, job_id: str, limit: int) -> list[CronExecution]:
        """Up to `limit` records of a job, newest first."""
