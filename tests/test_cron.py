"""Scheduled jobs (A3S's cron group, a3s-string-dialect.md 4.9) over a real grpc.aio channel with the
later dialect's stubs, against a real server: off unless the operator enables it; jobs stored, read,
changed, paused, resumed and deleted; schedules as cron expressions or phrases, bad ones refused
naming the field; firings at their times (the scheduler's clock moved by the test, tests/cron_clock.py),
once across two replicas on one PostgreSQL database, and by RunCronJob, each run as bash runs a
command (workspace, containment, permission rules, timeout, output cap) or as a generation of the
job's session; their history; and the rule for firings missed while no server ran."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.config import CronSettings, Settings
from a3s_agent.core.store.cron import CronExecution, ExecutionStatus
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.runtime.cron.scheduler import MAX_IDLE_MS
from a3s_agent.testing.fake_llm import FakeLLM, hang, text

from .conftest import LiveServer, ServerProcess, agent_settings, eventually, initialize, running
from .cron_clock import ManualClock
from .fault.test_crash_repair import processes_with

MONDAY_8AM = int(datetime(2026, 3, 2, 8, 0, tzinfo=UTC).timestamp() * 1000)
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
NINE = MONDAY_8AM + HOUR_MS  # 09:00 on that Monday
PATH = "/a3s.code.agent.v1.CodeAgentService/"
CRON_RPCS = (
    "ListCronJobs", "CreateCronJob", "GetCronJob", "UpdateCronJob", "PauseCronJob", "ResumeCronJob",
    "DeleteCronJob", "GetCronHistory", "RunCronJob", "ParseCronSchedule",
)  # fmt: skip
SHELL, AGENT = later.CRON_JOB_TYPE_SHELL, later.CRON_JOB_TYPE_AGENT
SUCCESS, FAILED = later.CRON_EXECUTION_STATUS_SUCCESS, later.CRON_EXECUTION_STATUS_FAILED
TIMEOUT, CANCELLED = later.CRON_EXECUTION_STATUS_TIMEOUT, later.CRON_EXECUTION_STATUS_CANCELLED


@dataclass
class Cron:
    live: LiveServer
    stub: Any  # later_grpc.CodeAgentServiceStub
    clock: ManualClock

    async def create(self, name: str, schedule: str, command: str, **fields: Any) -> Any:
        request = later.CreateCronJobRequest(name=name, schedule=schedule, command=command, **fields)
        reply = await self.stub.CreateCronJob(request)
        assert reply.success, reply.error
        return reply.job

    async def history(self, job_id: str, limit: int | None = None) -> list[Any]:
        reply = await self.stub.GetCronHistory(later.GetCronHistoryRequest(id=job_id, limit=limit))
        return list(reply.executions)

    async def ended(self, job_id: str, count: int) -> list[Any]:
        """The job's records once `count` of them have ended."""

        async def done() -> list[Any] | None:
            records = await self.history(job_id, 100)
            return records if sum(1 for r in records if r.HasField("ended_at")) >= count else None

        return await eventually(done, f"{count} ended firing(s) of job {job_id}")

    async def job(self, job_id: str) -> Any:
        return (await self.stub.GetCronJob(later.GetCronJobRequest(id=job_id))).job


def cron_settings(workspace: Path, data: Path, **cron: Any) -> Settings:
    return replace(agent_settings(workspace, data), cron=CronSettings(enabled=True, **cron))


@asynccontextmanager
async def serving(settings: Settings, clock: ManualClock) -> AsyncIterator[Cron]:
    async with running(settings, clock=clock) as live:
        if settings.cron.enabled:
            await clock.running(1)
        yield Cron(live, later_grpc.CodeAgentServiceStub(live.channel), clock)


@pytest.fixture
async def cron(workspace: Path, tmp_path: Path) -> AsyncIterator[Cron]:
    async with serving(cron_settings(workspace, tmp_path / "data"), ManualClock(MONDAY_8AM)) as served:
        yield served


async def status_of(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --- the operator's switch ---------------------------------------------------------------------


async def test_scheduling_is_off_unless_the_operator_enables_it(workspace: Path, tmp_path: Path) -> None:
    clock = ManualClock(MONDAY_8AM)
    async with serving(agent_settings(workspace, tmp_path / "off"), clock) as off:
        for name in CRON_RPCS:
            error = await status_of(off.live.channel.unary_unary(PATH + name)(b""))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, name
            details = error.details() or ""
            assert "--enable-cron" in details and "A3S_ENABLE_CRON=1" in details, details
        features = (await off.live.stub.GetCapabilities(pb.GetCapabilitiesRequest())).features
        assert "cron" not in features
    async with serving(cron_settings(workspace, tmp_path / "on"), clock) as on:
        assert list((await on.stub.ListCronJobs(later.ListCronJobsRequest())).jobs) == []
        assert "cron" in (await on.live.stub.GetCapabilities(pb.GetCapabilitiesRequest())).features


class CronServerProcess(ServerProcess):
    def command(self) -> list[str]:
        return [*super().command(), "--enable-cron"]


def test_a3s_agent_serve_enable_cron_serves_the_group(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = CronServerProcess(workspace, tmp_path / "data").start()
    try:
        with server.channel() as channel:
            stub = later_grpc.CodeAgentServiceStub(channel)
            create = later.CreateCronJobRequest(name="hello", schedule="@daily", command="echo hello")
            job = stub.CreateCronJob(create, timeout=15).job
            ran = stub.RunCronJob(later.RunCronJobRequest(id=job.id), timeout=15)
            assert ran.success and ran.execution.stdout.strip() == "hello"
    finally:
        assert server.stop() == 0


# --- jobs: stored, read, changed --------------------------------------------------------------


async def test_a_job_is_stored_read_changed_paused_resumed_and_deleted(cron: Cron) -> None:
    job = await cron.create("report", "every day at 9am", "echo report")
    assert job.schedule == "0 9 * * *"  # the phrase as the cron expression it stands for
    assert (job.status, job.job_type, job.timeout_ms) == (later.CRON_JOB_STATUS_ACTIVE, SHELL, 60_000)
    assert job.next_run == NINE and not job.HasField("last_run")
    assert (job.created_at, job.updated_at, job.run_count, job.fail_count) == (MONDAY_8AM, MONDAY_8AM, 0, 0)
    assert job.working_dir == str(cron.live.workspace.resolve())
    other = await cron.create("cleanup", "*/15 * * * *", "true", timeout_ms=5_000)
    assert other.next_run == MONDAY_8AM + 15 * 60_000

    listed = (await cron.stub.ListCronJobs(later.ListCronJobsRequest())).jobs
    assert [j.name for j in listed] == ["report", "cleanup"]
    by_name = (await cron.stub.GetCronJob(later.GetCronJobRequest(name="report"))).job
    assert by_name == job

    updated = (
        await cron.stub.UpdateCronJob(
            later.UpdateCronJobRequest(
                id=job.id, schedule="30 10 * * 1-5", command="echo later", timeout_ms=900
            )
        )
    ).job
    assert (updated.schedule, updated.command, updated.timeout_ms) == ("30 10 * * 1-5", "echo later", 900)
    assert updated.next_run == MONDAY_8AM + 2 * HOUR_MS + 30 * 60_000
    assert updated.updated_at > job.updated_at
    assert (await cron.job(job.id)) == updated

    paused = (await cron.stub.PauseCronJob(later.PauseCronJobRequest(id=job.id))).job
    assert paused.status == later.CRON_JOB_STATUS_PAUSED and not paused.HasField("next_run")
    cron.clock.now = MONDAY_8AM + 3 * DAY_MS  # while paused, no time is due
    resumed = (await cron.stub.ResumeCronJob(later.ResumeCronJobRequest(id=job.id))).job
    assert resumed.status == later.CRON_JOB_STATUS_ACTIVE
    assert resumed.next_run == MONDAY_8AM + 3 * DAY_MS + 2 * HOUR_MS + 30 * 60_000  # Thursday 10:30

    deleted = await cron.stub.DeleteCronJob(later.DeleteCronJobRequest(id=job.id))
    assert deleted.success
    gone = await status_of(cron.stub.GetCronJob(later.GetCronJobRequest(id=job.id)))
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    assert [j.name for j in (await cron.stub.ListCronJobs(later.ListCronJobsRequest())).jobs] == ["cleanup"]
    session_gone = await status_of(
        cron.live.stub.GetSession(pb.GetSessionRequest(session_id=f"cron-{job.id}"))
    )
    assert session_gone.code() == grpc.StatusCode.NOT_FOUND


async def test_jobs_survive_a_restart(workspace: Path, tmp_path: Path) -> None:
    settings = cron_settings(workspace, tmp_path / "data")
    async with serving(settings, ManualClock(MONDAY_8AM)) as first:
        job = await first.create("nightly", "0 3 * * *", "true")
    async with serving(settings, ManualClock(MONDAY_8AM)) as second:
        assert (await second.job(job.id)) == job


# --- bad input ----------------------------------------------------------------------------------


async def test_bad_input_is_refused_naming_the_field(cron: Cron) -> None:
    async def refused(call: Any, code: grpc.StatusCode, *words: str) -> None:
        error = await status_of(call)
        assert error.code() == code, error.details()
        assert all(word in (error.details() or "") for word in words), error.details()

    def create(**fields: Any) -> Any:
        base: dict[str, Any] = {"name": "job", "schedule": "* * * * *", "command": "true"}
        return cron.stub.CreateCronJob(later.CreateCronJobRequest(**{**base, **fields}))

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await refused(create(schedule="61 * * * *"), invalid, "schedule", "minute field", "'61'")
    await refused(create(schedule="0 24 * * *"), invalid, "schedule", "hour field")
    await refused(create(schedule="0 0 * 13 *"), invalid, "schedule", "month field")
    await refused(create(schedule="0 0 * * 9"), invalid, "schedule", "day-of-week field")
    await refused(create(schedule="* * * *"), invalid, "schedule", "4 fields")
    await refused(create(schedule="whenever you like"), invalid, "schedule", "every day at 9am")
    await refused(create(schedule="every day at 25:00"), invalid, "schedule", "25:00")
    await refused(create(schedule=""), invalid, "schedule is required")
    await refused(create(name=" "), invalid, "name is required")
    await refused(create(command=""), invalid, "command is required")
    await refused(create(timeout_ms=0), invalid, "timeout_ms")
    await refused(create(timeout_ms=600_001), invalid, "timeout_ms", "1-600000")
    await refused(create(job_type=7), invalid, "job_type")
    await refused(create(job_type=AGENT), invalid, "agent_config is required")
    await refused(create(agent_config=later.CronAgentConfig(model="m")), invalid, "agent_config")
    await refused(
        create(job_type=AGENT, agent_config=later.CronAgentConfig(model="m", workspace="/elsewhere")),
        invalid,
        "agent_config",
        "workspace",
    )
    assert list((await cron.stub.ListCronJobs(later.ListCronJobsRequest())).jobs) == []

    job = await cron.create("job", "* * * * *", "true")
    await refused(create(), grpc.StatusCode.ALREADY_EXISTS, "'job'")
    update = later.UpdateCronJobRequest(id=job.id, schedule="* 99 * * *")
    await refused(cron.stub.UpdateCronJob(update), invalid, "schedule", "hour field")
    await refused(cron.stub.GetCronJob(later.GetCronJobRequest()), invalid, "id or name")

    missing = "0123456789abcdef"
    not_found = grpc.StatusCode.NOT_FOUND
    for call in (
        cron.stub.GetCronJob(later.GetCronJobRequest(id=missing)),
        cron.stub.GetCronJob(later.GetCronJobRequest(name="nope")),
        cron.stub.UpdateCronJob(later.UpdateCronJobRequest(id=missing, command="x")),
        cron.stub.PauseCronJob(later.PauseCronJobRequest(id=missing)),
        cron.stub.ResumeCronJob(later.ResumeCronJobRequest(id=missing)),
        cron.stub.DeleteCronJob(later.DeleteCronJobRequest(id=missing)),
        cron.stub.GetCronHistory(later.GetCronHistoryRequest(id=missing)),
        cron.stub.RunCronJob(later.RunCronJobRequest(id=missing)),
    ):
        await refused(call, not_found, "no cron job")
    garbage = await status_of(cron.live.channel.unary_unary(PATH + "CreateCronJob")(b"\x0a\xff\xff\xff"))
    assert garbage.code() == invalid


async def test_parse_cron_schedule_explains_a_schedule_and_lists_its_next_runs(cron: Cron) -> None:
    async def parse(text: str) -> Any:
        return await cron.stub.ParseCronSchedule(later.ParseCronScheduleRequest(input=text))

    daily = await parse("every day at 9am")
    assert (daily.success, daily.cron_expression) == (True, "0 9 * * *")
    assert daily.description.startswith("At 09:00 every day (UTC); next runs: 2026-03-02 09:00 UTC,")
    assert "2026-03-06 09:00 UTC" in daily.description  # five of them
    weekdays = await parse("every weekday at 17:30")
    assert weekdays.cron_expression == "30 17 * * 1-5"
    assert "Monday through Friday" in weekdays.description
    assert (await parse("*/15 * * * *")).description.startswith("Every 15th minute")
    for phrase, expression in {
        "every 15 minutes": "*/15 * * * *",
        "hourly": "0 * * * *",
        "every monday and friday at 8:15pm": "15 20 * * 1,5",
        "every month on the 1st at midnight": "0 0 1 * *",
        "@weekly": "0 0 * * 0",
    }.items():
        assert (await parse(phrase)).cron_expression == expression, phrase
    bad = await parse("61 * * * *")
    assert not bad.success and "input" in bad.error and "minute field" in bad.error
    assert not (await parse("at some point")).success


# --- firings at their times ----------------------------------------------------------------------


async def test_a_due_time_fires_the_command_once_in_the_workspace(cron: Cron) -> None:
    job = await cron.create("stamp", "0 9 * * *", "echo fired >> fired.log; pwd")
    await cron.clock.move_to(NINE - 60_000)
    assert await cron.history(job.id) == []
    await cron.clock.move_to(NINE)
    [record] = await cron.ended(job.id, 1)
    assert record.status == SUCCESS and record.exit_code == 0
    assert record.stdout.strip() == str(cron.live.workspace.resolve())
    assert lines(cron.live.workspace / "fired.log") == ["fired"]
    fired = await cron.job(job.id)
    assert (fired.run_count, fired.fail_count, fired.last_run, fired.next_run) == (1, 0, NINE, NINE + DAY_MS)
    await cron.clock.move_to(NINE + 30_000)  # the same time is not fired again
    await cron.clock.move_to(NINE + DAY_MS - 1)
    assert lines(cron.live.workspace / "fired.log") == ["fired"]
    await cron.clock.move_to(NINE + DAY_MS)
    await cron.ended(job.id, 2)
    assert lines(cron.live.workspace / "fired.log") == ["fired", "fired"]


async def test_a_paused_job_does_not_fire(cron: Cron) -> None:
    job = await cron.create("paused", "0 9 * * *", "echo fired >> fired.log")
    await cron.stub.PauseCronJob(later.PauseCronJobRequest(id=job.id))
    await cron.clock.move_to(NINE)
    assert await cron.history(job.id) == [] and not (cron.live.workspace / "fired.log").exists()


@pytest.mark.parametrize("rule", ["skip", "run-once"])
async def test_firings_missed_while_no_server_ran_follow_the_configured_rule(
    workspace: Path, tmp_path: Path, rule: str
) -> None:
    settings = cron_settings(workspace, tmp_path / "data", missed=rule)
    async with serving(settings, ManualClock(MONDAY_8AM)) as first:
        job = await first.create("daily", "0 9 * * *", "echo fired >> fired.log")
    wednesday_10am = NINE + 2 * DAY_MS + HOUR_MS  # Monday's and Tuesday's and Wednesday's 09:00 missed
    async with serving(settings, ManualClock(wednesday_10am)) as second:
        records = await second.ended(job.id, 1) if rule == "run-once" else await second.history(job.id)
        assert len(records) == (1 if rule == "run-once" else 0)
        assert len(lines(workspace / "fired.log")) == len(records)
        assert (await second.job(job.id)).next_run == NINE + 3 * DAY_MS


# --- RunCronJob, and what a firing is -----------------------------------------------------------


async def test_run_cron_job_fires_now_and_keeps_exit_codes_and_history(cron: Cron) -> None:
    job = await cron.create("steps", "0 0 1 1 *", "echo one; exit 3")
    failed = await cron.stub.RunCronJob(later.RunCronJobRequest(id=job.id))
    assert not failed.success and "exited with code 3" in failed.error
    assert (failed.execution.status, failed.execution.exit_code) == (FAILED, 3)
    assert failed.execution.stdout.strip() == "one"
    assert failed.execution.duration_ms == failed.execution.ended_at - failed.execution.started_at
    await cron.stub.UpdateCronJob(later.UpdateCronJobRequest(id=job.id, command="echo two"))
    done = await cron.stub.RunCronJob(later.RunCronJobRequest(id=job.id))
    assert done.success and done.execution.status == SUCCESS and done.execution.stdout.strip() == "two"
    assert not done.execution.HasField("error")

    newest = await cron.history(job.id, 1)
    assert [r.id for r in newest] == [done.execution.id]
    assert [r.id for r in await cron.history(job.id)] == [done.execution.id, failed.execution.id]
    counted = await cron.job(job.id)
    assert (counted.run_count, counted.fail_count) == (2, 1)


async def test_a_firing_times_out_and_its_output_is_cut(cron: Cron) -> None:
    slow = await cron.create("slow", "0 0 1 1 *", "echo started; sleep 30", timeout_ms=300)
    timed_out = (await cron.stub.RunCronJob(later.RunCronJobRequest(id=slow.id))).execution
    assert timed_out.status == TIMEOUT and "timed out after 300 ms" in timed_out.error
    assert timed_out.stdout.startswith("started")
    loud = await cron.create("loud", "0 0 1 1 *", "head -c 200000 /dev/zero | tr '\\0' a")
    cut = (await cron.stub.RunCronJob(later.RunCronJobRequest(id=loud.id))).execution
    assert cut.status == SUCCESS and "[output truncated" in cut.stdout
    assert 30_000 < len(cut.stdout.encode()) < 40_000


async def test_a_firing_is_contained_and_governed_as_bash_is(cron: Cron) -> None:
    started = await cron.create("background", "0 0 1 1 *", "sleep 301.25 & echo started")
    run = (await cron.stub.RunCronJob(later.RunCronJobRequest(id=started.id))).execution
    assert run.status == SUCCESS
    await eventually(lambda: not processes_with("301.25"), "the firing's background process killed with it")

    (cron.live.workspace / "keep.txt").write_text("kept")
    remover = await cron.create("remover", "0 0 1 1 *", "rm -f keep.txt")
    rules = pb.PermissionPolicy(enabled=True, deny=[pb.PermissionRule(rule="Bash(rm:*)")])
    await cron.live.stub.SetPermissionPolicy(
        pb.SetPermissionPolicyRequest(session_id=f"cron-{remover.id}", policy=rules)
    )
    denied = await cron.stub.RunCronJob(later.RunCronJobRequest(id=remover.id))
    assert not denied.success and denied.execution.status == FAILED
    assert "denied by the permission policy" in denied.error and "Bash(rm:*)" in denied.error
    assert (cron.live.workspace / "keep.txt").read_text() == "kept"

    outside = await cron.create(
        "outside", "0 0 1 1 *", f"cat {cron.live.runtime.settings.resolved_data_dir}/sessions.db"
    )
    refused = (await cron.stub.RunCronJob(later.RunCronJobRequest(id=outside.id))).execution
    assert refused.status == FAILED  # the OS sandbox keeps the server's data from commands


async def test_one_firing_of_a_job_runs_at_a_time(cron: Cron) -> None:
    gate = cron.live.workspace / "go"
    await cron.clock.move_to(NINE - 5_000)  # its time comes within the lease of the firing below
    job = await cron.create("gated", "0 9 * * *", "until [ -f go ]; do sleep 0.05; done; echo through")
    first = asyncio.ensure_future(cron.stub.RunCronJob(later.RunCronJobRequest(id=job.id)))
    await eventually(lambda: _status(cron, job.id, later.CRON_JOB_STATUS_RUNNING), "the job shown running")
    again = await status_of(cron.stub.RunCronJob(later.RunCronJobRequest(id=job.id)))
    assert again.code() == grpc.StatusCode.FAILED_PRECONDITION and "is running" in (again.details() or "")
    await cron.clock.move_to(NINE)  # its time comes while it runs: recorded, not run
    [skipped] = [r for r in await cron.history(job.id) if r.status == CANCELLED]
    assert "previous firing was still running" in skipped.error
    gate.write_text("")
    assert (await first).execution.stdout.strip() == "through"
    assert (await cron.job(job.id)).status == later.CRON_JOB_STATUS_ACTIVE


async def _status(cron: Cron, job_id: str, wanted: int) -> bool:
    return bool((await cron.job(job_id)).status == wanted)


async def test_deleting_a_running_job_stops_its_firing(cron: Cron) -> None:
    job = await cron.create("forever", "0 0 1 1 *", "sleep 302.25")
    running_call = asyncio.ensure_future(cron.stub.RunCronJob(later.RunCronJobRequest(id=job.id)))
    await eventually(lambda: processes_with("302.25"), "the firing started")
    await cron.stub.DeleteCronJob(later.DeleteCronJobRequest(id=job.id))
    ended = (await running_call).execution
    assert ended.status == CANCELLED and "deleted" in ended.error
    await eventually(lambda: not processes_with("302.25"), "the firing's process killed")


async def test_a_firing_the_server_stops_is_recorded_cancelled(workspace: Path, tmp_path: Path) -> None:
    settings = cron_settings(workspace, tmp_path / "data")
    async with serving(settings, ManualClock(MONDAY_8AM)) as first:
        job = await first.create("long", "0 0 1 1 *", "sleep 303.25")
        call = asyncio.ensure_future(first.stub.RunCronJob(later.RunCronJobRequest(id=job.id)))
        await eventually(lambda: processes_with("303.25"), "the firing started")
    call.cancel()
    await eventually(
        lambda: not processes_with("303.25"), "the firing's process killed with the server's stop"
    )
    async with serving(settings, ManualClock(MONDAY_8AM)) as second:
        [record] = await second.history(job.id)
        assert record.status == CANCELLED and "server stopped" in record.error


# --- agent jobs -----------------------------------------------------------------------------------


async def test_an_agent_job_is_a_generation_in_the_jobs_session(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    fake.script(text("the summary"))
    async with serving(cron_settings(workspace, tmp_path / "data"), ManualClock(MONDAY_8AM)) as cron:
        await initialize(cron.live, fake)
        config = later.CronAgentConfig(model="fake-model", api_key="sk-cron-secret", system_prompt="be brief")
        job = await cron.create(
            "digest", "0 9 * * *", "summarize the day", job_type=AGENT, agent_config=config
        )
        assert job.job_type == AGENT and job.agent_config.model == "fake-model"
        assert job.agent_config.api_key == "" and job.agent_config.system_prompt == "be brief"
        await cron.clock.move_to(NINE)
        [record] = await cron.ended(job.id, 1)
        assert record.status == SUCCESS and record.stdout == "the summary"
        assert not record.HasField("exit_code")
        request = fake.requests[-1]
        assert request.authorization == "Bearer sk-cron-secret"
        assert "be brief" in request.messages[0]["content"]
        assert request.messages[-1] == {"role": "user", "content": "summarize the day"}
        history = await cron.stub.GetMessages(later.GetMessagesRequest(session_id=f"cron-{job.id}"))
        assert [m.content[0].text.text for m in history.messages] == ["summarize the day", "the summary"]
        listed = str(await cron.stub.ListCronJobs(later.ListCronJobsRequest()))
        assert "sk-cron-secret" not in listed
        stored = [path for path in (tmp_path / "data").rglob("*") if path.is_file()]
        stored_bytes = b"".join(path.read_bytes() for path in stored)
        assert b"summarize the day" in stored_bytes  # the job and its session are in there
        assert b"sk-cron-secret" not in stored_bytes  # its key is not


async def test_an_agent_job_times_out(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    fake.script(hang())
    async with serving(cron_settings(workspace, tmp_path / "data"), ManualClock(MONDAY_8AM)) as cron:
        await initialize(cron.live, fake)
        job = await cron.create(
            "slow", "0 9 * * *", "think", job_type=AGENT, agent_config=later.CronAgentConfig(), timeout_ms=300
        )
        run = (await cron.stub.RunCronJob(later.RunCronJobRequest(id=job.id))).execution
        assert run.status == TIMEOUT and "timeout_ms (300 ms)" in run.error


# --- replicas on PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "shared"
    path.mkdir()
    yield path


async def test_two_replicas_on_one_postgresql_fire_each_time_once(
    postgres_url: str, tmp_path: Path, shared: Path
) -> None:
    clock = ManualClock(MONDAY_8AM)
    async with AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(
                running(
                    replace(
                        cron_settings(shared, tmp_path / f"data-{name}"),
                        store=postgres_url,
                        replica_id=name,
                    ),
                    clock=clock,
                )
            )
            for name in ("A", "B")
        ]
        await clock.running(2)
        a, b = (Cron(live, later_grpc.CodeAgentServiceStub(live.channel), clock) for live in replicas)
        job = await a.create("shared", "0 9 * * *", "echo fired >> fired.log")
        assert (await b.job(job.id)) == job  # one store: either replica serves it
        for day in range(3):
            await clock.move_to(NINE + day * DAY_MS)
            await b.ended(job.id, day + 1)
            assert len(lines(shared / "fired.log")) == day + 1
        records = await a.history(job.id)
        assert len(records) == 3 and {r.status for r in records} == {SUCCESS}
        assert (await b.job(job.id)).run_count == 3
        ran = await b.stub.RunCronJob(later.RunCronJobRequest(id=job.id))
        assert ran.success and len(await a.history(job.id)) == 4


async def test_a_firing_left_by_a_stopped_replica_is_closed_by_another(
    postgres_url: str, tmp_path: Path, shared: Path
) -> None:
    clock = ManualClock(MONDAY_8AM)
    settings = replace(
        cron_settings(shared, tmp_path / "data-A"), store=postgres_url, replica_id="A", lease_ttl_s=1.0
    )
    async with running(settings, clock=clock) as survivor:
        await clock.running(1)
        cron = Cron(survivor, later_grpc.CodeAgentServiceStub(survivor.channel), clock)
        job = await cron.create("orphan", "0 0 1 1 *", "true")
        stale = CronExecution(  # the record a replica that stopped left: its lease runs out
            "left-behind",
            job.id,
            ExecutionStatus.RUNNING,
            clock.now,
            owner="B",
            lease_until=clock.now + 1_000,
        )
        assert await survivor.runtime.store.cron.start(stale)
        assert (await cron.job(job.id)).status == later.CRON_JOB_STATUS_RUNNING
        await clock.move_to(clock.now + MAX_IDLE_MS)  # its next round, past the record's lease
        [record] = await cron.ended(job.id, 1)
        assert record.status == FAILED and "its replica stopped" in record.error
        assert (await cron.job(job.id)).status == later.CRON_JOB_STATUS_ACTIVE
