"""Skills: instructions for the model, plus the tools a skill may use and the tools it adds.

A skill is a directory `<name>/SKILL.md` or a single `.md` file: YAML frontmatter between
`---` lines, then a markdown body of instructions.

    ---
    name: word-count                     # required, [A-Za-z0-9._-]{1,64}
    description: Count lines and words.
    allowed-tools: Bash(wc:*), Read      # or a YAML list
    env: [WC_LOCALE]                     # optional: the environment variables the skill reads
    tools:                               # optional: tools this skill adds
      - name: count_lines                # [a-zA-Z0-9_-]{1,64}
        description: Line and word counts of a workspace file.
        parameters: {type: object, properties: {path: {type: string}}, required: [path]}
        timeout_ms: 30000                # optional
        script: |                        # exactly one backend: script, binary or http
          #!/usr/bin/env python3
          ...
    ---
    Instructions in markdown.

Backends:
- `script`: an inline script run in the workspace by `interpreter` (alias `language`, a command
  line such as `python3` or `bash -eu`), else its shebang, else bash. The arguments arrive in
  the environment: `TOOL_ARGS` (all of them as JSON) and `TOOL_ARG_<NAME>` (each one; name
  upper-cased, other characters as `_`; strings as is, other values as JSON).
- `binary`: an argv list, run without a shell; `[echo, "${msg}"]`.
- `http`: `{url, method (GET), headers, body}` or just the URL; `body` is a string template, or
  a mapping/list sent as JSON in which a string that is exactly `${arg}` keeps the argument's type.
  Requests go through tools/fetcher.py, as web_fetch's do: public addresses only (unless
  A3S_FETCH_ALLOW_PRIVATE=1), the checked address is the one connected to, at most 5 redirects.

Templates: `${arg}` is an argument (its schema default when not given; strings as is, other
values as JSON; percent-encoded in an http URL), `${env:VAR}` a variable the skill declares in
`env`: the session's env (Initialize), then the server's environment. Every reference is checked
when the skill is parsed: against the parameters, and against `env`. `env` may not name one of
the server's secrets (tools/environment.py is_secret_name, and the names the operator marks).
Script and binary processes get the tool environment (tools/environment.py) plus the session's
env, the declared variables and, for scripts, the arguments.
Python interpreters (`python`, `python3`) run as the agent's own interpreter.

Unknown top-level frontmatter keys are kept in `Skill.metadata`; unknown keys in a tool
definition are errors, since a misspelt backend would otherwise go unnoticed.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
import yaml
from pydantic import BaseModel

from ..base.errors import InvalidArgument, NotFound
from ..base.secrets import is_secret_name
from ..tools.fetcher import connection_problem, decode, fetch, private_allowed, read_capped
from ..tools.process import ProcessResult, find_binary, run_process
from ..tools.registry import (
    Family,
    JsonArguments,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    check_json_schema,
)

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
MAX_TIMEOUT_MS = 600_000
SKILL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TEMPLATE = re.compile(r"\$\{([^{}]*)\}")
_FENCES = ("---", "...")
_FRONTMATTER_FORM = "a skill starts with YAML frontmatter: a '---' line, 'name: ...' and the other fields, then another '---' line"
# Room kept under the output limit for our own notes, so Tool.execute never cuts them off.
_NOTE_RESERVE_BYTES = 256
_SKILL_FIELDS = {"name", "description", "allowed-tools", "allowed_tools", "env", "tools"}
_BACKENDS = ("script", "binary", "http")
_TOOL_FIELDS = {"name", "description", "parameters", "timeout_ms", "interpreter", "language", *_BACKENDS}
_HTTP_FIELDS = {"url", "method", "headers", "body"}
_PYTHON_NAMES = {"python", "python3"}
_KINDS = {
    type(None): "null",
    dict: "mapping",
    list: "list",
    str: "string",
    bool: "boolean",
    int: "number",
    float: "number",
}


# ---------------------------------------------------------------- templates


def _argument(name: str, arguments: Mapping[str, Any]) -> Any:
    if name not in arguments:
        raise ToolFailure(f"argument {name!r} is needed by this tool but was not given")
    return arguments[name]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _declared_values(names: Iterable[str], ctx: ToolContext) -> dict[str, str]:
    """The values of a skill's declared variables that are set: the session's env, then the server's."""
    values = {name: ctx.env.get(name, os.environ.get(name)) for name in names}
    return {name: value for name, value in values.items() if value is not None}


def _env_value(name: str, variables: Mapping[str, str]) -> str:
    if name not in variables:
        raise ToolFailure(
            f"environment variable {name} is not set (neither in the session's env nor the server's)"
        )
    return variables[name]


def _substitute(
    template: str, arguments: Mapping[str, Any], variables: Mapping[str, str], *, encode: bool = False
) -> str:
    """Fill `${arg}` and `${env:VAR}` (from `variables`, the declared ones); `encode` percent-encodes
    arguments (not env values, which are trusted configuration such as a base URL)."""

    def replace(match: re.Match[str]) -> str:
        key = match.group(1)
        if key.startswith("env:"):
            return _env_value(key[4:], variables)
        text = _as_text(_argument(key, arguments))
        return quote(text, safe="") if encode else text

    return _TEMPLATE.sub(replace, template)


def _render(body: Any, arguments: Mapping[str, Any], variables: Mapping[str, str]) -> Any:
    """A JSON body template: strings are substituted, and a string that is exactly `${arg}`
    becomes the argument itself, so numbers, lists and objects keep their type."""
    if isinstance(body, str):
        whole = _TEMPLATE.fullmatch(body)
        if whole and not whole.group(1).startswith("env:"):
            return _argument(whole.group(1), arguments)
        return _substitute(body, arguments, variables)
    if isinstance(body, dict):
        return {key: _render(value, arguments, variables) for key, value in body.items()}
    if isinstance(body, list):
        return [_render(item, arguments, variables) for item in body]
    return body


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every string in a nested value with the field path it sits at."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{where}[{index}]")


# ---------------------------------------------------------------- backends


def _program(name: str, cwd: Path) -> str:
    """The executable for a program name or path (relative to `cwd`). A path that is not
    executable here falls back to its name on PATH, so `#!/usr/local/bin/node` finds
    /usr/bin/node; Python is always the agent's own interpreter."""
    if Path(name).name in _PYTHON_NAMES:
        return sys.executable
    if "/" in name and os.access(cwd / name, os.X_OK):
        return str(cwd / name)
    found = find_binary(Path(name).name)
    if found is None:
        raise ToolFailure(f"{name} is not installed on this machine (not found on PATH)")
    return found


async def _run(argv: list[str], ctx: ToolContext, env: Mapping[str, str], timeout_s: float) -> ToolOutput:
    """Run argv with the tool environment plus the session's env and `env` (declared variables,
    arguments): never the rest of the server's environment."""
    try:
        result = await run_process(
            argv,
            cwd=ctx.workspace.resolve(),
            extra_env={**ctx.env, **env},
            timeout_s=timeout_s,
            max_output_bytes=max(ctx.max_output_bytes - _NOTE_RESERVE_BYTES, 1),
        )
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument or the env
        raise ToolFailure(f"cannot run {argv[0]}: {exc}") from exc
    return _process_output(result, timeout_s)


def _process_output(result: ProcessResult, timeout_s: float) -> ToolOutput:
    if result.timed_out:
        error = f"timed out after {timeout_s:g} s; the process and its children were killed"
    elif result.exit_code < 0:
        error = f"killed by signal {-result.exit_code}"
    elif result.exit_code:
        error = f"exited with code {result.exit_code}"
    else:
        error = ""
    metadata = {"exit_code": result.exit_code, "timed_out": result.timed_out, "truncated": result.truncated}
    return ToolOutput(success=not error, output=result.output, error=error, metadata=metadata)


def _argument_env(arguments: Mapping[str, Any]) -> dict[str, str]:
    env = {"TOOL_ARGS": json.dumps(arguments)}
    for name, value in arguments.items():
        env["TOOL_ARG_" + re.sub(r"[^A-Z0-9_]", "_", name.upper())] = _as_text(value)
    return env


@dataclass(frozen=True)
class ScriptBackend:
    source: str
    interpreter: tuple[str, ...]  # as declared; resolved to an executable when the tool runs

    family: ClassVar[Family] = "command"
    default_timeout_ms: ClassVar[int] = 120_000

    def templates(self) -> Iterator[tuple[str, str]]:
        return iter(())

    async def run(
        self, arguments: Mapping[str, Any], ctx: ToolContext, variables: Mapping[str, str], timeout_s: float
    ) -> ToolOutput:
        argv = [_program(self.interpreter[0], ctx.workspace), *self.interpreter[1:]]
        # Outside the workspace, so the script never shows up in it.
        with tempfile.TemporaryDirectory(prefix="a3s-skill-") as temp:
            script = Path(temp) / "script"
            script.write_text(self.source, encoding="utf-8")
            env = {**variables, **_argument_env(arguments)}
            return await _run([*argv, str(script)], ctx, env, timeout_s)


@dataclass(frozen=True)
class BinaryBackend:
    argv: tuple[str, ...]

    family: ClassVar[Family] = "command"
    default_timeout_ms: ClassVar[int] = 120_000

    def templates(self) -> Iterator[tuple[str, str]]:
        return _strings(list(self.argv), "binary")

    async def run(
        self, arguments: Mapping[str, Any], ctx: ToolContext, variables: Mapping[str, str], timeout_s: float
    ) -> ToolOutput:
        argv = [_substitute(item, arguments, variables) for item in self.argv]
        return await _run([_program(argv[0], ctx.workspace), *argv[1:]], ctx, variables, timeout_s)


@dataclass(frozen=True)
class HttpBackend:
    url: str
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # a string template, or JSON data with templates in its strings

    family: ClassVar[Family] = "web"
    default_timeout_ms: ClassVar[int] = 30_000

    def templates(self) -> Iterator[tuple[str, str]]:
        yield "http.url", self.url
        yield from _strings(self.headers, "http.headers")
        yield from _strings(self.body, "http.body")

    async def run(
        self, arguments: Mapping[str, Any], ctx: ToolContext, variables: Mapping[str, str], timeout_s: float
    ) -> ToolOutput:
        url = _substitute(self.url, arguments, variables, encode=True)
        headers = {name: _substitute(value, arguments, variables) for name, value in self.headers.items()}
        body = _render(self.body, arguments, variables)
        payload = {"content": body} if isinstance(body, str) else {"json": body} if body is not None else {}
        limit = max(ctx.max_output_bytes - _NOTE_RESERVE_BYTES, 1)
        # Errors name the URL template: the real URL may carry a value from the environment.
        try:
            async with fetch(
                self.method,
                url,
                allow_private=private_allowed(ctx),
                timeout_s=timeout_s,
                headers=headers,
                shown_url=self.url,
                **payload,
            ) as fetched:
                response = fetched.response
                data, truncated = await read_capped(response, limit)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ToolFailure(f"{self.method} {self.url} timed out after {timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise ToolFailure(f"{self.method} {self.url} failed: {connection_problem(exc)}") from exc
        except ToolFailure as exc:  # refused by the fetcher: not http(s), not a public address...
            raise ToolFailure(f"{self.method} {self.url} failed: {exc}") from exc
        text = decode(data, response.charset_encoding)
        status = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
        if truncated:
            text += f"\n[body truncated at {limit} bytes]"
        return ToolOutput(
            success=response.status_code < 400,
            output=f"{status}\n\n{text}",
            error=status if response.status_code >= 400 else "",
            metadata={
                "status_code": response.status_code,
                "content_type": response.headers.get("content-type", ""),
                "truncated": truncated,
            },
        )


Backend = ScriptBackend | BinaryBackend | HttpBackend


# ---------------------------------------------------------------- skills


@dataclass(frozen=True)
class SkillToolSpec:
    """A tool defined in a skill's frontmatter."""

    name: str
    description: str
    parameters: dict[str, Any]
    backend: Backend
    timeout_ms: int
    env: tuple[str, ...] = ()  # the skill's declared environment variables

    def build(self) -> Tool:
        defaults = {
            name: prop["default"]
            for name, prop in self.parameters.get("properties", {}).items()
            if isinstance(prop, dict) and "default" in prop
        }

        async def run(args: BaseModel, ctx: ToolContext) -> ToolOutput:
            arguments = {**copy.deepcopy(defaults), **(args.model_extra or {})}
            variables = _declared_values(self.env, ctx)
            return await self.backend.run(arguments, ctx, variables, self.timeout_ms / 1000)

        return Tool(
            self.name,
            self.description,
            JsonArguments,
            run,
            self.backend.family,
            "execute",
            json_schema=self.parameters,
        )


@dataclass
class Skill:
    name: str
    description: str = ""
    allowed_tools: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)  # the environment variables it may read
    instructions: str = ""  # the markdown body
    tools: list[SkillToolSpec] = field(default_factory=list)
    source: str = "client"  # the file it came from, or "client"
    metadata: dict[str, Any] = field(default_factory=dict)  # frontmatter keys we do not interpret
    text: str = field(default="", repr=False, compare=False)  # what it was parsed from, kept to store it

    @property
    def tool_names(self) -> list[str]:
        return [spec.name for spec in self.tools]

    def build_tools(self) -> list[Tool]:
        """Registry tools for this skill's tool definitions, ready to register."""
        return [spec.build() for spec in self.tools]


def parse_skill(text: str, *, source: str, secret_names: Iterable[str] = ()) -> Skill:
    """A skill from SKILL.md text; InvalidArgument names the source and the line or field at fault.

    `secret_names` are the variables the operator marks secret, besides those is_secret_name
    recognises; the skill's `env` may name none of them."""
    first_line, frontmatter, body = _split_frontmatter(text, source)
    data = _load_yaml(frontmatter, first_line, source)
    try:
        skill = _skill_from(data, body.strip(), source, frozenset(secret_names))
    except InvalidArgument as exc:
        raise InvalidArgument(f"{source}: {exc}") from None
    skill.text = text
    return skill


def load_skill_file(path: Path | str, secret_names: Iterable[str] = ()) -> Skill:
    """A skill from a `.md` file, or from a skill directory's SKILL.md."""
    path = Path(path)
    file = path / SKILL_FILE if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise NotFound(f"no skill file at {file}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{file}: cannot be read: {exc}") from exc
    return parse_skill(text, source=str(file), secret_names=secret_names)


def scan_skill_dirs(dirs: Iterable[Path | str], secret_names: Iterable[str] = ()) -> dict[str, Skill]:
    """Skills by name from `<dir>/<name>/SKILL.md` and `<dir>/*.md`, in name order.

    The first skill with a name wins: earlier directories take precedence over later ones.
    Missing directories, invalid skills and duplicates are logged as warnings and skipped, so
    one bad file does not take the others down.
    """
    skills: dict[str, Skill] = {}
    for directory in dirs:
        for file in _skill_files(Path(directory)):
            try:
                skill = load_skill_file(file, secret_names)
            except (InvalidArgument, NotFound) as exc:
                log.warning("skipping skill file: %s", exc)
                continue
            if skill.name in skills:
                log.warning(
                    "skipping skill %r from %s: already loaded from %s",
                    skill.name,
                    file,
                    skills[skill.name].source,
                )
                continue
            skills[skill.name] = skill
    return skills


def _skill_files(directory: Path) -> list[Path]:
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        log.warning("cannot read skill directory %s: %s", directory, exc)
        return []
    files = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and (entry / SKILL_FILE).is_file():
            files.append(entry / SKILL_FILE)
        elif entry.is_file() and entry.suffix.lower() == ".md":
            files.append(entry)
    return files


# ---------------------------------------------------------------- frontmatter


def _split_frontmatter(text: str, source: str) -> tuple[int, str, str]:
    """(file line of the first YAML line, the YAML, the body). Line endings are normalised;
    a byte-order mark and blank lines before the opening fence are allowed."""
    lines = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    if start == len(lines):
        raise InvalidArgument(f"{source}: the skill is empty; {_FRONTMATTER_FORM}")
    if lines[start].rstrip() != "---":
        raise InvalidArgument(f"{source}: line {start + 1}: {_FRONTMATTER_FORM}")
    for end in range(start + 1, len(lines)):
        if lines[end].rstrip() in _FENCES:
            return start + 2, "\n".join(lines[start + 1 : end]), "\n".join(lines[end + 1 :])
    raise InvalidArgument(f"{source}: line {start + 1}: the frontmatter is never closed with a '---' line")


class _FrontmatterLoader(yaml.SafeLoader):
    """SafeLoader without aliases: a few `*ref`s can make a tiny document expand exponentially
    once it is turned into JSON, and frontmatter has no need for them."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not allowed in skill frontmatter",
                self.peek_event().start_mark,
            )
        return super().compose_node(parent, index)


def _load_yaml(frontmatter: str, first_line: int, source: str) -> dict[Any, Any]:
    try:
        data = yaml.load(frontmatter, Loader=_FrontmatterLoader)
    except yaml.MarkedYAMLError as exc:
        raise InvalidArgument(f"{source}: {_yaml_problem(exc, first_line)}") from None
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{source}: invalid YAML frontmatter: {exc}") from None
    except RecursionError:
        raise InvalidArgument(f"{source}: the frontmatter is nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(
            f"{source}: line {first_line}: the frontmatter must be a mapping of fields "
            f"(name: ..., description: ...), not a {_kind(data)}"
        )
    return data


def _yaml_problem(exc: yaml.MarkedYAMLError, first_line: int) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"line {first_line + mark.line}" if mark else "frontmatter"
    problem = f"{where}: invalid YAML: {exc.problem or exc.context}"
    if exc.context and exc.problem and exc.context_mark:
        problem += f" ({exc.context} on line {first_line + exc.context_mark.line})"
    return problem


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _skill_from(data: dict[Any, Any], instructions: str, source: str, secret_names: frozenset[str]) -> Skill:
    if "name" not in data:
        raise InvalidArgument("missing required field 'name'")
    name = _string(data["name"], "name")
    if not SKILL_NAME.fullmatch(name):
        raise InvalidArgument(
            f"name: {name!r} is not a valid skill name: use 1-64 letters, digits, '.', '_' or '-'"
        )
    allowed_key = "allowed-tools" if "allowed-tools" in data else "allowed_tools"
    env = _env_names(data.get("env"), "env", secret_names)
    return Skill(
        name=name,
        description=_optional_string(data.get("description"), "description"),
        allowed_tools=_allowed_tools(data.get(allowed_key), allowed_key),
        env=env,
        instructions=instructions,
        tools=_tool_specs(data.get("tools"), tuple(env)),
        source=source,
        metadata={str(key): value for key, value in data.items() if key not in _SKILL_FIELDS},
    )


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{where}: must be a string, not a {_kind(value)} (quote it)")
    return value.strip()


def _optional_string(value: Any, where: str) -> str:
    return "" if value is None else _string(value, where)


def _allowed_tools(value: Any, where: str) -> list[str]:
    """A list, or a string split at the commas outside parentheses: `Bash(git add:*, git commit:*), Read`."""
    if value is None:
        return []
    if isinstance(value, str):
        items = re.split(r",(?![^(]*\))", value)
    elif isinstance(value, list):
        items = [_string(item, f"{where}[{i}]") for i, item in enumerate(value)]
    else:
        raise InvalidArgument(f"{where}: must be a comma-separated string or a list, not a {_kind(value)}")
    return [item.strip() for item in items if item.strip()]


def _env_names(value: Any, where: str, secret_names: frozenset[str]) -> list[str]:
    """The declared environment variables: a list of names, none of them one of the server's secrets."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgument(f"{where}: must be a list of environment variable names, not a {_kind(value)}")
    names: list[str] = []
    for index, item in enumerate(value):
        name = _string(item, f"{where}[{index}]")
        if not _ENV_NAME.fullmatch(name):
            raise InvalidArgument(f"{where}[{index}]: {name!r} is not an environment variable name")
        if is_secret_name(name, secret_names):
            raise InvalidArgument(
                f"{where}[{index}]: {name} is one of the server's secrets (a token, key, password, LLM "
                "setting or a name the operator marks secret); a skill cannot read it"
            )
        if name not in names:
            names.append(name)
    return names


def _tool_specs(value: Any, env: tuple[str, ...]) -> list[SkillToolSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgument(f"tools: must be a list of tool definitions, not a {_kind(value)}")
    specs: list[SkillToolSpec] = []
    for index, entry in enumerate(value):
        spec = _tool_spec(entry, f"tools[{index}]", env)
        if any(spec.name == other.name for other in specs):
            raise InvalidArgument(f"tools[{index}].name: {spec.name!r} is defined twice")
        specs.append(spec)
    return specs


def _tool_spec(entry: Any, where: str, env: tuple[str, ...]) -> SkillToolSpec:
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where}: must be a mapping (name, description, parameters, a backend)")
    unknown = sorted(str(key) for key in entry if key not in _TOOL_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_TOOL_FIELDS))})"
        )
    if "name" not in entry:
        raise InvalidArgument(f"{where}: missing required field 'name'")
    name = _string(entry["name"], f"{where}.name")
    if not TOOL_NAME.fullmatch(name):
        raise InvalidArgument(
            f"{where}.name: {name!r} is not a valid tool name: use 1-64 letters, digits, '_' or '-'"
        )
    parameters = _parameters(entry.get("parameters"), f"{where}.parameters")
    backend = _backend(entry, where)
    _check_templates(backend, parameters, env, where)
    timeout_ms = _timeout_ms(entry.get("timeout_ms"), f"{where}.timeout_ms")
    return SkillToolSpec(
        name=name,
        description=_optional_string(entry.get("description"), f"{where}.description"),
        parameters=parameters,
        backend=backend,
        timeout_ms=timeout_ms or backend.default_timeout_ms,
        env=env,
    )


def _parameters(value: Any, where: str) -> dict[str, Any]:
    """The tool's JSON Schema, checked as RegisterTool checks a client's; `type: object` is
    filled in when left out, as LLM APIs require it."""
    if value is None:
        return {"type": "object", "properties": {}}
    schema = check_json_schema(value, where)
    try:
        representable = json.loads(json.dumps(schema)) == schema
    except (TypeError, ValueError):
        representable = False
    if not representable:
        raise InvalidArgument(f"{where}: holds values JSON cannot represent (dates, non-string keys...)")
    return {"type": "object", **schema}


def _timeout_ms(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TIMEOUT_MS:
        raise InvalidArgument(f"{where}: must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}")
    return value


def _backend(entry: dict[Any, Any], where: str) -> Backend:
    chosen = [name for name in _BACKENDS if name in entry]
    if len(chosen) != 1:
        raise InvalidArgument(
            f"{where}: give exactly one backend of script, binary or http (found {len(chosen)})"
        )
    kind = chosen[0]
    if kind != "script" and ("interpreter" in entry or "language" in entry):
        raise InvalidArgument(f"{where}: interpreter and language only apply to a script backend")
    if kind == "script":
        return _script(entry, where)
    if kind == "binary":
        return _binary(entry["binary"], f"{where}.binary")
    return _http(entry["http"], f"{where}.http")


def _script(entry: dict[Any, Any], where: str) -> ScriptBackend:
    source = entry["script"]
    if not isinstance(source, str) or not source.strip():
        raise InvalidArgument(f"{where}.script: must be the script's source text")
    if "interpreter" in entry and "language" in entry:
        raise InvalidArgument(f"{where}: give interpreter or language, not both")
    key = next((name for name in ("interpreter", "language") if name in entry), "")
    # Only a declared interpreter can fail below: a shebang is split and re-joined already.
    command = _string(entry[key], f"{where}.{key}") if key else _shebang(source) or "bash"
    try:
        interpreter = tuple(shlex.split(command))
    except ValueError as exc:
        raise InvalidArgument(f"{where}.{key}: {exc}") from None
    if not interpreter:
        raise InvalidArgument(f"{where}.{key}: must name an interpreter such as python3 or bash")
    return ScriptBackend(source, interpreter)


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


def _binary(value: Any, where: str) -> BinaryBackend:
    if not isinstance(value, list) or not value:
        raise InvalidArgument(f"{where}: must be a non-empty list: the program, then its arguments")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidArgument(f"{where}[{index}]: must be a string, not a {_kind(item)} (quote it)")
    if not value[0].strip():
        raise InvalidArgument(f"{where}[0]: must name the program to run")
    return BinaryBackend(tuple(value))


def _http(value: Any, where: str) -> HttpBackend:
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}: must be a URL or a mapping with url, method, headers and body")
    unknown = sorted(str(key) for key in value if key not in _HTTP_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_HTTP_FIELDS))})"
        )
    if "url" not in value:
        raise InvalidArgument(f"{where}: missing required field 'url'")
    url = _string(value["url"], f"{where}.url")
    method = _string(value.get("method", "GET"), f"{where}.method").upper()
    if method not in HTTP_METHODS:
        raise InvalidArgument(f"{where}.method: {method!r} is not one of {', '.join(HTTP_METHODS)}")
    headers = value.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise InvalidArgument(f"{where}.headers: must map header names to strings")
    body = value.get("body")
    if body is not None and not isinstance(body, str | dict | list):
        raise InvalidArgument(f"{where}.body: must be a string template, or a mapping or list sent as JSON")
    return HttpBackend(url, method, {str(k): v for k, v in headers.items()}, body)


def _check_templates(backend: Backend, parameters: dict[str, Any], env: tuple[str, ...], where: str) -> None:
    """Refuse `${...}` references that could never be filled, or that read a variable the skill
    does not declare, when the skill is loaded."""
    declared = set(parameters.get("properties", {}))
    for path, template in backend.templates():
        for key in _TEMPLATE.findall(template):
            if key.startswith("env:"):
                if not _ENV_NAME.fullmatch(key[4:]):
                    raise InvalidArgument(f"{where}.{path}: ${{{key}}} does not name an environment variable")
                if key[4:] not in env:
                    raise InvalidArgument(
                        f"{where}.{path}: ${{{key}}} reads a variable the skill does not declare; "
                        f"list it in the skill's env field (env: [{key[4:]}])"
                    )
            elif key not in declared:
                known = ", ".join(sorted(declared)) or "it has none"
                raise InvalidArgument(
                    f"{where}.{path}: ${{{key}}} is not one of the tool's parameters ({known})"
                )
