"""What one firing of a job does, in the job's session (`cron-<job id>`): a shell job's command
runs as the model's `bash` call would, through the bash tool itself (the session's workspace and
HOME, the server's containment, OS sandbox and limits, its timeout and output cap) once the
session's permission rules allow it; an agent job's prompt is a generation of the session, whose
events and chunks go to its log as every generation's do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from ...base.errors import AgentError, AlreadyExists, NotFound
from ...base.models import LLMConfig, Message, SessionConfig
from ...core.loop.agent import DoneEvent, GenerateOptions
from ...core.policy.permissions import evaluated
from ...core.sessions.control import ControlPlane
from ...core.sessions.manager import SessionManager
from ...core.store.cron import CronJob, ExecutionStatus, JobType
from ...core.store.session import Session
from ...tools.registry import ToolContext, ToolOutput, ToolRegistry
from ..runs import Runs

OUTPUT_BYTES = 32_768
"""The output a firing's record keeps (bash keeps its start and end, and says what it cut)."""
UNATTENDED = "a firing is unattended: no one can answer a confirmation"


@dataclass(frozen=True)
class Outcome:
    status: ExecutionStatus
    exit_code: int | None = None
    stdout: str = ""
    error: str = ""


class Firings:
    def __init__(
        self,
        registry: ToolRegistry,
        sessions: SessionManager,
        tool_context: Callable[[Session | None], ToolContext],
        runs: Runs,
        control: ControlPlane,
    ) -> None:
        self._registry = registry
        self._sessions = sessions
        self._tool_context = tool_context
        self._runs = runs
        self._control = control

    async def session_of(self, job: CronJob, api_key: str = "") -> Session:
        """The job's session, made again when it is gone (a client destroyed it). An agent job's
        `api_key` is kept in memory only, as every session's: where it is not (another replica, a
        later start), the server's key for the endpoint applies."""
        await self._sessions.refresh(job.session_id)
        try:
            return self._sessions.get(job.session_id)
        except NotFound:
            pass
        agent = job.spec.agent
        llm = LLMConfig(model=agent.model, base_url=agent.base_url, api_key=api_key) if agent else None
        config = SessionConfig(
            name=f"cron job {job.name}",
            workspace=job.spec.working_dir,
            llm=llm if llm is not None and not llm.is_empty() else None,
            system_prompt=agent.system_prompt if agent else "",
        )
        try:
            return await self._sessions.create(job.session_id, config, [])
        except AlreadyExists:  # another replica made it meanwhile
            await self._sessions.refresh(job.session_id)
            return self._sessions.get(job.session_id)

    async def run(self, job: CronJob) -> Outcome:
        """Fire the job once; what went wrong is in the outcome (AgentErrors), never raised."""
        try:
            session = await self.session_of(job)
            if job.spec.job_type is JobType.AGENT:
                return await self._agent(job, session)
            return await self._shell(job, session)
        except AgentError as exc:
            return Outcome(ExecutionStatus.FAILED, error=str(exc))

    async def _shell(self, job: CronJob, session: Session) -> Outcome:
        bash = self._registry.get("bash")  # NotFound when Initialize disabled it
        args = bash.parse_arguments({"command": job.spec.command, "timeout_ms": job.spec.timeout_ms})
        verdict = await evaluated(
            session.settings.permission_policy,
            bash.name,
            args.model_dump(),
            session.config.workspace,
            subject=bash.rule_subject,
        )
        if verdict.decision != "allow":
            rules = ", ".join(verdict.matching_rules) or "the default decision"
            why = "denied" if verdict.decision == "deny" else f"held for a confirmation ({UNATTENDED})"
            return Outcome(
                ExecutionStatus.FAILED,
                error=f"{why} by the permission policy of session {session.id}: {rules}",
            )
        result = await bash.execute(args, replace(self._tool_context(session), max_output_bytes=OUTPUT_BYTES))
        return _shell_outcome(result)

    async def _agent(self, job: CronJob, session: Session) -> Outcome:
        prompt = [Message(role="user", content=job.spec.command)]
        try:
            async with asyncio.timeout(job.spec.timeout_ms / 1000):
                async for event, _ in await self._runs.start(session.id, prompt, GenerateOptions()):
                    if isinstance(event, DoneEvent):
                        return Outcome(
                            ExecutionStatus.SUCCESS, stdout=_capped(event.generation.message.content)
                        )
        except TimeoutError:
            self._control.cancel(session.id, None)
            return Outcome(
                ExecutionStatus.TIMEOUT,
                error=f"the generation ran past timeout_ms ({job.spec.timeout_ms} ms) and was cancelled",
            )
        except asyncio.CancelledError:
            self._control.cancel(session.id, None)  # the run goes on without its follower otherwise
            raise
        return Outcome(ExecutionStatus.FAILED, error="the generation ended without an answer")


def _shell_outcome(result: ToolOutput) -> Outcome:
    exit_code = result.metadata.get("exit_code")
    code = exit_code if isinstance(exit_code, int) else None
    if result.metadata.get("timed_out"):
        return Outcome(ExecutionStatus.TIMEOUT, code, result.output, result.error)
    if result.success:
        return Outcome(ExecutionStatus.SUCCESS, code, result.output)
    return Outcome(ExecutionStatus.FAILED, code, result.output, result.error)


def _capped(text: str) -> str:
    encoded = text.encode()
    if len(encoded) <= OUTPUT_BYTES:
        return text
    kept = encoded[:OUTPUT_BYTES].decode(errors="ignore")
    return f"{kept}\n[answer cut at {OUTPUT_BYTES} bytes of {len(encoded)}]"
