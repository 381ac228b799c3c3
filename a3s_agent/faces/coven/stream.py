"""One AgentStream call: registration, then the gateway's messages served until the stream
ends, the gateway sends Shutdown or the agent is stopped.

Requests run one at a time in arrival order (the spec's concurrency rule); approvals, cancels and
injections are handled as they arrive, while a request runs."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from contextlib import suppress
from dataclasses import dataclass

import grpc

from ...app import Application
from ...base.errors import NotFound
from ...base.models import Message
from ...proto import coven_pb2 as pb
from .request import RequestRun, injected_message, response
from .threads import Threads

log = logging.getLogger(__name__)

HEADERS_TIMEOUT_S = 5.0
REGISTER_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 5.0


class Ending(enum.Enum):
    DISCONNECTED = "disconnected"  # the stream broke or the gateway closed it: reconnect
    SHUTDOWN = "shutdown"  # the gateway sent Shutdown
    STOPPED = "stopped"  # the agent's stop event was set


@dataclass
class _Injection:
    """Context for an idle thread, stored by the worker so it never races a starting run."""

    session_id: str
    message: Message


class CovenStream:
    def __init__(
        self, app: Application, call: grpc.aio.StreamStreamCall, threads: Threads, heartbeat_s: float
    ) -> None:
        self._app = app
        self._call = call
        self._threads = threads
        self._heartbeat_s = heartbeat_s
        self._outbox: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()
        self._work: asyncio.Queue[pb.SendMessage | _Injection | None] = asyncio.Queue()
        self._waiting: dict[str, pb.SendMessage] = {}  # queued requests, by request_id
        self._current: RequestRun | None = None
        self._closing = False
        self._last_sent = 0.0

    async def register(self, registration: pb.RegisterAgent) -> pb.ServerMessage:
        """Send RegisterAgent and return the gateway's Welcome or RegistrationError."""
        # The gateway sends its response headers at once (the spec's step 3). Waiting for them
        # means a call that fails at once (UNIMPLEMENTED...) is seen failed before anything is
        # written: a write racing that status would turn it into INTERNAL.
        headers = asyncio.ensure_future(self._call.initial_metadata())
        await asyncio.wait({headers}, timeout=HEADERS_TIMEOUT_S)
        if not self._call.done():
            await self._call.write(pb.AgentMessage(register=registration))
        async with asyncio.timeout(REGISTER_TIMEOUT_S):
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:  # a call that failed raises its status instead
                    raise ConnectionError("the gateway closed the stream before answering RegisterAgent")
                kind = message.WhichOneof("payload")
                if kind in ("welcome", "registration_error"):
                    return message
                log.warning("ignoring %s sent before the registration was answered", kind)

    async def serve(self, stop: asyncio.Event) -> Ending:
        self._last_sent = asyncio.get_running_loop().time()
        writer = asyncio.create_task(self._write_all())
        heartbeat = asyncio.create_task(self._heartbeat())
        reader = asyncio.create_task(self._read_all())
        worker = asyncio.create_task(self._work_all())
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait({reader, worker, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done and stopping in done:
                self._close("the agent is stopping")
                if self._current is not None:
                    self._current.cancel("the agent is stopping")
                done, _ = await asyncio.wait({reader, worker}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                _log_end(reader)
            else:  # the worker ended: every request has its terminal response
                self._outbox.put_nowait(None)
                await asyncio.wait({writer}, timeout=CLOSE_TIMEOUT_S)
                await asyncio.wait({reader}, timeout=CLOSE_TIMEOUT_S)  # the gateway closes its side
            if stop.is_set():
                return Ending.STOPPED
            return Ending.SHUTDOWN if self._closing else Ending.DISCONNECTED
        finally:
            tasks = (reader, worker, stopping, writer, heartbeat)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def send(self, message: pb.AgentMessage) -> None:
        self._last_sent = asyncio.get_running_loop().time()
        self._outbox.put_nowait(message)

    # --- tasks -----------------------------------------------------------------------------

    async def _read_all(self) -> None:
        while (message := await self._call.read()) is not grpc.aio.EOF:
            self._dispatch(message)

    async def _write_all(self) -> None:
        while (message := await self._outbox.get()) is not None:
            try:
                await self._call.write(message)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                log.debug("cannot write to the gateway stream: %s", exc)
                return  # the reader sees the stream end
        with suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._call.done_writing()

    async def _work_all(self) -> None:
        while (item := await self._work.get()) is not None:
            if isinstance(item, _Injection):
                await self._store(item)
            elif self._waiting.pop(item.request_id, None) is not None:  # else cancelled while queued
                await self._answer(item)

    async def _heartbeat(self) -> None:
        """A Heartbeat whenever nothing else was sent for heartbeat_s."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._last_sent + self._heartbeat_s - loop.time())
            if loop.time() - self._last_sent >= self._heartbeat_s:
                self.send(pb.AgentMessage(heartbeat=pb.Heartbeat(timestamp_ms=time.time_ns() // 1_000_000)))

    async def _answer(self, request: pb.SendMessage) -> None:
        run = RequestRun(self._app, request, self._threads, self.send)
        self._current = run
        try:
            await run.run()
            await run.flush()
        finally:
            self._current = None

    async def _store(self, injection: _Injection) -> None:
        try:
            await self._app.sessions.append(injection.session_id, [injection.message])
        except NotFound:
            log.warning("dropped injected context: session %r is gone", injection.session_id)

    # --- gateway messages ------------------------------------------------------------------

    def _dispatch(self, message: pb.ServerMessage) -> None:
        kind = message.WhichOneof("payload")
        if kind == "send_message":
            self._accept(message.send_message)
        elif kind == "tool_approval":
            answer = message.tool_approval
            if self._current is None or not self._current.approve(answer):
                log.warning("ToolApprovalResponse for %s, which is not waiting for approval", answer.id)
        elif kind == "inject_context":
            self._inject(message.inject_context)
        elif kind == "cancel_request":
            self._cancel(message.cancel_request)
        elif kind == "shutdown":
            reason = message.shutdown.reason
            log.info("the gateway asked for a shutdown: %s", reason or "(no reason given)")
            self._close(f"the agent is shutting down: {reason}" if reason else "the agent is shutting down")
        else:
            log.warning("ignoring unexpected %s from the gateway", kind)

    def _accept(self, request: pb.SendMessage) -> None:
        request_id = request.request_id
        if self._closing:
            self.send(response(request_id, cancelled=pb.Cancelled(reason="the agent is shutting down")))
        elif request_id in self._waiting or (
            self._current and self._current.request.request_id == request_id
        ):
            log.warning("ignoring a second SendMessage with request_id %s", request_id)
        else:
            self._waiting[request_id] = request
            self._work.put_nowait(request)

    def _cancel(self, cancel: pb.CancelRequest) -> None:
        reason = cancel.reason if cancel.HasField("reason") else "cancelled"
        if self._current is not None and self._current.request.request_id == cancel.request_id:
            self._current.cancel(reason)
        elif self._waiting.pop(cancel.request_id, None) is not None:
            self.send(response(cancel.request_id, cancelled=pb.Cancelled(reason=reason)))
        else:
            log.info("CancelRequest for %s, which is not in flight", cancel.request_id)

    def _inject(self, inject: pb.InjectContext) -> None:
        message = injected_message(inject)
        if self._current is not None:
            self._current.inject(message, immediate=inject.priority == pb.INJECTION_PRIORITY_IMMEDIATE)
            reason = None
        elif self._closing:
            reason = "the agent is shutting down"
        elif self._threads.last_session is None:
            reason = "no conversation has started yet, so there is no thread to add context to"
        else:
            self._work.put_nowait(_Injection(self._threads.last_session, message))
            reason = None
        ack = pb.InjectionAck(injection_id=inject.injection_id, accepted=reason is None, reason=reason)
        self.send(pb.AgentMessage(injection_ack=ack))

    def _close(self, reason: str) -> None:
        """Take no more requests: queued ones are cancelled, the running one finishes."""
        if self._closing:
            return
        self._closing = True
        for request_id in list(self._waiting):
            self.send(response(request_id, cancelled=pb.Cancelled(reason=reason)))
        self._waiting.clear()
        self._work.put_nowait(None)


def _log_end(reader: asyncio.Task[None]) -> None:
    error = None if reader.cancelled() else reader.exception()
    if isinstance(error, grpc.aio.AioRpcError):
        log.warning("the gateway stream failed: %s %s", error.code().name, error.details())
    elif error is not None:
        log.error("reading the gateway stream failed", exc_info=error)
    else:
        log.warning("the gateway closed the stream")
