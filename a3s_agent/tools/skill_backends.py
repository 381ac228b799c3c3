"""Skill tool backends: how a tool a skill defines runs (core/skills/skill.py reads their definitions).

- `script`: an inline script run in the workspace by its interpreter (a command line such as
  `python3` or `bash -eu`). The arguments arrive in the environment: `TOOL_ARGS` (all of them as
  JSON) and `TOOL_ARG_<NAME>` (each one; name upper-cased, other characters as `_`; strings as
  is, other values as JSON). Python interpreters (`python`, `python3`) run as the agent's own.
- `binary`: an argv list, run without a shell; `[echo, "${msg}"]`.
- `http`: a request; `body` is a string template, or JSON data in which a string that is exactly
  `${arg}` keeps the argument's type. A string template that is JSON text (`{"q": "${q}", "n":
  ${n}}`) is filled by building JSON, never as text: a placeholder inside a JSON string puts the
  value in that string, a bare one is the value itself. A header whose filled value holds a
  control character (a line break would start another header) or non-ASCII is refused. Requests
  go through tools/checked_fetch.py, as web_fetch's do:
  public addresses only (unless A3S_FETCH_ALLOW_PRIVATE=1), the checked address is the one
  connected to, at most 5 redirects.

Templates: `${arg}` is an argument (its schema default when not given; strings as is, other
values as JSON; percent-encoded in an http URL), `${env:VAR}` a variable the skill declares:
the session's env (Initialize), then the server's environment. Script and binary processes get
the tool environment (tools/environment.py) plus the session's env, the declared variables and,
for scripts, the arguments.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from pydantic import BaseModel

from .fetcher import connection_problem, decode, private_allowed
from .process import ProcessResult, find_binary, run_process
from .registry import Family, JsonArguments, Tool, ToolContext, ToolFailure, ToolOutput
from .sandbox import Place

TEMPLATE = re.compile(r"\$\{([^{}]*)\}")
# A JSON string (kept whole, placeholders and all) or a placeholder outside one.
_JSON_STRING_OR_PLACEHOLDER = re.compile(r'("(?:[^"\\]|\\.)*")|\$\{([^{}]*)\}')
_BARE = "\0"  # marks a placeholder written where a JSON value goes, outside any string
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
# Room kept under the output limit for our own notes, so Tool.execute never cuts them off.
_NOTE_RESERVE_BYTES = 256
_PYTHON_NAMES = {"python", "python3"}

# A field path in a tool definition: ("http", "headers", "Authorization"), ("binary", 1).
FieldPath = tuple[str | int, ...]


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

    return TEMPLATE.sub(replace, template)


def _render(body: Any, arguments: Mapping[str, Any], variables: Mapping[str, str]) -> Any:
    """A JSON body template: strings are substituted, and a string that is exactly `${arg}`
    becomes the argument itself, so numbers, lists and objects keep their type."""
    if isinstance(body, str):
        whole = TEMPLATE.fullmatch(body)
        if whole and not whole.group(1).startswith("env:"):
            return _argument(whole.group(1), arguments)
        return _substitute(body, arguments, variables)
    if isinstance(body, dict):
        return {key: _render(value, arguments, variables) for key, value in body.items()}
    if isinstance(body, list):
        return [_render(item, arguments, variables) for item in body]
    return body


@lru_cache(maxsize=64)
def _json_text(template: str) -> Any:
    """`template` read as JSON text with placeholders (`{"q": "${query}", "n": ${count}}`), an
    object or array; None when it is not one. A bare placeholder, where a value goes, is read as
    a string marked with _BARE."""
    if template.lstrip()[:1] not in ("{", "["):
        return None
    marked = _JSON_STRING_OR_PLACEHOLDER.sub(lambda m: m.group(1) or json.dumps(_BARE + m.group(2)), template)
    try:
        return json.loads(marked)
    except ValueError:
        return None


def _fill_json(data: Any, arguments: Mapping[str, Any], variables: Mapping[str, str]) -> Any:
    """JSON text template data filled as data, never as text: a placeholder inside a string puts
    the value into that string, a bare one is the value itself (an argument keeps its type)."""
    if isinstance(data, str):
        if not data.startswith(_BARE):
            return _substitute(data, arguments, variables)
        key = data.removeprefix(_BARE)
        return _env_value(key[4:], variables) if key.startswith("env:") else _argument(key, arguments)
    if isinstance(data, dict):
        return {
            _substitute(key, arguments, variables): _fill_json(value, arguments, variables)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [_fill_json(item, arguments, variables) for item in data]
    return data


def _checked_headers(headers: Mapping[str, str], shown: str) -> dict[str, str]:
    """The headers, unless a value (filled from an argument or the environment) holds a control
    character, which could end the header and start another, or one outside ASCII, which a header
    cannot carry as text: ToolFailure naming the header then."""
    for name, value in headers.items():
        if _HEADER_VALUE.fullmatch(value) is None:
            raise ToolFailure(
                f"{shown}: the value of header {name!r} has a line break, another control character"
                " or a character outside ASCII; refused"
            )
    return dict(headers)


def _strings(value: Any, where: FieldPath) -> Iterator[tuple[FieldPath, str]]:
    """Every string in a nested value with the field path it sits at."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*where, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*where, index))


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


async def _run(
    argv: list[str], ctx: ToolContext, env: Mapping[str, str], timeout_s: float, place: Place | None = None
) -> ToolOutput:
    """Run argv with the tool environment plus the session's env and `env` (declared variables,
    arguments): never the rest of the server's environment. Sandboxed for `place` (default the
    call's)."""
    try:
        result = await run_process(
            argv,
            cwd=ctx.workspace.resolve(),
            place=place or ctx.place,
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

    def templates(self) -> Iterator[tuple[FieldPath, str]]:
        """The templates in the definition, with their field paths, checked when it is read."""
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
            place = replace(ctx.place, readable=(Path(temp),))  # the script, outside the workspace
            return await _run([*argv, str(script)], ctx, env, timeout_s, place)


@dataclass(frozen=True)
class BinaryBackend:
    argv: tuple[str, ...]

    family: ClassVar[Family] = "command"
    default_timeout_ms: ClassVar[int] = 120_000

    def templates(self) -> Iterator[tuple[FieldPath, str]]:
        return _strings(list(self.argv), ("binary",))

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

    def templates(self) -> Iterator[tuple[FieldPath, str]]:
        yield ("http", "url"), self.url
        yield from _strings(self.headers, ("http", "headers"))
        yield from _strings(self.body, ("http", "body"))

    async def run(
        self, arguments: Mapping[str, Any], ctx: ToolContext, variables: Mapping[str, str], timeout_s: float
    ) -> ToolOutput:
        import httpx

        from .checked_fetch import fetch, read_capped  # on first use, with httpx

        url = _substitute(self.url, arguments, variables, encode=True)
        headers = _checked_headers(
            {name: _substitute(value, arguments, variables) for name, value in self.headers.items()},
            f"{self.method} {self.url}",
        )
        body = self._body(arguments, variables)
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

    def _body(self, arguments: Mapping[str, Any], variables: Mapping[str, str]) -> Any:
        """The body to send: a string template that is JSON text is filled by building JSON and
        sent as its text; other strings are filled as text; JSON data is filled and sent as JSON."""
        if isinstance(self.body, str):
            data = _json_text(self.body)
            if data is not None:
                return json.dumps(_fill_json(data, arguments, variables), ensure_ascii=False)
        return _render(self.body, arguments, variables)


Backend = ScriptBackend | BinaryBackend | HttpBackend


# ---------------------------------------------------------------- tools


@dataclass(frozen=True)
class SkillToolSpec:
    """A tool defined in a skill's frontmatter."""

    name: str
    description: str
    parameters: dict[str, Any]
    backend: Backend
    timeout_ms: int
    env: tuple[str, ...] = ()  # the skill's declared environment variables

    def build(self, network: str = "") -> Tool:
        """The tool; its processes get `network` (the operator's word for its skill; "": the server's)."""
        defaults = {
            name: prop["default"]
            for name, prop in self.parameters.get("properties", {}).items()
            if isinstance(prop, dict) and "default" in prop
        }

        async def run(args: BaseModel, ctx: ToolContext) -> ToolOutput:
            arguments = {**copy.deepcopy(defaults), **(args.model_extra or {})}
            variables = _declared_values(self.env, ctx)
            if network:
                ctx = replace(ctx, network=network)
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
