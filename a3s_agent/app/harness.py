"""The A3S headless harness protocol's operations: runs started, cancelled, recovered and steered
by a caller-chosen run id, their events as pages, and each run's git change set (trees of the
workspace's shadow repository, which checkpoints use too: the user's `.git` is never written).

A harness run is an ordinary generation of an ordinary session (runtime/runs.py, as Generate's):
gRPC and REST see the session, its history and its log. The harness's session id is ours when it
is a valid id of ours (`[A-Za-z0-9._:-]{1,128}`), else `harness-` and 40 hex digits of its SHA-256.
A run's events are its chunks in the session's durable log, in A3S's turns (harness_runs.py),
numbered from 0 after a first `agent_start`. Each run's record (its prompt, state, where its
chunks are, its git trees) is in the store (core/store/protocol.py `*_harness_run`), so that a host
retrying after a restart gets a replay, not a second run. A run whose process died once its generation began is failed when the lease
of its generation is taken over (runtime/replicas.py; at the next start on the same data
directory): its record names the generation's run id from its admission. One that died before
its generation began stays as it was (cancel: 409 run_unavailable) until it is recovered. A
cancel that reaches a replica other than the one running the run is carried out by that one
(runtime/replicas.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..base.errors import AgentError, Cancelled, NotFound, ResourceExhausted
from ..base.models import Message, SessionConfig
from ..core.loop.agent import DoneEvent, GenerateOptions
from ..core.sessions.manager import SESSION_ID_PATTERN
from ..core.store.events import CHUNK, now_ms
from ..runtime import Runtime
from ..tools.safe_git import repository_trees
from ..tools.shadow_repo import ShadowUnavailable
from .harness_events import bounded, chunk_event, entry_call, entry_kind, event_call, event_kind
from .harness_runs import TERMINAL, EventItem, Registry, RunRecord
from .harness_types import ChangeSet, Command, EventRecord, HarnessRefusal, Identity, Page, Receipt

MAX_SESSIONS = 1024
LOG_READ = 500  # log entries read at a time
CANCEL_ACTION = "harness_cancel"  # the control action a replica asks the run's owner to carry out

_REGISTRIES: weakref.WeakKeyDictionary[Runtime, Registry] = weakref.WeakKeyDictionary()


def our_session_id(session_id: str) -> str:
    """The session a harness session id names (see the module's docstring)."""
    if SESSION_ID_PATTERN.fullmatch(session_id):
        return session_id
    return "harness-" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def _resume_prompt(checkpoint_run_id: str) -> str:
    return f"<resume run={checkpoint_run_id}>"


class Harness:
    """The protocol's operations over one runtime (their runs are the runtime's: two services over
    one runtime see the same runs). Run records are in the store: a replayed command, a page or a
    change set after a restart answers as before it."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        registry = _REGISTRIES.get(runtime)
        if registry is None:
            registry = _REGISTRIES[runtime] = Registry()
            runtime.on_close.append(registry.stop)
            runtime.replicas.handle(CANCEL_ACTION, self._cancel_owned)
        self._reg = registry

    def check_release(self, identity: Identity) -> None:
        wanted = self._rt.settings.release_identity
        if wanted and identity.release != wanted:
            raise HarnessRefusal("release_mismatch")

    # --- commands ------------------------------------------------------------------------------

    async def command(self, command: Command) -> Receipt:
        self.check_release(command.identity)
        if command.action == "cancel":
            return await self._cancel(command.identity)
        if command.action == "steer":
            return await self._steer(command)
        prompt = command.argument
        if command.action == "recover":
            if command.argument == command.identity.run_id:
                raise HarnessRefusal("invalid_field")
            prompt = _resume_prompt(command.argument)
        async with self._reg.lock:  # admission is atomic here; the store makes it so across replicas
            return await self._admit(command, prompt)

    async def _admit(self, command: Command, prompt: str) -> Receipt:
        identity = command.identity
        session_id = our_session_id(identity.session_id)
        known = await self._find(session_id, identity.run_id)
        if known is not None:
            return self._replay(known, prompt)
        if any(
            r.session_id == session_id and r.live and r.state not in TERMINAL for r in self._reg.runs.values()
        ):
            raise HarnessRefusal("SESSION_BUSY")
        messages = [Message(role="user", content=prompt)]
        if command.action == "recover":
            if await self._find(session_id, command.argument) is None:
                raise HarnessRefusal("SESSION_ERROR")  # no such run to resume in this session
            messages = [Message(role="user", content=_continue_text(command.argument))]
        workspace = await self._session(session_id)
        if self._rt.control.of(session_id).run_task is not None:  # a generation of another face
            raise HarnessRefusal("SESSION_BUSY")
        _, after_seq = await self._rt.store.log_bounds(session_id)
        # The generation's run id is chosen now and stored with the admission: whenever the process
        # dies, the record names the run's chunks, and the takeover's end of them is found again.
        chunk_run = f"run_{uuid.uuid4().hex}"
        run = RunRecord(session_id, identity.run_id, prompt, str(workspace), after_seq, chunk_run=chunk_run)
        run.base_tree = await self._tree(run, "base")
        existing = await self._rt.store.reserve_harness_run(session_id, identity.run_id, run.record())
        if existing is not None:  # another replica admitted it first
            return self._replay(await self._loaded(session_id, identity.run_id, existing), prompt)
        self._reg.runs[(session_id, identity.run_id)] = run
        run.task = asyncio.get_running_loop().create_task(self._execute(run, messages))
        self._reg.tasks.add(run.task)
        run.task.add_done_callback(self._reg.tasks.discard)
        return Receipt(run.state, len(run.items), run.observed(), False)

    @staticmethod
    def _replay(run: RunRecord, prompt: str) -> Receipt:
        if run.prompt != prompt:
            raise HarnessRefusal("RUN_IDENTITY_CONFLICT")
        return Receipt(run.state, len(run.items), run.observed(), True)

    async def _find(self, session_id: str, run_id: str) -> RunRecord | None:
        """The run run here or already final, else from its stored record (which another replica,
        or an earlier process, wrote)."""
        run = self._reg.runs.get((session_id, run_id))
        if run is not None:
            return run
        record = await self._rt.store.load_harness_run(session_id, run_id)
        return None if record is None else await self._loaded(session_id, run_id, record)

    async def _loaded(self, session_id: str, run_id: str, record: dict[str, Any]) -> RunRecord:
        """A stored run with its events found again in the log; kept in memory once it is final
        (ended and its changes captured), until then read again on every request."""
        run = RunRecord.from_record(session_id, run_id, record)
        await self._reread(run)
        if run.state in TERMINAL and (run.base_tree is None or run.result_tree is not None):
            return self._reg.runs.setdefault((session_id, run_id), run)
        return run

    async def _reread(self, run: RunRecord) -> None:
        """The events of a run of an earlier process, from the log; its end, if the log has it."""
        if run.failure:
            run.items.append(EventItem(None, ("error", {"message": run.failure}), run.updated_at))
        if not run.chunk_run:
            return
        after, store = run.after_seq, self._rt.store
        while entries := await store.read_log(run.session_id, after, LOG_READ):
            for entry in entries:
                if entry.kind == CHUNK and entry.body.get("run") == run.chunk_run:
                    run.add_chunk(entry.seq, entry_kind(entry.body), entry_call(entry.body))
                    if "failed" in entry.body:
                        cancelled = entry.body["failed"]["kind"] == Cancelled.__name__
                        run.touch("cancelled" if cancelled else "failed")
                    elif "done" in entry.body["chunk"]:
                        run.touch("completed")
            after = entries[-1].seq

    async def _session(self, session_id: str) -> Path:
        """The session's workspace; the session is created when it does not exist."""
        sessions = self._rt.sessions
        await sessions.refresh(session_id)
        try:
            session = sessions.get(session_id)
        except NotFound:
            if session_id not in self._reg.sessions and len(self._reg.sessions) >= MAX_SESSIONS:
                raise HarnessRefusal("session_capacity") from None
            try:
                session = await sessions.create(session_id, SessionConfig(), [])
            except ResourceExhausted:
                raise HarnessRefusal("session_capacity") from None
        self._reg.sessions.add(session_id)
        return Path(session.config.workspace or self._rt.workspace)

    async def _cancel(self, identity: Identity) -> Receipt:
        run = await self._run(identity)
        if run.state in TERMINAL:
            return Receipt(run.state, len(run.items), run.observed(), True)
        if run.live:
            return await self._cancel_here(run)
        # Run by the replica that holds the session's lease, or by none (an earlier process's run).
        answer = await self._rt.replicas.route(
            run.session_id, CANCEL_ACTION, {"run_id": run.run_id}, runs_here=False
        )
        if "refused" in answer:
            raise HarnessRefusal(answer["refused"])
        return Receipt(**answer)

    async def _cancel_owned(self, session_id: str, args: dict[str, Any]) -> dict[str, Any]:
        """CANCEL_ACTION for a run of this process's (asked by another replica, or by this one when
        no replica holds the session's lease): the receipt, or the refusal's code."""
        run = self._reg.runs.get((session_id, args["run_id"]))
        if run is not None and run.state in TERMINAL:
            return asdict(Receipt(run.state, len(run.items), run.observed(), True))
        if run is None or not run.live:
            return {"refused": "run_unavailable"}  # an earlier process's: recover it instead
        return asdict(await self._cancel_here(run))

    async def _cancel_here(self, run: RunRecord) -> Receipt:
        run.cancel_asked = True
        run.touch("cancelled")
        await self._save(run)
        self._rt.control.cancel(run.session_id, None)
        return Receipt(run.state, len(run.items), run.observed(), False)

    async def _steer(self, command: Command) -> Receipt:
        """The run's generation takes `input` in at its next safe point (core/loop/steering.py),
        named by the command's request_id in the run's `run_control_applied` event; run_unavailable
        when the run is not going here, or is ending."""
        run = await self._run(command.identity)
        message = Message(role="user", content=command.argument)
        if not run.live or run.state in TERMINAL:
            raise HarnessRefusal("run_unavailable")
        if not self._rt.control.steer(run.session_id, message, command.request_id):
            raise HarnessRefusal("run_unavailable")
        return Receipt(run.state, len(run.items), run.observed(), False)

    async def _run(self, identity: Identity) -> RunRecord:
        """The run `identity` names; session_not_found or run_not_found (nothing is created)."""
        self.check_release(identity)
        session_id = our_session_id(identity.session_id)
        run = await self._find(session_id, identity.run_id)
        if run is not None:
            return run
        await self._rt.sessions.refresh(session_id)
        try:
            self._rt.sessions.get(session_id)
        except NotFound:
            raise HarnessRefusal("session_not_found") from None
        raise HarnessRefusal("run_not_found")

    async def _save(self, run: RunRecord) -> None:
        await self._rt.store.save_harness_run(run.session_id, run.run_id, run.record())

    # --- the run ---------------------------------------------------------------------------------

    async def _execute(self, run: RunRecord, messages: list[Message]) -> None:
        """Run the generation, note which log entries are its events, then capture its changes."""
        last_seq = 0
        try:
            follow = await self._rt.runs.start(
                run.session_id, messages, GenerateOptions(run_id=run.chunk_run)
            )
            async for event, seq in follow:
                first = not run.items
                run.add_chunk(seq, event_kind(event), event_call(event))
                if first:
                    run.touch("executing")
                    await self._save(run)
                    if run.cancel_asked:
                        self._rt.control.cancel(run.session_id, None)
                last_seq = seq
                run.touch("completed" if isinstance(event, DoneEvent) else None)
        except Cancelled:
            await self._note_failure(run, last_seq)
            run.touch("cancelled")
        except AgentError as exc:
            if not run.items:
                run.failure = str(exc) or type(exc).__name__
                run.items.append(EventItem(None, ("error", {"message": run.failure}), now_ms()))
            else:
                await self._note_failure(run, last_seq)
            run.touch("failed")
        finally:
            run.touch("failed")  # a run the server's stop ended
        await self._save(run)
        await self._capture(run)

    async def _note_failure(self, run: RunRecord, after_seq: int) -> None:
        """Add the entry that ended the run without a result (written after `after_seq`)."""
        if not run.chunk_run:
            return
        for entry in await self._rt.store.read_log(run.session_id, after_seq, LOG_READ):
            if entry.kind == CHUNK and entry.body.get("run") == run.chunk_run and "failed" in entry.body:
                run.add_chunk(entry.seq, "failed")
                return

    async def _tree(self, run: RunRecord, end: str) -> str | None:
        """The run's workspace now as a tree of its shadow repository (core/sessions/checkpoints.py),
        held there under the run's name; None outside a git repository (A3S makes change sets of
        git workspaces only) or when git fails. The user's own repository is never written."""
        workspace = Path(run.workspace)
        if not repository_trees(workspace)[1]:
            return None
        repo = self._rt.checkpoints.shadow(workspace)
        name = f"{self._rt.settings.release_identity}:{run.session_id}:{run.run_id}:{end}"
        try:
            snapshot = await repo.snapshot(f"harness:{run.session_id}", self._rt.checkpoints.max_file_bytes)
        except (ShadowUnavailable, OSError):
            return None
        repo.hold(name, snapshot.tree)
        return snapshot.tree

    async def _capture(self, run: RunRecord) -> None:
        """The change set: the result tree and the patch to it."""
        if run.base_tree is None:
            return
        result = await self._tree(run, "result")
        if result is None:
            return
        try:
            run.patch = await self._rt.checkpoints.shadow(Path(run.workspace)).patch(run.base_tree, result)
        except (ShadowUnavailable, OSError):
            return
        run.result_tree, run.captured_at = result, now_ms()
        await self._save(run)

    # --- reads -----------------------------------------------------------------------------------

    async def page(self, identity: Identity, after: int | None, limit: int) -> Page:
        run = await self._run(identity)
        items, state, observed = list(run.items), run.state, run.observed()  # one consistent step
        latest = len(items)
        if after is not None and after >= latest:
            raise HarnessRefusal("invalid_field")
        oldest, _ = await self._rt.store.log_bounds(run.session_id)
        retained = [i for i, item in enumerate(items) if item.log_seq is None or 0 < oldest <= item.log_seq]
        first = retained[0] if retained else None
        start = 0 if after is None else after + 1
        gap = start < latest and (first is None or start < first)
        begin = (first if first is not None else latest) if gap else start
        events = await self._events(run, begin, items[begin : begin + limit])
        last = events[-1].sequence if events else None
        return Page(
            first_available=first,
            latest_exclusive=latest,
            next_after=last if last is not None else after,
            state=state,
            observed_at_ms=max([observed, *(e.occurred_at_ms for e in events)]),
            retention_gap=gap,
            has_more=last is not None and last + 1 < latest,
            events=events,
        )

    async def _events(self, run: RunRecord, begin: int, chosen: list[EventItem]) -> list[EventRecord]:
        seqs = [seq for item in chosen for seq in (item.log_seq, item.answer_seq) if seq is not None]
        entries = {}
        if seqs:
            span = max(seqs) - min(seqs) + 1
            entries = {e.seq: e for e in await self._rt.store.read_log(run.session_id, min(seqs) - 1, span)}
        events: list[EventRecord] = []
        occurred = 0
        for offset, item in enumerate(chosen):
            entry = entries.get(item.log_seq) if item.log_seq is not None else None
            if item.log_seq is not None and entry is None:
                break  # removed by retention since: the page ends before it
            answer = entries.get(item.answer_seq) if item.answer_seq is not None else None
            occurred = max(occurred, entry.timestamp if entry else item.at)
            kind, payload = item.made or chunk_event(
                entry.body if entry else {}, run.session_id, occurred, answer.body if answer else None
            )
            events.append(EventRecord(begin + offset, occurred, kind, bounded(payload)))
        return events

    async def changes(self, identity: Identity) -> ChangeSet:
        run = await self._run(identity)
        if run.base_tree is not None and run.result_tree is not None:
            if run.patch is None:  # a record of an earlier process: the trees are kept, the patch is not
                repo = self._rt.checkpoints.shadow(Path(run.workspace))
                try:
                    run.patch = await repo.patch(run.base_tree, run.result_tree)
                except (ShadowUnavailable, OSError):
                    raise HarnessRefusal("change_set_unavailable") from None
            return ChangeSet(run.state, run.base_tree, run.result_tree, run.patch, run.captured_at)
        if run.state not in TERMINAL or run.live:
            raise HarnessRefusal("change_set_pending")
        raise HarnessRefusal("change_set_unavailable")


def _continue_text(checkpoint_run_id: str) -> str:
    return (
        f"Continue the task of the earlier run {checkpoint_run_id}, which stopped before it finished,"
        " from where the conversation above ends."
    )
