"""The scheduler: fires each stored job at its times, once across replicas, and keeps the record.

Every replica with scheduling on runs the same loop: it sleeps until the earliest next_run (at most
MAX_IDLE_MS, so that jobs another replica added are seen), closes the records of firings whose
lease ran out (their replica stopped), and claims each due job's time in the store: the claim moves
the job's next_run on and records the firing in one transaction, so of the replicas that find a time
due one claims it and fires; the others find it claimed. A running firing holds a lease (its record's
`lease_until`), renewed every third of --lease-ttl-s, and a job has one firing at a time: a time due
while one runs is recorded CANCELLED, and RunCronJob is refused.

Firings missed while no server ran (a due time older than MISSED_AFTER_MS when a replica first finds
it) follow --cron-missed: `skip` fires none of them; `run-once` fires the job once, for its last
missed time. Either way the job's next_run moves to its next time after now.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from ...base.errors import AgentError, FailedPrecondition
from ...config import CronSettings
from ...core.store.cron import CronExecution, CronJob, CronStore, ExecutionStatus
from .clock import Clock
from .firing import Firings, Outcome
from .schedule import Schedule

log = logging.getLogger(__name__)

MISSED_AFTER_MS = 60_000
"""A due time older than this when a replica finds it was missed (no server ran then)."""
MAX_IDLE_MS = 15_000
"""The longest the loop sleeps: what other replicas change is seen within it."""
ABANDONED = "its replica stopped before the firing ended (its lease ran out)"
STOPPED = "the server stopped while the firing ran"
DELETED = "the job was deleted while the firing ran"


class Scheduler:
    def __init__(
        self,
        store: CronStore,
        firings: Firings,
        settings: CronSettings,
        *,
        replica_id: str,
        lease_ttl_s: float,
        clock: Clock,
    ) -> None:
        self._store = store
        self.firings = firings
        self.settings = settings
        self.clock = clock
        self._replica_id = replica_id
        self._lease_ms = int(lease_ttl_s * 1000)
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._running: dict[str, tuple[str, asyncio.Task[CronExecution]]] = {}
        """The firings this replica runs, by record id: (job id, task)."""

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def schedule(self, expression: str) -> Schedule:
        """A stored job's schedule (checked when it was stored)."""
        return Schedule(expression, self.settings.zone)

    def start(self) -> None:
        if self.enabled and self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._run_loop(), name="a3s-cron")

    def changed(self) -> None:
        """A job was added or changed here: look at the times again now."""
        self._wake.set()

    async def close(self) -> None:
        """Stop the loop and every firing running here (recorded CANCELLED)."""
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel(STOPPED)
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop_job(self, job_id: str) -> None:
        """Cancel the firings of a deleted job running here."""
        for owner, task in list(self._running.values()):
            if owner == job_id:
                task.cancel(DELETED)

    async def run_now(self, job: CronJob) -> CronExecution:
        """Fire `job` now (RunCronJob) and return its record once it ended. It goes on if the caller
        goes away; FailedPrecondition while another firing of the job runs."""
        execution = self._new_firing(job, None)
        if not await self._store.start(execution):
            raise FailedPrecondition(
                f"cron job {job.name!r} is running: one firing of a job runs at a time; run it again when"
                " that one has ended (GetCronHistory shows it)"
            )
        return await asyncio.shield(self._spawn(job, execution))

    async def tick(self, now: int) -> None:
        """A round at `now`: close the firings whose replica stopped, then claim and fire every due job."""
        closed = await self._store.abandon(now, ABANDONED)
        if closed:
            log.warning("closed %d cron firing(s) whose replica stopped before they ended", closed)
        for job in await self._store.due(now):
            await self._fire_due(job, now)

    async def _run_loop(self) -> None:
        while True:
            self._wake.clear()
            now = self.clock.now_ms()  # once: the round, and how long it sleeps, are of this time
            try:
                await self.tick(now)
                earliest = await self._store.next_due()
            except Exception:  # the store is down, say: try again after the idle time
                log.exception("the cron scheduler's round failed")
                earliest = None
            idle_until = now + MAX_IDLE_MS
            await self.clock.sleep_until(min(earliest or idle_until, idle_until), self._wake)

    async def _fire_due(self, job: CronJob, now: int) -> None:
        assert job.next_run is not None  # a due job has one
        schedule = self.schedule(job.spec.schedule)
        latest = schedule.latest(now) or job.next_run
        on_time = now - latest <= MISSED_AFTER_MS
        firing = self._new_firing(job, latest) if on_time or self.settings.missed == "run-once" else None
        stored = await self._store.claim(job.id, job.next_run, schedule.after(now), firing)
        if firing is None:
            log.info(
                "cron job %s: the firings due from %s were missed while no server ran; skipped"
                " (--cron-missed skip)",
                job.name,
                schedule.shown(job.next_run),
            )
        elif stored is not None and stored.status is ExecutionStatus.RUNNING:
            self._spawn(job, stored)

    def _new_firing(self, job: CronJob, scheduled_at: int | None) -> CronExecution:
        now = self.clock.now_ms()
        return CronExecution(
            id=uuid.uuid4().hex,
            job_id=job.id,
            status=ExecutionStatus.RUNNING,
            started_at=now,
            owner=self._replica_id,
            lease_until=now + self._lease_ms,
            scheduled_at=scheduled_at,
        )

    def _spawn(self, job: CronJob, execution: CronExecution) -> asyncio.Task[CronExecution]:
        task = asyncio.get_running_loop().create_task(self._fire(job, execution))
        self._running[execution.id] = (job.id, task)
        task.add_done_callback(lambda _: self._running.pop(execution.id, None))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: a store fault is logged
        return task

    async def _fire(self, job: CronJob, execution: CronExecution) -> CronExecution:
        renewing = asyncio.get_running_loop().create_task(self._renew(execution))
        try:
            outcome = await self.firings.run(job)
        except asyncio.CancelledError as stop:  # only this scheduler cancels a firing (close, stop_job)
            outcome = Outcome(ExecutionStatus.CANCELLED, error=str(stop.args[0]) if stop.args else STOPPED)
        except Exception as exc:
            log.exception("cron job %s: its firing failed", job.name)
            outcome = Outcome(ExecutionStatus.FAILED, error=f"the firing failed: {exc}")
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)
        done = execution.closed(
            outcome.status,
            self.clock.now_ms(),
            exit_code=outcome.exit_code,
            stdout=outcome.stdout,
            error=outcome.error,
        )
        if not await self._store.finish(done) and outcome.error != DELETED:
            log.warning(
                "cron job %s: the record of its firing %s was closed before it ended", job.name, done.id
            )
        return done

    async def _renew(self, execution: CronExecution) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                if not await self._store.renew(execution, self.clock.now_ms() + self._lease_ms):
                    return
            except AgentError as exc:  # the store is down: try again, the lease may still hold
                log.warning("could not renew the lease of cron firing %s: %s", execution.id, exc)
