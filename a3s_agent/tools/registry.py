"""The tool registry: named tools with pydantic argument models, validated and run in one place.

A tool is an async function taking its argument model and a ToolContext. Its
docstring is the description the LLM reads; its argument model gives the JSON
Schema shown to LLMs and clients and validates every call.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError

from ..base.errors import InvalidArgument, NotFound
from ..base.jsontext import parse_json
from ..base.memories import Memory, MemoryQuery, MemoryType
from ..base.models import Attachment, Todo
from . import sandbox
from .aliases import our_arguments, our_tool_name
from .sandbox import Place

if TYPE_CHECKING:  # tools/lsp imports this module
    from .lsp.servers import LanguageServers

DEFAULT_MAX_OUTPUT_BYTES = 100_000

Family = Literal["file", "code", "command", "git", "web", "interaction", "mcp"]
Lane = Literal["query", "execute"]


class ToolFailure(Exception):
    """Raised by a tool that ran and failed; becomes ToolOutput(success=False, error=message)."""

    def __init__(self, message: str, **metadata: Any) -> None:
        super().__init__(message)
        self.metadata = metadata


@dataclass
class ToolOutput:
    success: bool = True
    output: str = ""
    error: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    attachments: list[Attachment] = field(default_factory=list)
    """What the model is shown beside `output` (read_file's image). They go into the history with the
    result; `output` describes them, and it is all ExecuteTool's clients get."""

    def string_metadata(self) -> dict[str, str]:
        """Metadata as the wire wants it: strings, JSON for everything else ("true", 3, [...])."""
        return {key: _as_string(value) for key, value in self.metadata.items()}


def _as_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):  # (before int: a bool is an int)
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


class TodoStore(Protocol):
    """Sessions' todo lists, as the `todo` tool reaches them (the runtime keeps them with the session)."""

    async def get(self, session_id: str) -> list[Todo]: ...

    async def set(self, session_id: str, todos: list[Todo]) -> list[Todo]: ...


class MemoryKeeper(Protocol):
    """Sessions' memories, as the `remember` and `recall` tools reach them (core/sessions/memories.py)."""

    async def remember(
        self,
        session_id: str,
        content: str,
        memory_type: MemoryType = MemoryType.EPISODIC,
        importance: float = 0.5,
        tags: Sequence[str] = (),
        metadata: Mapping[str, str] | None = None,
        timestamp: int = 0,
        where: str = "memory",
    ) -> Memory: ...

    async def search(
        self, session_id: str, query: MemoryQuery, *, used: bool = False
    ) -> tuple[list[Memory], int]: ...


@dataclass(frozen=True)
class Caller:
    """The model call a tool runs for, when a generation runs it (the `task` tool starts its
    subagent from it)."""

    call_id: str
    offered: frozenset[str]
    """The names of the tools the calling model has in this generation."""
    notify: Callable[[dict[str, str]], None]
    """Tells the generation's caller something while the call runs (a stream's METADATA chunk)."""


@dataclass
class ToolContext:
    """Where and how a tool runs."""

    workspace: Path
    env: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    todos: TodoStore | None = None
    memories: MemoryKeeper | None = None
    network: str = ""  # of the call's processes, when the operator gave its tool one ("": the server's)
    lsp: LanguageServers | None = None
    """The server's language servers: edits report the errors a running one finds, code navigation
    asks one that runs (tools/lsp/for_model.py)."""
    caller: Caller | None = None  # set for a call a generation's model made (None: ExecuteTool's)

    @property
    def place(self) -> Place:
        """Where the call's processes work: its workspace, its session's HOME, its network
        (tools/sandbox/)."""
        return Place(self.workspace, self.session_id, network=self.network)


ToolFunction = Callable[[Any, ToolContext], Awaitable[ToolOutput | str]]


@dataclass(frozen=True)
class RuleSubject:
    """What the pattern of a permission rule about the tool (`Read(src/**)`) is matched against:
    the call's argument `argument`, read as `kind` (core/policy/matching.py): a workspace path
    (a list: each of its paths), a URL (`domain:` patterns) or text. A path argument not given is
    the workspace root, unless `otherwise` names what to match instead. A tool that declares no
    subject has its arguments matched as JSON text; bash's command is the engine's own."""

    argument: str
    kind: Literal["path", "url", "text"] = "path"
    otherwise: RuleSubject | None = None


PATH = RuleSubject("path")
"""The rule subject of a tool that works on the workspace path in its `path` argument."""


@dataclass
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    run: ToolFunction
    family: Family
    lane: Lane
    # Appended to cut output: how to see the rest (offset/limit, a narrower pattern...).
    truncation_hint: str = "narrow the request to see the rest"
    # Run by the host, not here: calls become external tasks the client completes (RegisterTool).
    external: bool = False
    # Tools defined by clients and skills bring a JSON Schema instead of a pydantic model.
    json_schema: dict[str, Any] | None = None
    # Offered only to a model speaking the CodingAgent text protocol (edit_lines, for its EDIT_FILE).
    text_protocol_only: bool = False
    rule_subject: RuleSubject | None = None
    _schema: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def tags(self) -> list[str]:
        return [self.family, self.lane]

    @property
    def parameters_schema(self) -> dict[str, Any]:
        if self._schema is None:
            self._schema = self.json_schema or _clean_schema(self.args_model.model_json_schema())
        return self._schema

    @property
    def parameter_names(self) -> list[str]:
        if self.json_schema is not None:
            return list(self.json_schema.get("properties", {}))
        return list(self.args_model.model_fields)

    def parse_arguments(self, arguments: str | dict[str, Any]) -> BaseModel:
        """Validate raw arguments; InvalidArgument lists every schema error. A built-in tool takes
        A3S Code's argument names too (aliases.py)."""
        if isinstance(arguments, str):
            arguments = parse_json(arguments.strip() or "{}", f"arguments for {self.name}")
        if not isinstance(arguments, dict):
            raise InvalidArgument(f"arguments for {self.name} must be a JSON object")
        if self.json_schema is not None:
            return _validated_by_schema(self.name, self.json_schema, arguments)
        try:
            return self.args_model.model_validate(our_arguments(self.name, arguments))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise InvalidArgument(f"invalid arguments for {self.name}: {problems}") from exc

    async def execute(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        """Run with validated arguments: failures become results, output is capped."""
        started = time.perf_counter()
        with sandbox.recording() as spawned:
            try:
                result = await self.run(args, ctx)
            except ToolFailure as exc:
                result = ToolOutput(success=False, error=str(exc), metadata=dict(exc.metadata))
            except OSError as exc:  # what the system refused (a name too long...) is the call's failure
                result = ToolOutput(success=False, error=f"{self.name} failed: {exc.strerror or exc}")
        if isinstance(result, str):
            result = ToolOutput(output=result)
        result.metadata.setdefault("duration_ms", round((time.perf_counter() - started) * 1000, 3))
        if spawned:  # which sandbox ran its processes (the last one's, should they differ)
            result.metadata.setdefault("sandbox", spawned[-1].mechanism)
            result.metadata.setdefault("sandbox_network", spawned[-1].network)
            refused = [said for ran in spawned for said in ran.refused]
            if refused and not result.success:
                said = f"the sandbox's network proxy refused {'; '.join(refused)}"
                result.error = f"{result.error}; {said}" if result.error else said
        return _capped(result, ctx.max_output_bytes, self.truncation_hint)


class JsonArguments(BaseModel):
    """Arguments of a tool described by a JSON Schema: validated by jsonschema, kept as given."""

    model_config = ConfigDict(extra="allow")


def _validated_by_schema(name: str, schema: dict[str, Any], arguments: dict[str, Any]) -> JsonArguments:
    import jsonschema  # only tools defined by clients and skills need it

    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(arguments)'}: {error.message}"
        for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    ]
    if problems:
        raise InvalidArgument(f"invalid arguments for {name}: {'; '.join(problems)}")
    return JsonArguments(**arguments)


def check_json_schema(schema: Any, field: str, *, for_arguments: bool = True) -> dict[str, Any]:
    """A JSON Schema from a client or a skill, or InvalidArgument naming the fault. A tool's
    parameters (`for_arguments`) must describe an object."""
    import jsonschema

    if not isinstance(schema, dict):
        raise InvalidArgument(f"{field} must be a JSON Schema object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidArgument(f"{field} is not a valid JSON Schema: {exc.message}") from exc
    except RecursionError:
        raise InvalidArgument(f"{field} is nested too deeply") from None
    if for_arguments and schema.get("type", "object") != "object":
        raise InvalidArgument(f"{field} must describe an object (type: object)")
    return schema


def _clean_schema(schema: Any) -> Any:
    """Drop pydantic's titles, which only add noise for an LLM."""
    if isinstance(schema, dict):
        return {
            key: _clean_schema(value)
            for key, value in schema.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(schema, list):
        return [_clean_schema(item) for item in schema]
    return schema


def _capped(result: ToolOutput, limit: int, hint: str) -> ToolOutput:
    encoded = result.output.encode("utf-8", errors="replace")
    if len(encoded) <= limit:
        result.metadata.setdefault("truncated", False)
        return result
    kept = encoded[:limit].decode("utf-8", errors="ignore")
    result.output = f"{kept}\n[output truncated at {limit} bytes of {len(encoded)}; {hint}]"
    result.metadata["truncated"] = True
    return result


def tool(
    name: str,
    *,
    family: Family,
    lane: Lane,
    truncation_hint: str | None = None,
    external: bool = False,
    text_protocol_only: bool = False,
    rule_subject: RuleSubject | None = None,
) -> Callable[[ToolFunction], Tool]:
    """Make a Tool of an async function `(args: Model, ctx: ToolContext)`; its docstring describes
    it, `rule_subject` what permission rules about it match (PATH: a tool taking a workspace path)."""

    def wrap(fn: ToolFunction) -> Tool:
        hints = get_type_hints(fn)
        first = next(iter(inspect.signature(fn).parameters))
        model = hints[first]
        description = inspect.getdoc(fn) or ""
        extra: dict[str, Any] = {"truncation_hint": truncation_hint} if truncation_hint else {}
        return Tool(
            name,
            description,
            model,
            fn,
            family,
            lane,
            external=external,
            text_protocol_only=text_protocol_only,
            rule_subject=rule_subject,
            **extra,
        )

    return wrap


class ToolRegistry:
    """Tools by name, with the server's enabled/disabled filter applied on lookup.

    Tools offered only to text-protocol models are kept apart: Initialize's tool lists do not
    name them, lookups by name do not find them, and `offered` adds them for such a model."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._text_protocol_tools: dict[str, Tool] = {}
        self._enabled: set[str] | None = None
        self._disabled: set[str] = set()
        self.reserved: set[str] = set()
        """Names of tools made elsewhere (per session: `task`) that Initialize's lists may name."""
        for item in tools:
            self.register(item)

    def register(self, item: Tool) -> None:
        if item.name in self._tools or item.name in self._text_protocol_tools:
            raise ValueError(f"tool {item.name!r} is registered twice")
        (self._text_protocol_tools if item.text_protocol_only else self._tools)[item.name] = item

    def configure(self, enabled: Iterable[str] = (), disabled: Iterable[str] = ()) -> None:
        """Apply Initialize's tool lists (A3S Code's names too): empty `enabled` means all;
        `disabled` always wins."""
        enabled, disabled = {self._named(n) for n in enabled}, {self._named(n) for n in disabled}
        unknown = sorted((enabled | disabled) - set(self._tools) - self.reserved)
        if unknown:
            raise InvalidArgument(f"config.tools names unknown tools: {', '.join(unknown)}")
        self._enabled = enabled or None
        self._disabled = disabled

    def _named(self, name: str) -> str:
        """The registered tool `name` means: itself, else the tool its A3S Code name stands for."""
        return name if name in self._tools else our_tool_name(name)

    def names(self) -> list[str]:
        """Every registered tool, enabled or not."""
        return list(self._tools)

    def registered(self) -> list[Tool]:
        """Every registered tool, enabled or not, those offered only to text-protocol models too."""
        return [*self._tools.values(), *self._text_protocol_tools.values()]

    def has(self, name: str) -> bool:
        """Registered, whether enabled or not."""
        return name in self._tools

    def is_enabled(self, name: str) -> bool:
        return name in self._tools and self.lets(name)

    def lets(self, name: str) -> bool:
        """Whether Initialize's tool lists let the tool `name` be offered."""
        return name not in self._disabled and (self._enabled is None or name in self._enabled)

    def enabled(self) -> list[Tool]:
        return [t for name, t in self._tools.items() if self.is_enabled(name)]

    def offered(self, *, text_protocol: bool) -> list[Tool]:
        """The tools offered to a model: the enabled ones, and, when it speaks the text protocol,
        those offered only to such a model."""
        return [*self.enabled(), *(self._text_protocol_tools.values() if text_protocol else ())]

    def get(self, name: str) -> Tool:
        if name not in self._tools:
            raise NotFound(f"unknown tool {name!r}")
        if not self.is_enabled(name):
            raise NotFound(f"tool {name!r} is disabled on this server")
        return self._tools[name]

    async def run(self, name: str, arguments: str | dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Look up, validate and execute one call."""
        item = self.get(name)
        return await item.execute(item.parse_arguments(arguments), ctx)
