"""Which MCP servers a session uses, merged from four levels, and their tools.

By name, a later level replaces an earlier one:

1. the operator's file (`--mcp-config FILE`, A3S_MCP_CONFIG), read at start;
2. Initialize's `config.custom["mcp_servers"]` (JSON of the mcpServers shape), server-wide;
   then those RegisterMcpServer added that are connected (app/mcp_servers.py), server-wide, kept
   in this process's memory only;
3. the `mcp-servers:` of loaded skills (server-wide loads, and those of the session);
4. the session's own, from the `a3s-mcp-servers` metadata of CreateSession and ConfigureSession.

Trust. The operator's file is the operator's: its commands run and its URLs reach any address.
A command given over the API (Initialize, session metadata, a skill sent as LoadSkill content)
starts a process outside any tool call's permission check, so it is refused unless the operator
allows it (`--allow-api-mcp-commands`, A3S_ALLOW_API_MCP_COMMANDS=1); URLs from the API and from
skills go through the request guard (public addresses only unless A3S_FETCH_ALLOW_PRIVATE=1). A
repository's skills add no servers unless the server trusts workspace skills. A command's own
`sandbox_network` (its sandbox's network, in place of the server's) is the operator's to give: it
is honoured from the operator's file and the operator's skills, refused from the API, and left out
(with a warning) from a repository's skills.

Server-wide servers get a connection per workspace they serve; a session's own are closed when
the session drops them or ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..core.skills.catalog import SkillCatalog
from ..core.store.session import Session
from ..tools.fetcher import private_allowed
from ..tools.mcp.config import (
    MAX_API_CONFIG_CHARS,
    Endpoint,
    ServerSpec,
    StdioServer,
    as_json,
    operator_servers,
    parse_servers,
    parse_text,
    refuse_commands,
    refuse_networks,
)
from ..tools.registry import Tool, ToolContext

if TYPE_CHECKING:  # the SDK is imported once a server is configured: it takes half a second
    from ..tools.mcp.clients import McpClients, Owner
    from ..tools.mcp.connection import Connection

MCP_SERVERS_KEY = "mcp_servers"
"""The `config.custom` key of Initialize's MCP servers."""
PARSED_KEPT = 1024

Servers = dict[str, ServerSpec]


@dataclass(frozen=True)
class ServersGiven:
    """MCP servers a caller sends: `config` is the JSON value (`{"mcpServers": {...}}` or the bare
    mapping), `source` what errors call it. `commands_allowed`: the face's caller is the user of
    this machine (an editor that started `a3s-agent acp`), whose commands run without the flag."""

    config: Any
    source: str
    commands_allowed: bool = False

    @classmethod
    def from_text(cls, text: str, source: str) -> ServersGiven:
        """From JSON text (metadata, Initialize's config.custom); InvalidArgument names `source`."""
        return cls(parse_text(text, source, max_chars=MAX_API_CONFIG_CHARS), source)


def initialize_servers(custom: Mapping[str, str]) -> ServersGiven | None:
    """The servers of an Initialize's `config.custom` (None when it names none)."""
    text = custom.get(MCP_SERVERS_KEY, "")
    return ServersGiven.from_text(text, f"config.custom.{MCP_SERVERS_KEY}") if text.strip() else None


class McpServers:
    def __init__(
        self,
        settings: Settings,
        skills: SkillCatalog,
        server_wide: Callable[[], Mapping[str, dict[str, Any]]],
        context: Callable[[Session | None], ToolContext],
    ) -> None:
        """`server_wide`: Initialize's servers (JSON form); `context`: where a session's tools run."""
        self._settings = settings
        self._skills = skills
        self._server_wide = server_wide
        self._context = context
        self._operator = operator_servers(settings.mcp_config)
        self._clients: McpClients | None = None
        self._parsed: dict[str, Servers] = {}
        self.registered: dict[str, dict[str, Any]] = {}
        """RegisterMcpServer's servers (checked, JSON form); those named in `connected` are used."""
        self.connected: set[str] = set()

    @property
    def clients(self) -> McpClients:
        if self._clients is None:
            from ..tools.mcp.clients import McpClients

            self._clients = McpClients()
        return self._clients

    def from_api(self, given: ServersGiven | None) -> dict[str, dict[str, Any]]:
        """Servers sent over the API, checked, in their stored (JSON) form (None: none)."""
        if given is None:
            return {}
        servers = parse_servers(given.config, given.source)
        refuse_commands(
            servers, given.source, allowed=given.commands_allowed or self._settings.allow_api_mcp_commands
        )
        refuse_networks(servers, given.source)
        return as_json(servers)

    # --- what a session uses ------------------------------------------------------------------

    def connections(self, session: Session | None) -> list[Connection]:
        endpoints = self._endpoints(session)
        return self.clients.connections(endpoints) if endpoints else []

    def tools_for(self, session: Session | None) -> list[Tool]:
        """The tools of the session's servers as last listed (see `prepare`)."""
        connections = self.connections(session)
        return self.clients.tools(connections) if connections else []

    async def prepare(self, session: Session | None) -> None:
        """Connect the session's servers whose tools are not known yet (time-bound)."""
        connections = self.connections(session)
        if connections:
            await self.clients.prepare(connections)

    def _endpoints(self, session: Session | None) -> list[tuple[Owner, Endpoint]]:
        context = self._context(session)
        session_owner = session.id if session is not None else ""
        # (owner, spec, guarded, whether the operator gave it: its sandbox_network holds)
        chosen: dict[str, tuple[Owner, ServerSpec, bool, bool]] = {}
        for name, spec in self._operator.items():
            chosen[name] = ("", spec, False, True)
        for name, spec in self._server_wide_given().items():
            chosen[name] = ("", spec, True, False)
        for in_session, servers, operators in self._skills.mcp_servers_for(session):
            for name, spec in servers.items():
                chosen[name] = (session_owner if in_session else "", spec, True, operators)
        if session is not None:
            for name, spec in self._stored(session.settings.mcp_servers).items():
                chosen[name] = (session.id, spec, True, False)
        allow_private = private_allowed(context)
        return [
            (
                owner,
                Endpoint(
                    name,
                    spec,
                    context.workspace,
                    guarded,
                    allow_private,
                    owner or None,
                    _network(spec) if operators else "",
                ),
            )
            for name, (owner, spec, guarded, operators) in chosen.items()
        ]

    def _server_wide_given(self) -> Servers:
        """Initialize's servers, then the registered ones that are connected (same name: these)."""
        registered = {name: self.registered[name] for name in self.connected if name in self.registered}
        return {**self._stored(self._server_wide()), **self._stored(registered)}

    def _stored(self, servers: Mapping[str, dict[str, Any]]) -> Servers:
        """Servers in their stored form, parsed once (of the last PARSED_KEPT forms)."""
        if not servers:
            return {}
        key = json.dumps(servers, sort_keys=True)
        if key not in self._parsed:
            if len(self._parsed) >= PARSED_KEPT:
                self._parsed.clear()
            self._parsed[key] = parse_servers(dict(servers), "stored")
        return self._parsed[key]

    # --- closing what is no longer used -------------------------------------------------------

    async def session_changed(self, session: Session) -> None:
        """Close the session's connections its servers no longer name."""
        if self._clients is None:
            return
        kept = {id(connection) for connection in self.connections(session)}
        await self._clients.release(session.id, keep=lambda connection: id(connection) in kept)

    async def server_changed(self) -> None:
        """Close server-wide connections whose server is no longer configured (after Initialize or
        a server-wide skill's unload)."""
        if self._clients is None:
            return
        wanted = {(name, spec.key()) for name, spec in self._server_wide_specs()}
        await self._clients.release(
            "", keep=lambda connection: (connection.name, connection.endpoint.spec.key()) in wanted
        )

    def _server_wide_specs(self) -> Iterable[tuple[str, ServerSpec]]:
        yield from self._operator.items()
        yield from self._server_wide_given().items()
        for _, servers, _ in self._skills.mcp_servers_for(None):
            yield from servers.items()

    async def session_ended(self, session_id: str) -> None:
        if self._clients is not None:
            await self._clients.release(session_id)

    async def close(self) -> None:
        if self._clients is not None:
            await self._clients.close()


def _network(spec: ServerSpec) -> str:
    return spec.sandbox_network if isinstance(spec, StdioServer) else ""
