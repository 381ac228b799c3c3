"""MCP tools, resources and prompts as registry tools.

Each tool a server lists becomes `mcp__<server>__<tool>` (characters a model API refuses become
`_`; a name over 64 characters is cut and given a hash) with the server's JSON Schema; its results
are mapped by results.py.

Three more tools appear beside a session's MCP servers: `list_mcp_resources`,
`read_mcp_resource` and `list_mcp_prompts`. Every MCP tool runs in the execute lane: a server's
read-only hint is not trusted to skip confirmation (MCP itself says hints from a server are not
to be relied on).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import mcp_types
from mcp.client import Client
from pydantic import BaseModel, Field

from ...base.errors import InvalidArgument
from ...base.models import Attachment
from ..registry import JsonArguments, Tool, ToolContext, ToolFailure, ToolOutput, check_json_schema
from .connection import MAX_PAGES, Connection
from .results import about, contents_text, to_output

log = logging.getLogger(__name__)

PREFIX = "mcp__"
MAX_NAME = 64
MAX_DESCRIPTION = 4000
RESOURCE_TOOLS = ("list_mcp_resources", "read_mcp_resource", "list_mcp_prompts")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_HINT = "ask the MCP tool for less (a narrower query, a page)"


def tool_name(server: str, tool: str) -> str:
    """The registry name of `server`'s tool `tool`."""
    name = f"{PREFIX}{server}__{_UNSAFE.sub('_', tool)}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


def server_tools(connection: Connection) -> list[Tool]:
    """The registry tools of a server's last listing (none before it was first listed)."""
    if connection.listing is None:
        return []
    tools: dict[str, Tool] = {}
    for listed in connection.listing.tools:
        name = tool_name(connection.name, listed.name)
        if name in tools:
            log.warning(
                "MCP server %r: tool %r is named like another once made safe; left out",
                connection.name,
                listed.name,
            )
            continue
        tools[name] = Tool(
            name,
            _description(listed),
            JsonArguments,
            _caller(connection, listed.name),
            "mcp",
            "execute",
            truncation_hint=_HINT,
            json_schema=_schema(connection.name, listed),
        )
    return list(tools.values())


def _description(listed: mcp_types.Tool) -> str:
    text = listed.description or listed.title or listed.name
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 3] + "..."


def _schema(server: str, listed: mcp_types.Tool) -> dict[str, Any]:
    """The tool's input schema; one that is not a valid object schema is replaced by an open
    object (the server still checks the arguments), with a warning."""
    try:
        return check_json_schema(
            listed.input_schema, f"MCP server {server!r} tool {listed.name!r} inputSchema"
        )
    except InvalidArgument as exc:
        log.warning("%s; its arguments go unchecked", exc)
        return {"type": "object"}


def _caller(connection: Connection, name: str) -> Callable[[Any, ToolContext], Awaitable[ToolOutput]]:
    async def run(args: JsonArguments, ctx: ToolContext) -> ToolOutput:
        result = await connection.call_tool(name, args.model_dump())
        output = to_output(result)
        output.metadata.update(mcp_server=connection.name, mcp_tool=name)
        return output

    return run


# --- resources and prompts ------------------------------------------------------------------


class _AnyServer(BaseModel):
    server: str = Field("", description="an MCP server's name; empty: every server")


class _Resource(BaseModel):
    server: str = Field(description="the MCP server's name")
    uri: str = Field(description="the resource's URI, as list_mcp_resources shows it")


def resource_tools(connections: Sequence[Connection]) -> list[Tool]:
    """list_mcp_resources, read_mcp_resource and list_mcp_prompts over these servers."""
    by_name = {connection.name: connection for connection in connections}

    def chosen(server: str) -> list[Connection]:
        if not server:
            return list(by_name.values())
        if server not in by_name:
            raise ToolFailure(
                f"no MCP server named {server!r} here (servers: {', '.join(by_name) or 'none'})"
            )
        return [by_name[server]]

    async def list_resources(args: _AnyServer, ctx: ToolContext) -> str:
        lines: list[str] = []
        for connection in chosen(args.server):
            lines += await _resource_lines(connection)
        return "\n".join(lines) or "no resources"

    async def read_resource(args: _Resource, ctx: ToolContext) -> ToolOutput:
        if not args.server:
            raise ToolFailure("name the MCP server the resource is on (list_mcp_resources shows them)")
        connection = chosen(args.server)[0]

        async def send(client: Client) -> mcp_types.ReadResourceResult:
            return await client.read_resource(args.uri)

        result: mcp_types.ReadResourceResult = await connection.request(f"reading {args.uri}", send)
        attachments: list[Attachment] = []
        text = "\n".join(contents_text(contents, attachments) for contents in result.contents)
        return ToolOutput(output=text, attachments=attachments, metadata={"mcp_server": connection.name})

    async def list_prompts(args: _AnyServer, ctx: ToolContext) -> str:
        lines: list[str] = []
        for connection in chosen(args.server):
            lines += await _prompt_lines(connection)
        return "\n".join(lines) or "no prompts"

    return [
        Tool(
            RESOURCE_TOOLS[0],
            "List the resources (and resource templates) of the session's MCP servers: one line each,"
            " `server: uri (name, type): description`.",
            _AnyServer, list_resources, "mcp", "execute", truncation_hint="name one server",
        ),
        Tool(
            RESOURCE_TOOLS[1],
            "Read a resource of an MCP server by its URI: its text, or an image.",
            _Resource, read_resource, "mcp", "execute", truncation_hint="read a smaller resource",
        ),
        Tool(
            RESOURCE_TOOLS[2],
            "List the prompts of the session's MCP servers: `server: name(arguments): description`.",
            _AnyServer, list_prompts, "mcp", "execute", truncation_hint="name one server",
        ),
    ]  # fmt: skip


async def _resource_lines(connection: Connection) -> list[str]:
    async def send(client: Client) -> list[str]:
        if client.server_capabilities.resources is None:
            return []
        lines: list[str] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await client.list_resources(cursor=cursor)
            lines += [
                f"{connection.name}: {item.uri}{about(item.name, item.mime_type)}: {item.description or ''}".rstrip(
                    ": "
                )
                for item in page.resources
            ]
            cursor = page.next_cursor
            if cursor is None:
                break
        templates = await client.list_resource_templates()
        lines += [
            f"{connection.name}: {item.uri_template} (template{', ' + item.name if item.name else ''}): {item.description or ''}".rstrip(
                ": "
            )
            for item in templates.resource_templates
        ]
        return lines

    lines: list[str] = await connection.request("listing its resources", send)
    return lines


async def _prompt_lines(connection: Connection) -> list[str]:
    async def send(client: Client) -> list[str]:
        if client.server_capabilities.prompts is None:
            return []
        lines: list[str] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await client.list_prompts(cursor=cursor)
            for prompt in page.prompts:
                arguments = ", ".join(
                    f"{argument.name}{'' if argument.required else '?'}"
                    for argument in prompt.arguments or []
                )
                lines.append(
                    f"{connection.name}: {prompt.name}({arguments}): {prompt.description or ''}".rstrip(": ")
                )
            cursor = page.next_cursor
            if cursor is None:
                break
        return lines

    lines: list[str] = await connection.request("listing its prompts", send)
    return lines
