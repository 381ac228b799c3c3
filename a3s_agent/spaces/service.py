"""The Agent Spaces service: a space is a workspace with a policy; a run executes an operations
message in it. The runtime builds the one of its data dir; faces reach it through app/spaces.py.

    spaces = Spaces(data_dir, registry)
    await spaces.open()
    space = await spaces.create_space(policy="standard")
    result = await spaces.start_run(space.id, {"protocolVersion": "1.0", "operations": [...]})
    if result["status"] == "awaiting_approval":
        result = await spaces.resume_run(space.id, result["runId"], {"operationId": ..., "decision": "approved"})

Runs are stored in `<data_dir>/spaces.db`, so a run paused for approval survives a restart: a new
`Spaces` on the same data dir resumes it. Open one `Spaces` per data dir at a time: opening marks
the runs a stopped process left running as failed (status "error"). At most `max_runs` runs execute
at once (starts and resumes), and the store keeps at most `max_spaces` spaces (the protocol deletes
none); beyond either, ResourceExhausted.

With `store_url` (postgresql://...) they are stored in that database instead, and any number of
`Spaces` (replicas, each its own `replica_id`) share them: any of them reads a space or run,
resumes or cancels a run, wherever it started. A run executes on the replica that started or
resumed it, which holds its lease and renews it every third of `lease_s`; each replica also
sweeps: a run whose lease expired (its replica is gone) is failed as a restart fails it. Another
replica sees an executing run as "running" with the events of its earlier segments, and cancels
it through the store (the owner notices at its next renewal).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, cast

from ..base.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ..base.sqlite import Durability
from ..config import DEFAULT_LEASE_TTL_S, DEFAULT_MAX_SPACE_RUNS, DEFAULT_MAX_SPACES
from ..tools.registry import ToolRegistry
from .policies import DEFAULT_PRESET, PolicySpec, SpacePolicy, build_policy
from .runner import BatchRunner, Outcome, RunStatus, error_event, policy_denied_event, timestamp
from .storage import LeasedSpacesStorage, RunRecord, SpaceRecord, SpacesStorage
from .store import SpacesStore
from .validation import PROTOCOL_VERSION, check_message

log = logging.getLogger(__name__)
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a space's id and a run's id are made of (a run's: `run_` and hex digits)."""
_POLL_S = 0.1  # how often a cancel waits to see a run on another replica end


class RunResult(TypedDict):
    """The protocol's events message."""

    protocolVersion: str
    runId: str
    status: RunStatus
    events: list[dict[str, Any]]


@dataclass(frozen=True)
class Space:
    id: str
    workspace: Path
    policy: SpacePolicy
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "spaceId": self.id,
            "workspace": str(self.workspace),
            "policy": self.policy.spec,
            "createdAt": self.created_at,
        }


@dataclass(frozen=True)
class _Approval:
    decision: Literal["approved", "denied"]
    operation_id: str | None  # None when given as a userMessage: it answers whatever is pending
    reason: str | None
    message: str | None  # the userMessage's content


@dataclass
class _ActiveRun:
    """A run executing in this process; its events of earlier segments are stored from seq 0."""

    runner: BatchRunner
    first_seq: int
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Spaces:
    """Spaces and their runs: start, inspect, approve or deny, and cancel."""

    def __init__(
        self,
        data_dir: Path,
        registry: ToolRegistry,
        env: Callable[[], dict[str, str]] | None = None,
        max_runs: int = DEFAULT_MAX_SPACE_RUNS,
        max_spaces: int = DEFAULT_MAX_SPACES,
        durability: Durability = "full",
        store_url: str = "",
        replica_id: str = "",
        lease_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self._data_dir = Path(data_dir)
        self._registry = registry
        self._env = env or dict
        self._max_runs = max_runs
        self._max_spaces = max_spaces
        self._running = 0  # runs started or resumed and not yet ended, including those still setting up
        self._store: SpacesStorage
        self._leases: LeasedSpacesStorage | None = None  # the store, when replicas share it
        if store_url:
            from .postgres_store import PostgresSpacesStore  # psycopg is loaded only for it

            self._store = self._leases = PostgresSpacesStore(store_url, replica_id, round(lease_s * 1000))
        else:
            self._store = SpacesStore(self._data_dir / "spaces.db", durability)
        self._upkeep: asyncio.Task[None] | None = None
        self._spaces: dict[str, Space] = {}
        self._active: dict[str, _ActiveRun] = {}

    async def open(self) -> None:
        await self._store.open()
        await self._store.fail_running(_interrupted(), timestamp())
        if self._leases is not None:
            self._upkeep = asyncio.create_task(self._keep_leases(self._leases))

    async def close(self) -> None:
        """Cancel the runs executing here (killing their commands), then close the store."""
        active = list(self._active.values())
        for run in active:
            run.runner.cancel()
        for run in active:
            await run.done.wait()
        if self._upkeep is not None:
            self._upkeep.cancel()
            with suppress(asyncio.CancelledError):
                await self._upkeep
        await self._store.close()

    # --- spaces -----------------------------------------------------------------------------------

    async def create_space(
        self, space_id: str | None = None, workspace: Path | None = None, policy: PolicySpec = DEFAULT_PRESET
    ) -> Space:
        """A new space: in `workspace` (an existing directory, e.g. a session's), else in a
        directory of its own, `<data_dir>/spaces/<spaceId>/workspace`."""
        if space_id is None:
            space_id = "space_" + secrets.token_hex(8)
        _check_id(space_id, "spaceId")
        built = build_policy(policy)
        if workspace is None:
            directory = self._data_dir.resolve() / "spaces" / space_id / "workspace"
        else:
            directory = _existing_directory(workspace)
        record = SpaceRecord(space_id, str(directory), built.spec, timestamp())
        if not await self._store.insert_space(record, self._max_spaces):
            raise ResourceExhausted(
                f"the store keeps {self._max_spaces} Agent Spaces already, the server's limit (A3S_MAX_SPACES):"
                " delete spaces no longer needed (DELETE /v1/spaces/{spaceId}) or raise the limit"
            )
        directory.mkdir(parents=True, exist_ok=True)
        space = Space(space_id, directory, built, record.created_at)
        self._spaces[space_id] = space
        return space

    async def get_space(self, space_id: str) -> Space:
        """The space, read from the store each time (another replica may have deleted it); its
        policy is built once."""
        _check_id(space_id, "spaceId")
        record = await self._store.get_space(space_id)
        if record is None:
            self._spaces.pop(space_id, None)
            raise NotFound(f"space {space_id!r} does not exist")
        space = self._spaces.get(space_id)
        if space is None:
            space = Space(record.id, Path(record.workspace), build_policy(record.policy), record.created_at)
            self._spaces[space_id] = space
        return space

    async def delete_space(self, space_id: str) -> None:
        """Delete the space with its runs and their events (one awaiting approval is dropped), and
        the directory the space made for itself; never a workspace it was given. FailedPrecondition
        while one of its runs executes."""
        _check_id(space_id, "spaceId")
        record = await self._store.get_space(space_id)
        outcome = await self._store.delete_space(space_id)
        if outcome == "missing" or record is None:
            raise NotFound(f"space {space_id!r} does not exist")
        if outcome == "running":
            raise FailedPrecondition(
                f"space {space_id!r} has a run executing: cancel it, then delete the space"
            )
        self._spaces.pop(space_id, None)
        own = self._data_dir.resolve() / "spaces" / space_id
        if Path(record.workspace) == own / "workspace":
            await asyncio.to_thread(shutil.rmtree, own, ignore_errors=True)

    # --- runs -------------------------------------------------------------------------------------

    async def start_run(self, space_id: str, operations_message: Any) -> RunResult:
        """Run an operations message; returns its events (status completed, awaiting_approval...).

        MessageInvalid (an InvalidArgument) when the message as a whole is malformed.
        """
        operations = check_message(operations_message)
        with self._run_slot():
            space = await self.get_space(space_id)
            run_id = "run_" + secrets.token_hex(8)
            now = timestamp()
            await self._store.insert_run(
                RunRecord(run_id, space.id, "running", space.policy.spec, None, 0, now, now)
            )
            return await self._execute(
                run_id, space, space.policy, operations, offset=0, approved=False, first_seq=0
            )

    async def get_run(self, space_id: str, run_id: str) -> RunResult:
        """The run with every event so far; status "running" while it executes."""
        record, events = await self._run_record(space_id, run_id, with_events=True)
        active = self._active.get(run_id)
        if active is not None:
            return _result(run_id, "running", events[: active.first_seq] + active.runner.events)
        return _result(run_id, cast(RunStatus, record.status), events)

    async def resume_run(self, space_id: str, run_id: str, approval: Mapping[str, Any]) -> RunResult:
        """Answer the pending approval and go on; returns the events of this resumption.

        `approval` is {"operationId", "decision": "approved" | "denied", "reason"?}, or a
        userMessage {"type": "userMessage", "content": "approved" | "denied"}. Approved runs the
        operation and the rest; denied records a policyDenied event for it and runs the rest.
        """
        answer = _parse_approval(approval)
        with self._run_slot():
            return await self._resume(space_id, run_id, answer)

    async def _resume(self, space_id: str, run_id: str, answer: _Approval) -> RunResult:
        record, _ = await self._run_record(space_id, run_id)
        if run_id in self._active or record.status != "awaiting_approval" or record.pending is None:
            status = "running" if run_id in self._active else record.status
            raise FailedPrecondition(
                f"run {run_id!r} is {status}, not awaiting approval; there is nothing to resume"
            )
        pending = record.pending
        if answer.operation_id is not None and answer.operation_id != pending["operationId"]:
            raise InvalidArgument(
                f"run {run_id!r} awaits approval of operation {pending['operationId']!r}, "
                f"not {answer.operation_id!r}"
            )
        space = await self.get_space(space_id)
        if not await self._store.claim_run(run_id, "awaiting_approval", "running", timestamp()):
            raise FailedPrecondition(f"run {run_id!r} is no longer awaiting approval")
        events: list[dict[str, Any]] = []
        if answer.message is not None:
            events.append({"type": "userMessage", "timestamp": timestamp(), "content": answer.message})
        operations, offset = pending["operations"], pending["offset"]
        if answer.decision == "denied":
            reason = "Denied by the user" + (f": {answer.reason}" if answer.reason else "")
            events.append(policy_denied_event(operations[0], pending["operationId"], reason))
            operations, offset = operations[1:], offset + 1
        return await self._execute(
            run_id,
            space,
            build_policy(record.policy),
            operations,
            offset=offset,
            approved=answer.decision == "approved",
            first_seq=record.event_count,
            events=events,
        )

    async def cancel_run(self, space_id: str, run_id: str) -> RunResult:
        """Stop a running run (killing its command) or drop one awaiting approval; returns the run."""
        record, _ = await self._run_record(space_id, run_id)
        if run_id not in self._active and record.status == "awaiting_approval":
            if await self._store.claim_run(run_id, "awaiting_approval", "cancelled", timestamp()):
                return await self.get_run(space_id, run_id)
            record, _ = await self._run_record(space_id, run_id)
        active = self._active.get(run_id)
        if active is not None:
            active.runner.cancel()
            await active.done.wait()
            return await self.get_run(space_id, run_id)
        if (
            self._leases is not None
            and record.status == "running"
            and await self._leases.request_cancel(run_id)
        ):
            return await self._ended(space_id, run_id, self._leases.lease_ms)
        raise FailedPrecondition(
            f"run {run_id!r} is {record.status}; only a running run or one awaiting approval can be cancelled"
        )

    # --- internals --------------------------------------------------------------------------------

    async def _keep_leases(self, leases: LeasedSpacesStorage) -> None:
        """Every third of a lease: renew the leases of the runs executing here (stopping those lost
        or asked to cancel elsewhere), and fail the runs of any replica whose lease expired."""
        while True:
            await asyncio.sleep(leases.lease_ms / 3000)
            try:
                for run_id in await leases.renew(list(self._active)):
                    active = self._active.get(run_id)
                    if active is not None:
                        active.runner.cancel()
                swept = await leases.fail_running(_interrupted(), timestamp())
            except Exception:  # the database out of reach: try again at the next tick
                log.warning("spaces: could not renew run leases or sweep", exc_info=True)
                continue
            if swept:
                log.warning("spaces: %d runs of replicas that stopped renewing their leases failed", swept)

    async def _ended(self, space_id: str, run_id: str, lease_ms: int) -> RunResult:
        """The run once it has left "running": its owner stops it within a third of a lease, or, if
        the owner is gone, a sweep fails it once the lease expires. Had it paused for an approval
        meanwhile, that is dropped."""
        deadline = asyncio.get_running_loop().time() + 2 * lease_ms / 1000
        while True:
            result = await self.get_run(space_id, run_id)
            if result["status"] == "awaiting_approval":
                return await self.cancel_run(space_id, run_id)
            if result["status"] != "running":
                return result
            if asyncio.get_running_loop().time() > deadline:
                raise Unavailable(f"run {run_id!r} was asked to cancel, but its replica has not ended it yet")
            await asyncio.sleep(_POLL_S)

    @contextmanager
    def _run_slot(self) -> Iterator[None]:
        """One of the `max_runs` runs that may execute at once; RESOURCE_EXHAUSTED beyond them."""
        if self._running >= self._max_runs:
            raise ResourceExhausted(
                f"{self._max_runs} Agent Spaces runs are already running, the server's limit "
                "(A3S_MAX_SPACE_RUNS); try again when one has ended"
            )
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1

    async def _run_record(
        self, space_id: str, run_id: str, *, with_events: bool = False
    ) -> tuple[RunRecord, list[Any]]:
        _check_id(run_id, "runId")
        found = await self._store.get_run(run_id, with_events=with_events)
        if found is None or found[0].space_id != space_id:
            raise NotFound(f"run {run_id!r} does not exist in space {space_id!r}")
        return found

    async def _execute(
        self,
        run_id: str,
        space: Space,
        policy: SpacePolicy,
        operations: Sequence[Any],
        *,
        offset: int,
        approved: bool,
        first_seq: int,
        events: list[dict[str, Any]] | None = None,
    ) -> RunResult:
        runner = BatchRunner(self._registry, space.workspace, policy, self._env(), events)
        active = _ActiveRun(runner, first_seq)
        self._active[run_id] = active
        try:
            try:
                outcome = await runner.run(operations, offset=offset, approved=approved)
            except asyncio.CancelledError:
                # The caller went away: the run ends cancelled instead of staying "running".
                await asyncio.shield(self._save(run_id, Outcome("cancelled"), operations, offset, active))
                raise
            saved = await self._save(run_id, outcome, operations, offset, active)
        finally:
            del self._active[run_id]
            active.done.set()
        if saved:
            return _result(run_id, outcome.status, runner.events)
        log.warning(
            "spaces: run %s lost its lease (not renewed in time: the store out of reach, or this "
            "process stalled) and another replica failed it; its last operations' events are not recorded",
            run_id,
        )
        return await self.get_run(space.id, run_id)

    async def _save(
        self, run_id: str, outcome: Outcome, operations: Sequence[Any], offset: int, active: _ActiveRun
    ) -> bool:
        """One transaction: the segment's events, the status and, when paused, what is left to run."""
        pending = None
        if outcome.status == "awaiting_approval":
            at = outcome.paused_at or 0
            pending = {
                "offset": offset + at,
                "operations": list(operations[at:]),
                "operationId": outcome.operation_id,
            }
        return await self._store.save_segment(
            run_id, outcome.status, pending, active.runner.events, active.first_seq, timestamp()
        )


def _check_id(value: object, field: str) -> None:
    """InvalidArgument unless `value` is an id a space or run can have, checked before the store
    sees it (PostgreSQL fails on a NUL in text where SQLite finds nothing)."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise InvalidArgument(f"{field} must be 1 to 64 letters, digits, '_' or '-', not {value!r:.120}")


def _interrupted() -> dict[str, Any]:
    return error_event("system", "The run was interrupted: the server stopped while it ran")


def _existing_directory(workspace: Path) -> Path:
    directory = Path(workspace).expanduser().resolve()
    if not directory.is_dir():
        raise InvalidArgument(f"workspace {str(workspace)!r} is not an existing directory")
    return directory


def _parse_approval(approval: Any) -> _Approval:
    if not isinstance(approval, Mapping):
        raise InvalidArgument("approval must be an object: {operationId, decision, reason?}")
    if approval.get("type") == "userMessage":
        content = approval.get("content")
        decision = content.strip().lower() if isinstance(content, str) else None
        if decision not in ("approved", "denied"):
            raise InvalidArgument(
                f'a userMessage answering an approval must say "approved" or "denied", not {content!r}'
            )
        return _Approval("approved" if decision == "approved" else "denied", None, None, content)
    operation_id, decision, reason = (
        approval.get("operationId"),
        approval.get("decision"),
        approval.get("reason"),
    )
    if not isinstance(operation_id, str):
        raise InvalidArgument("approval.operationId is required: the id of the operation awaiting approval")
    if decision not in ("approved", "denied"):
        raise InvalidArgument(f'approval.decision must be "approved" or "denied", not {decision!r}')
    if reason is not None and not isinstance(reason, str):
        raise InvalidArgument("approval.reason must be a string")
    return _Approval(decision, operation_id, reason, None)


def _result(run_id: str, status: RunStatus, events: list[dict[str, Any]]) -> RunResult:
    return {"protocolVersion": PROTOCOL_VERSION, "runId": run_id, "status": status, "events": events}
