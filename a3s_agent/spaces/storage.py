"""What the Agent Spaces service keeps: spaces, runs and their events, and the protocol of a store
that keeps them. Two implement it: `store.py` (SQLite, `<data_dir>/spaces.db`, one process) and
`postgres_store.py` (PostgreSQL, any number of replicas on one database).

With several processes on one store (`LeasedSpacesStorage`) a run is leased to the process
executing it: the owner renews the lease while the run executes, and a run whose lease expired
was left by a process that is gone, which `fail_running` ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class SpaceRecord:
    id: str
    workspace: str
    policy: dict[str, Any]
    created_at: str


@dataclass(frozen=True)
class RunRecord:
    id: str
    space_id: str
    status: str
    policy: dict[str, Any]
    # While awaiting approval: {"offset", "operations" (the rest of the batch), "operationId"}.
    pending: dict[str, Any] | None
    event_count: int
    created_at: str
    updated_at: str


SpaceDeletion = Literal["deleted", "missing", "running"]


class SpacesStorage(Protocol):
    async def open(self) -> None:
        """Connect, migrating the schema up."""

    async def close(self) -> None: ...

    async def insert_space(self, space: SpaceRecord, most: int) -> bool:
        """Insert the space unless the store holds `most` spaces already (False then, counted in
        the same transaction, so concurrent inserts never pass the limit together); AlreadyExists
        when a space has the id."""

    async def get_space(self, space_id: str) -> SpaceRecord | None: ...

    async def delete_space(self, space_id: str) -> SpaceDeletion:
        """Delete the space with its runs and their events at once, unless one of its runs is
        running ("running": nothing deleted); "missing" when there is no such space."""

    async def insert_run(self, run: RunRecord) -> None:
        """A new run (no events, nothing pending); a `running` one is leased to this process.
        NotFound when its space is gone (deleted meanwhile, perhaps by another process)."""

    async def get_run(self, run_id: str, *, with_events: bool = False) -> tuple[RunRecord, list[Any]] | None:
        """The run and, if asked, its events in order; None when there is no such run."""

    async def claim_run(self, run_id: str, expected: str, status: str, updated_at: str) -> bool:
        """Move the run from `expected` to `status` (dropping a pending approval; to `running`, leased
        to this process); False if it was not in `expected`."""

    async def save_segment(
        self,
        run_id: str,
        status: str,
        pending: dict[str, Any] | None,
        events: Sequence[Any],
        first_seq: int,
        updated_at: str,
    ) -> bool:
        """Record how an execution segment ended and its events, numbered from `first_seq`, at once;
        False (nothing written) when the run is no longer this process's to end: its lease expired
        and another process failed it."""

    async def fail_running(self, event: dict[str, Any], updated_at: str) -> int:
        """Mark the runs left `running` by a process that is gone as `error`, adding `event` to
        each; how many. One process: every running run (call it before running any). Leased: the
        runs whose lease expired."""


class LeasedSpacesStorage(SpacesStorage, Protocol):
    """A store several processes share: a running run is leased to the process executing it."""

    # How long a lease lasts unless renewed (ms); the service renews and sweeps well within it.
    lease_ms: int

    async def renew(self, run_ids: Sequence[str]) -> set[str]:
        """Extend the leases of this process's runs `run_ids`; those of them to stop: the lease was
        lost, or another process asked for the run to be cancelled (`request_cancel`)."""

    async def request_cancel(self, run_id: str) -> bool:
        """Ask the process executing the run to cancel it (its `renew` reports it); False when the
        run is not running."""
