"""Running tool calls for a session (or the server workspace) and recording them in its history."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...base.errors import AgentError, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from ...base.models import Message, ToolCall
from ...tools.aliases import our_tool_name
from ...tools.registry import Tool, ToolContext, ToolOutput, ToolRegistry
from ..sessions.manager import SessionManager
from ..store.session import Session


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_message(call: ToolCall, result: ToolOutput) -> Message:
    """The history entry for a finished call: what the model reads back (an image read_file
    returned, as an attachment: llm/messages.py says how each model gets it)."""
    content = result.output if result.success else f"error: {result.error}\n{result.output}".rstrip()
    return Message(
        role="tool",
        content=content,
        attachments=list(result.attachments),
        tool_call_id=call.id,
        name=call.name,
        metadata={"success": str(result.success).lower()},
    )


class ToolRunner:
    def __init__(
        self,
        registry: ToolRegistry,
        sessions: SessionManager,
        context_for: Callable[[Session | None], ToolContext],
        max_batch: int,
        *,
        max_calls: int,
        tools_for: Callable[[Session | None], list[Tool]],
    ) -> None:
        self._registry = registry
        self._sessions = sessions
        self._context_for = context_for
        self._tools_for = tools_for
        self._max_batch = max_batch
        self._max_calls = max_calls
        self._running = 0  # ExecuteTool and ExecuteToolBatch requests in progress

    @contextmanager
    def _slot(self) -> Iterator[None]:
        """One of the `max_calls` requests that may run at once, or ResourceExhausted."""
        if self._running >= self._max_calls:
            raise ResourceExhausted(
                f"{self._running} direct tool calls (ExecuteTool/ExecuteToolBatch) are running, the"
                f" server's limit (A3S_MAX_TOOL_CALLS={self._max_calls}); try again when one ends"
            )
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1

    def _tool(self, name: str, session: Session | None) -> Tool:
        """What ListTools lists for the session: a built-in (the registry says when one is disabled),
        or a tool of a loaded skill, by its name or A3S Code's. A client's tool (RegisterTool) is
        the client's to run."""
        if self._registry.has(name):
            return self._registry.get(name)
        found = next((tool for tool in self._tools_for(session) if tool.name == name), None)
        if found is None and our_tool_name(name) != name:  # A3S Code's `read`, `edit`...
            return self._tool(our_tool_name(name), session)
        if found is None:
            where = f"session {session.id!r}" if session is not None else "the server (no session_id)"
            raise NotFound(f"unknown tool {name!r}: ListTools shows the tools of {where}")
        if found.external:
            raise FailedPrecondition(
                f"tool {name!r} was lent by a client (RegisterTool): the client runs it, in a generation"
                " that calls it (as an external task); the server cannot run it"
            )
        return found

    async def _run(
        self, name: str, arguments: str, session: Session | None, context: ToolContext
    ) -> ToolOutput:
        tool = self._tool(name, session)
        return await tool.execute(tool.parse_arguments(arguments), context)

    async def execute(self, session_id: str, name: str, arguments: str) -> ToolOutput:
        """One call; unknown tools (NotFound), client tools (FailedPrecondition) and bad arguments
        (InvalidArgument) raise."""
        session = self._sessions.get(session_id) if session_id else None
        with self._slot():
            result = await self._run(name, arguments, session, self._context_for(session))
            if session is not None:
                await self._record(
                    session, [(ToolCall(id=new_call_id(), name=name, arguments=arguments), result)]
                )
        return result

    async def execute_batch(self, session_id: str, calls: list[ToolCall]) -> list[ToolOutput]:
        """Calls in order, one result each; a failing call (even an unknown tool) does not stop the rest."""
        if len(calls) > self._max_batch:
            raise InvalidArgument(f"tool_calls has {len(calls)} calls; at most {self._max_batch} per request")
        session = self._sessions.get(session_id) if session_id else None
        context = self._context_for(session)
        done: list[tuple[ToolCall, ToolOutput]] = []
        with self._slot():
            for call in calls:
                call = ToolCall(id=call.id or new_call_id(), name=call.name, arguments=call.arguments)
                try:
                    result = await self._run(call.name, call.arguments, session, context)
                except AgentError as exc:
                    result = ToolOutput(success=False, error=str(exc))
                done.append((call, result))
            if session is not None:
                await self._record(session, done)
        return [result for _, result in done]

    async def _record(self, session: Session, done: list[tuple[ToolCall, ToolOutput]]) -> None:
        """As a model would have made them: one assistant turn with the calls, then one result each."""
        messages = [Message(role="assistant", tool_calls=[call for call, _ in done])]
        messages += [tool_message(call, result) for call, result in done]
        await self._sessions.append_messages(session.id, messages)
