"""Tools lent by the client (RegisterTool): the model sees them, the host runs them.

A call to a client tool becomes an external task that the client completes. Tools registered
for a session are stored with it; server-wide ones (empty session id) live until the server stops.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ...base.errors import InvalidArgument
from ...base.jsontext import parse_json
from ...tools.registry import JsonArguments, Tool, ToolContext, ToolOutput, ToolRegistry, check_json_schema
from ..store.session import ClientToolSpec as ClientToolSpec
from ..store.session import Session
from .manager import SessionManager

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


async def _run_on_host(args: JsonArguments, ctx: ToolContext) -> ToolOutput:
    raise AssertionError("client tools run on the host as external tasks, never here")


def client_tool(spec: ClientToolSpec) -> Tool:
    return Tool(
        spec.name, spec.description, JsonArguments, _run_on_host, "interaction", "execute",
        external=True, json_schema=spec.parameters,
    )  # fmt: skip


class ClientTools:
    def __init__(self, sessions: SessionManager, registry: ToolRegistry) -> None:
        self._sessions = sessions
        self._registry = registry
        self._server_wide: dict[str, ClientToolSpec] = {}

    def validate(self, name: str, description: str, parameters_json: str, tags: list[str]) -> ClientToolSpec:
        if not TOOL_NAME.fullmatch(name):
            raise InvalidArgument("tool.name must be 1-64 characters of letters, digits, '_' or '-'")
        if self._registry.has(name):
            raise InvalidArgument(f"tool.name {name!r} clashes with a built-in tool")
        parameters = parse_json(
            parameters_json or '{"type": "object", "properties": {}}', "tool.parameters_schema"
        )
        check_json_schema(parameters, "tool.parameters_schema")
        return ClientToolSpec(name, description, parameters, list(tags))

    async def register(self, session_id: str, spec: ClientToolSpec) -> None:
        if not session_id:
            self._server_wide[spec.name] = spec
            return
        await self._sessions.update_settings(
            session_id, lambda s: replace(s, client_tools={**s.client_tools, spec.name: spec})
        )

    def for_session(self, session: Session | None) -> list[Tool]:
        specs = dict(self._server_wide)
        if session is not None:
            specs.update(session.settings.client_tools)
        return [client_tool(spec) for spec in specs.values()]
