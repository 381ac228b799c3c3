"""Subagents for the faces: which agents a session may start, and running one on a task as a child
of a session (what the later dialect's Delegate and StreamDelegate, the harness and ACP build on).
The model starts them itself with the `task` tool (runtime/subagents.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ..base.errors import InvalidArgument
from ..core.agents.definition import MAX_STEPS, AgentDefinition
from ..core.store.session import ParentLink, Session
from ..runtime import Runtime
from ..runtime.subagents import ChildEvent, Delegation

__all__ = ["AgentDefinition", "AgentListing", "ChildEvent", "ParentLink", "Subagents"]


@dataclass(frozen=True)
class AgentListing:
    """The agents a session may start, by name; the workspace's a built-in or operator agent hides;
    what is wrong with each agent file that did not load."""

    agents: list[AgentDefinition]
    shadowed: list[AgentDefinition]
    problems: dict[str, str]


class Subagents:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def agents(self, session_id: str = "") -> AgentListing:
        """The agents of the session's workspace (none given: the server's)."""
        session = await self._session(session_id) if session_id else None
        found = self._rt.subagents.agents_for(session)
        return AgentListing(list(found.available.values()), list(found.shadowed), dict(found.problems))

    async def delegate(
        self,
        session_id: str,
        agent: str,
        task: str,
        *,
        description: str = "",
        max_steps: int = 0,
        allowed_tools: Sequence[str] = (),
    ) -> AsyncIterator[ChildEvent]:
        """Run `agent` on `task` as a child of the session, with the session's tools that the
        agent allows (and `allowed_tools` names, when it names any), at most `max_steps` tool
        calls (0: the agent's); the child's events as they are committed, each with the child's
        session id, with notices of its start, progress and end (`subagent_start`,
        `subagent_progress`, `subagent_end`: what the parent's log says of it), a DoneEvent last. It runs in the caller's task: it stops when the caller does
        (and with Cancel of the session or the child). NotFound for an unknown session or agent,
        InvalidArgument for a missing task or an agent whose file is broken, FailedPrecondition
        past the depth limit."""
        if not agent:
            raise InvalidArgument("agent_name is required (explore, plan, general or an agent file's name)")
        if not task.strip():
            raise InvalidArgument("task is required: what the agent is to do")
        if not 0 <= max_steps <= MAX_STEPS:
            raise InvalidArgument(
                f"max_steps must be from 0 (the agent's own) to {MAX_STEPS}, not {max_steps}"
            )
        await self._session(session_id)
        delegation = Delegation(agent, task, description, max_steps, tuple(allowed_tools))
        async for event in self._rt.subagents.stream(
            session_id, f"delegate_{uuid.uuid4().hex[:24]}", delegation
        ):
            yield event

    def children(self, session_id: str) -> list[Session]:
        """The sessions of the subagents the session started, oldest first."""
        self._rt.sessions.get(session_id)
        return self._rt.sessions.children(session_id)

    def parent(self, session_id: str) -> ParentLink | None:
        """What started the session, when a subagent's it is (its parent, tool call and agent)."""
        return self._rt.sessions.get(session_id).parent

    async def _session(self, session_id: str) -> Session:
        await self._rt.sessions.refresh(session_id)
        return self._rt.sessions.get(session_id)
