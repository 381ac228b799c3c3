"""What a skill's frontmatter may hold, as pydantic models (the format: core/skills/skill.py).

A tool definition names its backend by the key it holds (`script`, `binary` or `http`), not by a
tag field, so the tool definitions are a union discriminated by which of those keys is present;
A3S Code's `backend: {type: ...}` is rewritten in those terms first (core/skills/a3s_code_backends.py).
Every problem is reported, one line each: the field path, then what is wrong. The checks that
need several fields (templates against the parameters and the declared env, a tool name used
twice) run once the fields themselves are valid.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from ...base.errors import InvalidArgument
from ...base.secrets import is_secret_name
from ...config import sandbox_network_setting
from ...tools.mcp.config import ServerSpec, parse_servers
from ...tools.registry import check_json_schema
from ...tools.skill_backends import (
    TEMPLATE,
    BinaryBackend,
    FieldPath,
    HttpBackend,
    ScriptBackend,
    SkillToolSpec,
)
from .a3s_code_backends import from_a3s_code

MAX_TIMEOUT_MS = 600_000
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")

_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_BACKENDS = ("script", "binary", "http")
_TAGS = {f"{backend} tool" for backend in _BACKENDS}  # the union's tags, left out of field paths
_TOOL_FIELDS = {
    "name",
    "description",
    "parameters",
    "timeout_ms",
    "interpreter",
    "language",
    "backend",
    *_BACKENDS,
}
# Our words for what pydantic finds wrong with these fields' values (not with a list's items).
_SAID = {
    "allowed-tools": "must be a comma-separated string or a list, not a {kind}",
    "allowed_tools": "must be a comma-separated string or a list, not a {kind}",
    "env": "must be a list of environment variable names, not a {kind}",
    "tools": "must be a list of tool definitions, not a {kind}",
    "timeout_ms": f"must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}",
    "script": "must be the script's source text",
    "binary": "must be a non-empty list: the program, then its arguments",
    "headers": "must map header names to strings",
    "body": "must be a string template, or a mapping or list sent as JSON",
}
_KINDS = {"NoneType": "null", "dict": "mapping", "str": "string", "bool": "boolean", "int": "number"}


def kind(value: Any) -> str:
    """A YAML value's kind, as a message names it."""
    name = type(value).__name__
    return _KINDS.get(name, "number" if name == "float" else name)


# ---------------------------------------------------------------- problems


def _faults(found: Iterable[tuple[FieldPath, str]]) -> ValidationError:
    """Problems at paths below the value a validator checks, for it to raise."""
    details = [
        InitErrorDetails(
            type=PydanticCustomError("skill", "{message}", {"message": message}), loc=at, input=None
        )
        for at, message in found
    ]
    return ValidationError.from_exception_data("skill", details)


def _fault(message: str, *at: str | int) -> ValidationError:
    return _faults([(at, message)])


def _problem(error: ErrorDetails) -> str:
    """`field.path: what is wrong`, in our words where pydantic's would be vague."""
    loc, problem = [part for part in error["loc"] if part not in _TAGS], error["type"]
    said = next((i for i, part in enumerate(loc) if part in _SAID and _not_an_item(loc[i + 1 :])), None)
    if problem == "missing":
        loc, message = loc[:-1], f"missing required field {loc[-1]!r}"
    elif said is not None and problem not in ("skill", "value_error"):
        loc, message = loc[: said + 1], _SAID[str(loc[said])].format(kind=kind(error["input"]))
    elif problem == "string_type":
        message = f"must be a string, not a {kind(error['input'])} (quote it)"
    elif problem == "value_error":
        message = str(error["ctx"]["error"])
    else:
        message = error["msg"]
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).removeprefix(".")
    # check_json_schema's messages read on from the field: "tools[0].parameters must describe an object".
    return f"{path}{' ' if problem == 'json_schema' else ': '}{message}" if path else message


def _not_an_item(rest: list[str | int]) -> bool:
    """Whether the rest of a path is within the value itself (a mapping's key, a union's branch)
    rather than in one of a list's items."""
    return not any(isinstance(part, int) for part in rest)


def _matching(pattern: str, otherwise: str) -> AfterValidator:
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise ValueError(f"{value!r} {otherwise}")
        return value

    return AfterValidator(check)


def _refuse_unknown(data: Mapping[Any, Any], known: Collection[str]) -> None:
    """Unknown keys are errors: a misspelt field would otherwise go unnoticed."""
    unknown = sorted(str(key) for key in data if key not in known)
    if unknown:
        raise _fault(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _not_secret(name: str, info: ValidationInfo) -> str:
    if is_secret_name(name, (info.context or {}).get("secret_names", ())):
        raise ValueError(
            f"{name} is one of the server's secrets (a token, key, password, LLM setting or a name the "
            "operator marks secret); a skill cannot read it"
        )
    return name


# ---------------------------------------------------------------- fields


def _mcp_servers(value: Any) -> dict[str, ServerSpec] | None:
    """The servers of `mcp-servers:` (with or without the mcpServers wrapper), each checked."""
    if value is None:
        return None
    try:
        return parse_servers(value, "")
    except InvalidArgument as exc:
        raise ValueError("; ".join(str(exc).splitlines())) from None


Text = Annotated[str, AfterValidator(str.strip)]  # (Python's idea of white space, not pydantic's)
EnvName = Annotated[
    Text, _matching(_ENV_NAME, "is not an environment variable name"), AfterValidator(_not_secret)
]
Rules = Annotated[  # `Bash(git add:*, git commit:*), Read`: split at the commas outside parentheses
    list[Text],
    BeforeValidator(lambda rules: re.split(r",(?![^(]*\))", rules) if isinstance(rules, str) else rules),
    AfterValidator(lambda rules: [rule for rule in rules if rule]),
]


class _Fields(BaseModel):
    # Strict: YAML's `2024`, `yes` and `!!binary` values are not strings.
    model_config = ConfigDict(strict=True, extra="forbid")


class _Http(_Fields):
    url: Text
    method: Text = "GET"
    headers: dict[Annotated[str, BeforeValidator(str)], str] | None = None
    body: str | dict[Any, Any] | list[Any] | None = (
        None  # a string template, or JSON with templates in its strings
    )

    @model_validator(mode="before")
    @classmethod
    def _url_alone(cls, data: Any) -> Any:
        """`http: <url>` is short for `http: {url: <url>}`."""
        if isinstance(data, str):
            return {"url": data}
        if not isinstance(data, dict):
            raise _fault("must be a URL or a mapping with url, method, headers and body")
        _refuse_unknown(data, cls.model_fields)
        return data

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str) -> str:
        if method.upper() not in HTTP_METHODS:
            raise ValueError(f"{method.upper()!r} is not one of {', '.join(HTTP_METHODS)}")
        return method.upper()


class _Tool(_Fields):
    name: Annotated[
        Text,
        _matching(r"[a-zA-Z0-9_-]{1,64}", "is not a valid tool name: use 1-64 letters, digits, '_' or '-'"),
    ]
    description: Text | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    timeout_ms: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_MS)] | None = None

    @field_validator("parameters", mode="before")
    @classmethod
    def _json_schema(cls, value: Any) -> Any:
        """The tool's JSON Schema, checked as RegisterTool checks a client's; `type: object` is
        filled in when left out, as LLM APIs require it."""
        if value is None:
            return {"type": "object", "properties": {}}
        try:
            schema = check_json_schema(value, "")
        except InvalidArgument as exc:
            raise PydanticCustomError("json_schema", "{message}", {"message": str(exc).strip()}) from None
        try:
            representable = json.loads(json.dumps(schema)) == schema
        except (TypeError, ValueError):
            representable = False
        if not representable:
            raise ValueError("holds values JSON cannot represent (dates, non-string keys...)")
        return {"type": "object", **schema}


class _ScriptTool(_Tool):
    script: Annotated[str, Field(pattern=r"\S")]
    # A command line such as `python3` or `bash -eu`; else the script's shebang, else bash.
    interpreter: Text = Field("", validation_alias=AliasChoices("interpreter", "language"))

    @field_validator("interpreter")
    @classmethod
    def _command(cls, command: str) -> str:
        if not shlex.split(command):  # (or ValueError: No closing quotation)
            raise ValueError("must name an interpreter such as python3 or bash")
        return command

    def backend(self) -> ScriptBackend:
        return ScriptBackend(
            self.script, tuple(shlex.split(self.interpreter or _shebang(self.script) or "bash"))
        )


class _BinaryTool(_Tool):
    binary: Annotated[list[str], Field(min_length=1)]

    @field_validator("binary")
    @classmethod
    def _program_named(cls, argv: list[str]) -> list[str]:
        if not argv[0].strip():
            raise _fault("must name the program to run", 0)
        return argv

    def backend(self) -> BinaryBackend:
        return BinaryBackend(tuple(self.binary))


class _HttpTool(_Tool):
    http: _Http

    def backend(self) -> HttpBackend:
        return HttpBackend(self.http.url, self.http.method, self.http.headers or {}, self.http.body)


def _shebang(source: str) -> str:
    """The interpreter command of a `#!` line, with `/usr/bin/env [-S]` dropped."""
    first = source.lstrip("\n").split("\n", 1)[0]
    if not first.startswith("#!"):
        return ""
    words = first[2:].split()
    if words and Path(words[0]).name == "env":
        words = words[1:]
        if words and words[0] == "-S":
            words = words[1:]
    return shlex.join(words)


def _tool_shape(entry: Any) -> Any:
    """What the union cannot tell apart: not a mapping, a misspelt key, no backend or several."""
    if not isinstance(entry, dict):
        raise _fault("must be a mapping (name, description, parameters, a backend)")
    if "backend" in entry:  # A3S Code's format: `backend: {type: binary, ...}`
        if any(key in entry for key in _BACKENDS):
            raise _fault("give the backend once: as backend, or as script, binary or http")
        entry, problems = from_a3s_code(entry)
        if problems:
            raise _faults(problems)
    _refuse_unknown(entry, _TOOL_FIELDS)
    backends = [key for key in _BACKENDS if key in entry]
    if len(backends) != 1:
        raise _fault(f"give exactly one backend of script, binary or http (found {len(backends)})")
    commands = [key for key in ("interpreter", "language") if key in entry]
    if commands and backends != ["script"]:
        raise _fault("interpreter and language only apply to a script backend")
    if len(commands) > 1:
        raise _fault("give interpreter or language, not both")
    return entry


ToolEntry = Annotated[
    Annotated[_ScriptTool, Tag("script tool")]
    | Annotated[_BinaryTool, Tag("binary tool")]
    | Annotated[_HttpTool, Tag("http tool")],
    Discriminator(lambda entry: next(f"{key} tool" for key in _BACKENDS if key in entry)),
    BeforeValidator(_tool_shape),
]


class Frontmatter(_Fields):
    """The fields of a skill's frontmatter; unknown ones are kept (Skill.metadata)."""

    model_config = ConfigDict(extra="allow")

    name: Annotated[
        Text,
        _matching(
            r"[A-Za-z0-9._-]{1,64}", "is not a valid skill name: use 1-64 letters, digits, '.', '_' or '-'"
        ),
    ]
    description: Text | None = None
    allowed_tools: Rules | None = Field(None, validation_alias=AliasChoices("allowed-tools", "allowed_tools"))
    env: list[EnvName] | None = (
        None  # the variables the skill reads: none of them one of the server's secrets
    )
    tools: list[ToolEntry] | None = None
    mcp_servers: Annotated[dict[str, Any] | None, BeforeValidator(_mcp_servers)] = Field(
        None, validation_alias=AliasChoices("mcp-servers", "mcp_servers")
    )  # the MCP servers the skill brings, in the mcpServers shape (tools/mcp/config.py)
    sandbox_network: Annotated[str, AfterValidator(sandbox_network_setting)] = Field(
        "", validation_alias=AliasChoices("sandbox-network", "sandbox_network")
    )  # the network of its tools' processes: honoured for the operator's skills only

    @field_validator("env")
    @classmethod
    def _each_once(cls, names: list[str] | None) -> list[str] | None:
        return list(dict.fromkeys(names)) if names else names

    @field_validator("tools")
    @classmethod
    def _names_once(cls, tools: list[_Tool] | None) -> list[_Tool] | None:
        names = [tool.name for tool in tools or []]
        twice = [
            ((i, "name"), f"{name!r} is defined twice") for i, name in enumerate(names) if name in names[:i]
        ]
        if twice:
            raise _faults(twice)
        return tools

    @model_validator(mode="after")
    def _templates_filled(self) -> Self:
        """Refuse `${...}` references that could never be filled, or that read a variable the
        skill does not declare."""
        found = [
            (("tools", index, *at), problem)
            for index, tool in enumerate(self.tools or [])
            for at, template in tool.backend().templates()
            for key in TEMPLATE.findall(template)
            if (problem := _template_problem(key, tool.parameters, self.env or []))
        ]
        if found:
            raise _faults(found)
        return self

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            key: value
            for key, value in (self.model_extra or {}).items()
            if key not in ("allowed_tools", "mcp_servers")
        }

    def tool_specs(self) -> list[SkillToolSpec]:
        env = tuple(self.env or ())
        return [
            SkillToolSpec(
                tool.name,
                tool.description or "",
                tool.parameters,
                (backend := tool.backend()),
                tool.timeout_ms or backend.default_timeout_ms,
                env,
            )
            for tool in self.tools or []
        ]


def _template_problem(key: str, parameters: dict[str, Any], env: list[str]) -> str:
    declared = parameters.get("properties", {})
    if not key.startswith("env:"):
        known = ", ".join(sorted(declared)) or "it has none"
        return "" if key in declared else f"${{{key}}} is not one of the tool's parameters ({known})"
    if not re.fullmatch(_ENV_NAME, key[4:]):
        return f"${{{key}}} does not name an environment variable"
    if key[4:] not in env:
        return (
            f"${{{key}}} reads a variable the skill does not declare; "
            f"list it in the skill's env field (env: [{key[4:]}])"
        )
    return ""


def read_frontmatter(data: dict[Any, Any], source: str, secret_names: frozenset[str]) -> Frontmatter:
    """The validated frontmatter, or InvalidArgument with a line per problem, each naming the source."""
    try:
        return Frontmatter.model_validate(
            {str(key): value for key, value in data.items()}, context={"secret_names": secret_names}
        )
    except ValidationError as exc:
        problems = dict.fromkeys(f"{source}: {_problem(error)}" for error in exc.errors())
        raise InvalidArgument("\n".join(problems)) from None
