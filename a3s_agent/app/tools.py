"""Tools: run them for a client, list what a session may call, register client tools."""

from __future__ import annotations

from ..base.errors import InvalidArgument
from ..base.models import ToolCall
from ..runtime import Runtime
from ..tools.aliases import find_tool
from ..tools.registry import Tool, ToolOutput


class Tools:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def execute(self, session_id: str, tool_name: str, arguments: str) -> ToolOutput:
        if not tool_name:
            raise InvalidArgument("tool_name is required")
        await self.ready(session_id)
        writes = bool(session_id) and self._may_write(session_id, tool_name)  # a session's workspace
        if writes:
            await self._rt.checkpoints.before_tool(session_id)
        try:
            return await self._rt.tools.execute(session_id, tool_name, arguments)
        finally:
            if writes:
                await self._rt.checkpoints.after_tool(session_id)

    def _may_write(self, session_id: str, tool_name: str) -> bool:
        """Whether a direct call of the tool may change files (any but a read-only one)."""
        tool = find_tool({t.name: t for t in self.available(session_id)}, tool_name)
        return tool is not None and tool.lane != "query"

    async def execute_batch(self, session_id: str, calls: list[ToolCall]) -> list[ToolOutput]:
        await self.ready(session_id)
        return await self._rt.tools.execute_batch(session_id, calls)

    async def ready(self, session_id: str | None) -> None:
        """Make `available` complete: connect the MCP servers whose tools are not known yet (each
        within its startup timeout; one that is down is tried again later, not waited for)."""
        await self._rt.sessions.refresh(session_id or "")
        await self._rt.prepare_tools(self._rt.sessions.get(session_id) if session_id else None)

    def available(self, session_id: str | None) -> list[Tool]:
        """What a session's model may call (no session: the server's built-in tools and the tools of
        its own MCP servers); after `ready`, MCP servers' tools included."""
        session = self._rt.sessions.get(session_id) if session_id else None
        return self._rt.tools_for(session)

    async def register(
        self, session_id: str, name: str, description: str, parameters_schema: str, tags: list[str]
    ) -> None:
        """A client tool for one session: the model calls it, the client runs it."""
        spec = self._rt.client_tools.validate(name, description, parameters_schema, tags)
        await self._rt.client_tools.register(session_id, spec)
