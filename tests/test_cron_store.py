"""The scheduled jobs' part of the store (a3s_agent/core/store/cron.py), one suite run against both
stores: what the scheduler counts on, a claimed time fired once whoever claims it (on PostgreSQL by
two replicas at once), one firing of a job at a time, leases that run out, and the history's bound."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from a3s_agent.base.errors import AlreadyExists, NotFound
from a3s_agent.core.store.cron import (
    HISTORY_KEPT,
    OVERLAP,
    CronExecution,
    CronJob,
    ExecutionStatus,
    JobSpec,
    JobType,
)
from a3s_agent.core.store.postgres_store import PostgresStore
from a3s_agent.core.store.protocol import Store

from . import test_store_protocol

store = test_store_protocol.store  # the fixture: SQLite, and PostgreSQL on a real server

T0 = 1_772_438_400_000  # ms
MINUTE = 60_000
LEASE = 10_000


def a_job(name: str = "job", next_run: int | None = T0 + MINUTE) -> CronJob:
    spec = JobSpec("* * * * *", "true", 1_000, JobType.SHELL, "/tmp")
    return CronJob(f"id-{name}", name, spec, False, T0, T0, next_run)


def a_firing(job: CronJob, at: int, scheduled: int | None = None, owner: str = "A") -> CronExecution:
    return CronExecution(f"f-{owner}-{at}", job.id, ExecutionStatus.RUNNING, at, owner, at + LEASE, scheduled)


async def test_jobs_are_stored_read_changed_and_deleted_with_their_history(store: Store) -> None:
    job = a_job()
    await store.cron.add_job(job)
    with pytest.raises(AlreadyExists):
        await store.cron.add_job(replace(job, id="other"))
    later_made = replace(a_job("a later one"), id="0-sorts-first")  # made at the same ms
    await store.cron.add_job(later_made)
    assert await store.cron.jobs(T0) == [job, later_made]  # in the order they were made
    assert await store.cron.delete_job(later_made.id)
    assert await store.cron.job_named("job", T0) == job
    changed = job.changed(T0, paused=True, next_run=None)
    assert await store.cron.save_job(changed, since=job.updated_at)
    assert not await store.cron.save_job(job.changed(T0 + 1), since=job.updated_at)  # changed meanwhile
    assert await store.cron.job(job.id, T0) == changed
    assert await store.cron.start(a_firing(job, T0))
    assert await store.cron.delete_job(job.id)
    assert await store.cron.history(job.id, 10) == [] and await store.cron.job(job.id, T0) is None
    assert not await store.cron.delete_job(job.id)
    with pytest.raises(NotFound):
        await store.cron.start(a_firing(job, T0))


async def test_a_due_time_is_claimed_once(store: Store) -> None:
    job = a_job()
    await store.cron.add_job(job)
    assert await store.cron.due(T0) == [] and await store.cron.next_due() == T0 + MINUTE
    assert [j.id for j in await store.cron.due(T0 + MINUTE)] == [job.id]
    firing = a_firing(job, T0 + MINUTE, scheduled=T0 + MINUTE)
    assert await store.cron.claim(job.id, T0 + MINUTE, T0 + 2 * MINUTE, firing) == firing
    late = replace(firing, id="late", owner="B")
    assert await store.cron.claim(job.id, T0 + MINUTE, T0 + 2 * MINUTE, late) is None  # claimed already
    assert [r.id for r in await store.cron.history(job.id, 10)] == [firing.id]
    stored = await store.cron.job(job.id, T0 + MINUTE)
    assert stored is not None and stored.running and stored.last_run == T0 + MINUTE
    assert stored.next_run == T0 + 2 * MINUTE


async def test_one_firing_of_a_job_holds_its_lease_at_a_time(store: Store) -> None:
    job = a_job()
    await store.cron.add_job(job)
    first = a_firing(job, T0)
    assert await store.cron.start(first)
    assert not await store.cron.start(a_firing(job, T0 + 1))  # refused, nothing recorded
    overlapping = await store.cron.claim(job.id, T0 + MINUTE, None, a_firing(job, T0 + 2, T0 + MINUTE))
    assert overlapping is not None and overlapping.status is ExecutionStatus.CANCELLED
    assert overlapping.error == OVERLAP
    assert await store.cron.renew(first, T0 + 3 * LEASE)
    done = first.closed(ExecutionStatus.SUCCESS, T0 + 5, exit_code=0, stdout="out\x00put")
    assert await store.cron.finish(done)
    assert not await store.cron.finish(done) and not await store.cron.renew(first, T0)  # ended already
    assert await store.cron.start(a_firing(job, T0 + 6))
    records = await store.cron.history(job.id, 10)
    assert [r.status for r in records] == [ExecutionStatus.RUNNING, ExecutionStatus.CANCELLED, done.status]
    assert records[2].stdout == "out\x00put" and records[2].duration_ms == 5
    counted = await store.cron.job(job.id, T0)
    assert counted is not None and (counted.run_count, counted.fail_count) == (1, 0)


async def test_a_firing_whose_lease_ran_out_is_closed_as_failed(store: Store) -> None:
    job = a_job()
    await store.cron.add_job(job)
    left = a_firing(job, T0, owner="gone")
    assert await store.cron.start(left)
    assert await store.cron.abandon(T0 + LEASE, "gone") == 0  # still held at its last ms
    assert await store.cron.abandon(T0 + LEASE + 1, "its replica stopped") == 1
    [record] = await store.cron.history(job.id, 10)
    assert (record.status, record.ended_at, record.error) == (
        ExecutionStatus.FAILED,
        T0 + LEASE,
        "its replica stopped",
    )
    counted = await store.cron.job(job.id, T0 + LEASE + 1)
    assert counted is not None and not counted.running and (counted.run_count, counted.fail_count) == (1, 1)


async def test_the_history_keeps_the_newest_records(store: Store) -> None:
    job = a_job()
    await store.cron.add_job(job)
    for n in range(HISTORY_KEPT + 5):
        firing = a_firing(job, T0)  # all at one time: the order they were made in decides
        firing = replace(firing, id=f"f{n}")
        assert await store.cron.start(firing)
        assert await store.cron.finish(firing.closed(ExecutionStatus.SUCCESS, T0))
    kept = await store.cron.history(job.id, 1_000)
    assert [r.id for r in kept] == [f"f{n}" for n in reversed(range(5, HISTORY_KEPT + 5))]
    assert [r.id for r in await store.cron.history(job.id, 2)] == [
        f"f{HISTORY_KEPT + 4}",
        f"f{HISTORY_KEPT + 3}",
    ]


async def test_two_replicas_claiming_one_time_at_once_fire_it_once(postgres_url: str) -> None:
    replicas = [PostgresStore(postgres_url, name) for name in ("A", "B")]
    for replica in replicas:
        await replica.open()
    try:
        job = a_job()
        await replicas[0].cron.add_job(job)
        for n in range(20):
            due, after = T0 + (n + 1) * MINUTE, T0 + (n + 2) * MINUTE
            claims = await asyncio.gather(
                *(
                    r.cron.claim(job.id, due, after, a_firing(job, due, scheduled=due, owner=r.replica_id))
                    for r in replicas
                )
            )
            [won] = [c for c in claims if c is not None]
            assert await replicas[0].cron.finish(won.closed(ExecutionStatus.SUCCESS, due))
        assert len(await replicas[1].cron.history(job.id, 100)) == 20
    finally:
        for replica in replicas:
            await replica.close()
