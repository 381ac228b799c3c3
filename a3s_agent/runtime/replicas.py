"""Many processes on one store: the lease that makes one replica the owner of a session's running
generation (renewed while it runs, fencing every write of that run), control sent to the owner
wherever it arrives, the takeover of runs whose owner stopped, and the event log's retention.

On SQLite one process uses the store, so every lease is this process's and control never leaves
it; the same code runs. A lease left by a process that was killed is taken over when the next
server starts, once it finds no other process using the data directory (datadir.DataDirLock);
else after it expires, like any other.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from ..base import errors, telemetry
from ..base.errors import AgentError, NotFound, Unavailable
from ..core.loop.chunks import failure_entry
from ..core.loop.repair import answer_interrupted_calls
from ..core.sessions.manager import SessionManager
from ..core.store.events import EventBus, EventType, event_entry, now_ms
from ..core.store.protocol import Lease, LeaseLost, LogEntry, Store

log = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 10.0  # how long a replica waits for the owner of a run to answer
POLL_S = 0.05  # first wait between tries for a lease another replica holds (doubling up to 0.5 s)
PRUNE_EVERY_S = 600.0

Handler = Callable[[str, dict[str, Any]], Coroutine[Any, Any, Any]]


class Replicas:
    def __init__(
        self,
        store: Store,
        bus: EventBus,
        sessions: SessionManager,
        *,
        replica_id: str,
        lease_ttl_s: float,
        retention_hours: float,
        retention_count: int,
    ) -> None:
        self.id = replica_id
        self._store = store
        self._bus = bus
        self._sessions = sessions
        self._ttl_ms = max(1, int(lease_ttl_s * 1000))
        self._retention_ms = int(retention_hours * 3_600_000)
        self._retention_count = retention_count
        self._held: dict[str, Lease] = {}
        self._renewers: dict[str, asyncio.Task[None]] = {}
        self._handlers: dict[str, Handler] = {}
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._serving: set[asyncio.Task[Any]] = set()  # control messages being handled
        self.on_lost: Callable[[str], None] = lambda _: None  # told when a run's lease was lost

    @property
    def leases_held(self) -> int:
        """Runs whose lease this replica holds now."""
        return len(self._held)

    def fence_for(self, session_id: str) -> int | None:
        lease = self._held.get(session_id)
        return None if lease is None else lease.token

    def handle(self, action: str, handler: Handler) -> None:
        """Serve `action` for runs this replica owns: handler(session_id, args) -> JSON-ready result."""
        self._handlers[action] = handler

    async def start(self, alone: bool = False) -> None:
        """Listen on the store's channel and end the runs of replicas that stopped: before serving,
        those whose lease expired, the runs this replica's id held before a restart (replica ids
        are unique among the running ones) and, when `alone` (no other process uses the store, and
        none that did still runs), every run left in it; later, each run whose lease expires."""
        left = await self._store.expire_leases(None if alone else self.id)
        if left:
            log.warning(
                "%d run(s) left by a server that ended are ended now, not when their lease expires", left
            )
        await self._store.listen(self._bus.deliver, self._on_control)
        await self._take_over_expired()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._take_over_loop()), loop.create_task(self._prune_loop())]

    async def close(self) -> None:
        for task in [*self._tasks, *self._renewers.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._renewers.values(), return_exceptions=True)
        self._tasks.clear()

    # --- leases ------------------------------------------------------------------------------

    @asynccontextmanager
    async def own(self, session_id: str, run_id: str) -> AsyncIterator[list[LogEntry]]:
        """Hold the session's lease for the body (waiting while another replica's run holds it).
        The entries the body puts in the list it is given (a run's DONE chunk) are logged in the
        transaction that releases the lease, after the session's queued ones (the run's last
        events): nobody is told the run ended before it let go of the session."""
        lease = await self._acquire(session_id, run_id, telemetry.current_traceparent())
        self._held[session_id] = lease
        self._renewers[session_id] = asyncio.get_running_loop().create_task(self._renew(lease))
        closing: list[LogEntry] = []
        try:
            await self._sessions.refresh(session_id)  # another replica may have written it last
            yield closing
        finally:
            renewer = self._renewers.pop(session_id, None)
            # The renewer only returns when the lease is lost (it is cancelled otherwise).
            lost = renewer is not None and renewer.done() and not renewer.cancelled()
            if renewer is not None:
                renewer.cancel()
            try:  # the run's last entries, fenced by its lease, in the transaction that ends it
                await self._bus.write(
                    session_id, closing, lambda entries: self._store.release_lease(lease, entries)
                )
            finally:
                self._held.pop(session_id, None)
            if lost:  # however the run stopped: the replica that took it over ended its stream
                raise LeaseLost(f"session {session_id!r}: another replica took the run over")

    async def _acquire(self, session_id: str, run_id: str, trace: str) -> Lease:
        wait = POLL_S
        while True:
            lease = await self._store.acquire_lease(session_id, self.id, run_id, self._ttl_ms, trace)
            if lease is not None:
                return lease
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.5)
            await self._sessions.refresh(session_id)
            self._sessions.get(session_id)  # NotFound once it was destroyed meanwhile

    async def _renew(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(self._ttl_ms / 3000)
            try:
                renewed = await self._store.renew_lease(lease, self._ttl_ms)
            except Exception:
                log.warning(
                    "could not renew the lease of session %s; trying again", lease.session_id, exc_info=True
                )
                continue
            if renewed is None:
                log.error("lost the lease of session %s: another replica took its run over", lease.session_id)
                # The stale lease stays held until the run ends: what it writes meanwhile (its
                # answers to open calls as it stops) carries the stale token and is refused.
                self.on_lost(lease.session_id)
                return
            lease = renewed

    # --- control sent to the owner -------------------------------------------------------------

    async def route(self, session_id: str, action: str, args: dict[str, Any], runs_here: bool) -> Any:
        """Run `action` where the session's generation runs: here when `runs_here` or when no
        other replica holds a live lease on it; else on the owner, waiting for its answer."""
        if not runs_here and self._store.shared:
            lease = await self._store.lease_of(session_id)
            if lease is not None and lease.owner != self.id and lease.expires_at >= now_ms():
                return await self._ask(lease.owner, session_id, action, args)
        return await self._handlers[action](session_id, args)

    async def _ask(self, owner: str, session_id: str, action: str, args: dict[str, Any]) -> Any:
        request_id = uuid.uuid4().hex
        reply = asyncio.get_running_loop().create_future()
        self._replies[request_id] = reply
        message = {"to": owner, "from": self.id, "id": request_id, "action": action, "session_id": session_id}
        try:
            await self._store.send_control({**message, "args": args})
            answer = await asyncio.wait_for(reply, CONTROL_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(
                f"replica {owner!r}, which runs session {session_id!r}'s generation, did not answer"
                f" {action} within {CONTROL_TIMEOUT_S:g} s"
            ) from None
        finally:
            self._replies.pop(request_id, None)
        if answer.get("error"):
            kind, text = answer["error"]
            found = getattr(errors, kind, AgentError)
            raise (found if isinstance(found, type) and issubclass(found, AgentError) else AgentError)(text)
        return answer.get("result")

    async def broadcast(self, action: str) -> None:
        """Tell every other replica to run `action` (for the server-wide state, e.g. Initialize)."""
        if self._store.shared:
            await self._store.send_control({"to": "*", "from": self.id, "action": action})

    def _on_control(self, message: dict[str, Any]) -> None:
        if message.get("to") == "*" and message.get("from") != self.id:
            handler = self._handlers.get(message.get("action", ""))
            if handler is not None:
                self._spawn(handler("", {}))
            return
        if message.get("to") != self.id:
            return
        if "reply" in message:
            waiter = self._replies.get(message["reply"])
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
            return
        self._spawn(self._serve(message))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, message: dict[str, Any]) -> None:
        answer: dict[str, Any] = {"to": message["from"], "reply": message["id"]}
        handler = self._handlers.get(message.get("action", ""))
        try:
            if handler is None:
                raise NotFound(f"no control action {message.get('action')!r}")
            answer["result"] = await handler(message["session_id"], message.get("args", {}))
        except AgentError as exc:
            answer["error"] = [type(exc).__name__, str(exc)]
        except Exception as exc:
            log.exception("control action %s failed", message.get("action"))
            answer["error"] = ["AgentError", f"{message.get('action')} failed on replica {self.id}: {exc}"]
        await self._store.send_control(answer)

    # --- takeover and retention ----------------------------------------------------------------

    async def _take_over_loop(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_ms / 2000)
            await self._take_over_expired()

    async def _take_over_expired(self) -> None:
        try:
            for lease in await self._store.expired_leases():
                if lease.session_id not in self._held:
                    await self.take_over(lease)
        except Exception:
            log.exception("could not check for runs whose replica stopped")

    async def take_over(self, stale: Lease) -> bool:
        """End the run of a replica that stopped renewing its lease: answer its open tool calls,
        end its stream for whoever resumes it, and report it. False when another replica was first."""
        session_id = stale.session_id
        lease = await self._store.acquire_lease(session_id, self.id, stale.run_id, self._ttl_ms, stale.trace)
        if lease is None:
            return False
        self._held[session_id] = lease
        # In the trace the run was started in, when it was traced (on whichever replica).
        carrier = {"traceparent": stale.trace} if stale.trace else None
        attributes = {
            "gen_ai.conversation.id": session_id,
            "a3s.run.id": stale.run_id,
            "a3s.replica.id": self.id,
            "a3s.replica.previous_owner": stale.owner,
        }
        try:
            with telemetry.span("take_over_run", attributes, carrier=carrier):
                await self._end_stale_run(stale)
        finally:
            self._held.pop(session_id, None)
            await self._store.release_lease(lease)
        return True

    async def _end_stale_run(self, stale: Lease) -> None:
        session_id = stale.session_id
        await self._sessions.refresh(session_id)
        reason = f"the replica running it ({stale.owner}) stopped"
        try:
            await answer_interrupted_calls(self._sessions, session_id)
        except NotFound:
            pass  # the session is gone: only its log is left to end
        self._bus.submit(
            failure_entry(session_id, stale.run_id, Unavailable(f"the generation ended: {reason}"))
        )
        self._bus.submit(
            event_entry(EventType.ERROR, session_id, f"generation failed: {reason}", {"run_id": stale.run_id})
        )
        await self._bus.flush()
        log.warning("took over session %s: its generation ended because %s", session_id, reason)

    async def _prune_loop(self) -> None:
        while True:
            try:
                removed = await self._store.prune_log(now_ms() - self._retention_ms, self._retention_count)
                if removed:
                    log.info("event log retention removed %d entries", removed)
            except Exception:
                log.exception("could not apply the event log's retention")
            await asyncio.sleep(PRUNE_EVERY_S)
