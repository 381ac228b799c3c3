"""What the agent loop and context accounting need from the server around them: the one
collaborator (the Runtime implements it) instead of loose callables."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from ...base.models import LLMConfig, Message
from ...llm.provider import Provider
from ...tools.registry import Tool, ToolContext
from ..store.protocol import LogEntry
from ..store.session import Session


class AgentHost(Protocol):
    def llm_for(self, session: Session | None = None) -> LLMConfig:
        """The model `session` talks to (None: the server's)."""
        ...

    def provider_for(self, llm: LLMConfig) -> Provider:
        """The provider that calls `llm`."""
        ...

    def tools_for(self, session: Session | None) -> list[Tool]:
        """What the session's model may call."""
        ...

    async def prepare_tools(self, session: Session) -> None:
        """Make `tools_for` complete: connect what the session's tools need first (MCP servers)."""
        ...

    def prompt_for(self, session: Session) -> str:
        """The session's system prompt."""
        ...

    async def recalled_memories(self, session: Session, messages: list[Message]) -> str:
        """What the system prompt is offered of the memories relevant to `messages` ("": none)."""
        ...

    def tool_context(self, session: Session | None) -> ToolContext:
        """Where and with which environment the session's tools run."""
        ...

    def token_budget_for(self, session: Session) -> int:
        """The cap on the session's total tokens (core/loop/budget.py; 0: none)."""
        ...

    async def turn_starting(
        self, session: Session, messages: list[Message], message_count: int, tools: list[Tool]
    ) -> None:
        """A generation is about to store `messages` after `message_count` others and run with
        `tools`: the checkpoint of the session's workspace it may change (core/sessions/checkpoints.py)."""
        ...

    def own_run(self, session_id: str, run_id: str) -> AbstractAsyncContextManager[list[LogEntry]]:
        """Hold the session's run lease while a generation runs (waiting while another process's
        run holds it), so that one process at a time writes the session's history. Entries put in
        the list it gives are logged in the transaction that releases the lease, after the
        session's queued ones."""
        ...
