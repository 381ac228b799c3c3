"""Our tools and their results as MCP's: a Tool with its JSON Schema, a ToolOutput as a
CallToolResult, a domain error as a failed one (the caller's model reads it and can correct itself)."""

from __future__ import annotations

from mcp import types
from pydantic import ValidationError

from ...app.types import Tool, ToolOutput
from ..status import failure


def tool_of(tool: Tool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.parameters_schema,
        annotations=types.ToolAnnotations(
            read_only_hint=tool.lane == "query", open_world_hint=tool.family == "web"
        ),
    )


def text_result(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=error)


def result_of(output: ToolOutput) -> types.CallToolResult:
    """What the tool printed; a failure says why first, as the model of our own loop reads it."""
    if output.success:
        return text_result(output.output)
    return text_result("\n".join(part for part in (output.error, output.output) if part), error=True)


def error_result(exc: BaseException) -> types.CallToolResult:
    """A call the app layer refused or that failed: `NOT_FOUND: session 'x' does not exist`."""
    status, message = failure(exc)
    return text_result(f"{status}: {message}", error=True)


def problems(exc: ValidationError) -> str:
    """What is wrong with a validated value, field by field: `task: Field required`."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}" for e in exc.errors())
