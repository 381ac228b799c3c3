"""MCP server configuration: the `{"mcpServers": {name: server}}` shape other agents use.

A server is either a command run over stdio or a Streamable HTTP endpoint:

    {"mcpServers": {
        "git": {"command": "mcp-server-git", "args": ["--repository", "."], "env": {"LOG": "1"},
                "cwd": "."},
        "docs": {"url": "https://mcp.example/mcp", "headers": {"Authorization": "Bearer ..."}}
    }}

Also understood: `type` (`stdio`, `http`, `streamable-http`, `streamableHttp`; `sse` is refused),
`timeout_ms` (alias `timeout`, as Gemini CLI names it: the bound on each request, default 5 min),
`startup_timeout_ms` (the bound on starting and listing, default 30 s), `disabled: true` (the
server is left out) and, for a command, `sandbox_network` (off, on or allow:host,...: the network
its sandbox gives it, in place of the server's --sandbox-network; honoured only from the
operator's file and the operator's skills, refused from the API: runtime/mcp.py). Other keys that other agents add (`autoApprove`, `trust`, `description`...)
are ignored. The wrapper is optional where a config is given as a value (Initialize, session
metadata, a skill's frontmatter): a bare `{name: server}` mapping is accepted too.

Every problem is reported with the source, the server's name and the field. In the operator's
file only, `${VAR}` and `${VAR:-default}` in a string take the server's environment variable (its
secrets included), so that tokens stay out of the file; from any other source they stay as written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from ...base import secrets
from ...base.errors import FailedPrecondition, InvalidArgument
from ...base.jsontext import MAX_CHARS, parse_json
from ...base.secrets import is_secret_name
from ...config import sandbox_network_setting

DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_STARTUP_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 3_600_000
MAX_SERVERS = 64
MAX_API_CONFIG_CHARS = 256 * 1024
"""The longest config a client sends as text (Initialize's config.custom, a3s-mcp-servers)."""
WRAPPER = "mcpServers"
ALLOW_COMMANDS = "--allow-api-mcp-commands (A3S_ALLOW_API_MCP_COMMANDS=1)"

SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_STDIO_TYPES = ("stdio",)
_HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")
# Header names whose values are credentials, besides those is_secret_name recognises (X-Api-Key...).
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})


def _env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    return name


def _http_url(url: str) -> str:
    if not re.match(r"https?://[^/?#\s]", url):
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return url


Timeout = Annotated[int, Field(ge=1, le=MAX_TIMEOUT_MS)]


class _Server(BaseModel):
    # Strict: `args: [1]` or `env: {X: 2}` are errors, not quietly strings.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)

    timeout_ms: Timeout = Field(DEFAULT_TIMEOUT_MS, validation_alias=AliasChoices("timeout_ms", "timeout"))
    startup_timeout_ms: Timeout = DEFAULT_STARTUP_TIMEOUT_MS

    def key(self) -> str:
        """What identifies the server's connection: equal configs share one."""
        return json.dumps(self.model_dump(), sort_keys=True)


class StdioServer(_Server):
    """A command that speaks MCP on its stdin and stdout."""

    transport: Literal["stdio"] = "stdio"
    command: Annotated[str, Field(min_length=1)]
    args: list[str] = Field(default_factory=list)
    env: dict[Annotated[str, AfterValidator(_env_name)], str] = Field(default_factory=dict)
    cwd: str = ""  # relative to the workspace; empty: the workspace
    sandbox_network: Annotated[str, AfterValidator(sandbox_network_setting)] = ""
    """The network of its sandbox, given by the operator ("": the server's)."""


class HttpServer(_Server):
    """A Streamable HTTP endpoint."""

    transport: Literal["http"] = "http"
    url: Annotated[str, AfterValidator(_http_url)]
    headers: dict[str, str] = Field(default_factory=dict)


ServerSpec = StdioServer | HttpServer


@dataclass(frozen=True)
class Endpoint:
    """A configured server and where it runs: `workspace` is a stdio server's default working
    directory (and the tree its sandbox lets it write), `session_id` the session whose HOME it gets
    (None: a server-wide one); `guarded` sends an http server's requests through the request guard
    (public addresses only, unless `allow_private`); `sandbox_network` is the network of a stdio
    server's sandbox when the operator gave it one."""

    name: str
    spec: ServerSpec
    workspace: Path
    guarded: bool = False
    allow_private: bool = False
    session_id: str | None = None
    sandbox_network: str = ""  # the network the operator gave the server ("": the server's)


def parse_servers(
    data: Any, source: str, *, environ: Callable[[str], str | None] | None = None
) -> dict[str, ServerSpec]:
    """The servers a config holds, by name (disabled ones left out); InvalidArgument names the
    source, the server and the field of every problem. `environ` (the operator's file only)
    fills `${VAR}` references."""
    servers = _servers_mapping(data, source)
    found: dict[str, ServerSpec] = {}
    problems: list[str] = []
    for name, entry in servers.items():
        try:
            spec = parse_server(str(name), entry, source, environ=environ)
        except InvalidArgument as exc:
            problems.append(str(exc))
            continue
        if spec is not None:
            found[str(name)] = spec
    if problems:
        raise InvalidArgument("\n".join(problems))
    return found


def parse_server(
    name: str, entry: Any, source: str, *, environ: Callable[[str], str | None] | None = None
) -> ServerSpec | None:
    """One server (None when it is `disabled`)."""
    where = f"{source}: mcpServers.{name}" if source else f"mcpServers.{name}"
    if not SERVER_NAME.fullmatch(name):
        raise InvalidArgument(f"{where}: the name must be 1-40 letters, digits, '_' or '-'")
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where}: must be a mapping with command (stdio) or url (Streamable HTTP)")
    if entry.get("disabled") is True:
        return None
    if environ is not None:
        entry = _expanded(entry, environ, where)
    model = _model_of(entry, where)
    try:
        return model.model_validate(entry)
    except ValidationError as exc:
        raise InvalidArgument(
            "\n".join(
                dict.fromkeys(f"{where}{_field(error['loc'])}: {_message(error)}" for error in exc.errors())
            )
        ) from None


def refuse_commands(servers: Mapping[str, ServerSpec], source: str, *, allowed: bool) -> None:
    """FailedPrecondition for a command (a stdio server) from the API, unless the operator allows
    them: it would start a process that no tool call's permission check sees."""
    commands = sorted(name for name, spec in servers.items() if isinstance(spec, StdioServer))
    if commands and not allowed:
        raise FailedPrecondition(
            f"{source}: {', '.join(commands)} would run a command; this server runs MCP server commands"
            f" only from its operator's configuration (--mcp-config, skill directories) unless started"
            f" with {ALLOW_COMMANDS}. Servers with a url are accepted"
        )


def refuse_networks(servers: Mapping[str, ServerSpec], source: str) -> None:
    """FailedPrecondition for a server that names its own sandbox network: only the operator gives
    one (--mcp-config, the operator's skills)."""
    named = sorted(n for n, spec in servers.items() if isinstance(spec, StdioServer) and spec.sandbox_network)
    if named:
        raise FailedPrecondition(
            f"{source}: {', '.join(named)} name a sandbox_network; only the operator's configuration"
            " (--mcp-config, the operator's skill directories) gives a server a network of its own"
        )


def _servers_mapping(data: Any, source: str) -> dict[Any, Any]:
    at = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise InvalidArgument(f'{at}must be a mapping {{"{WRAPPER}": {{name: server}}}}')
    servers = data[WRAPPER] if set(data) == {WRAPPER} else data
    if not isinstance(servers, dict):
        raise InvalidArgument(f"{at}{WRAPPER} must map server names to servers")
    if len(servers) > MAX_SERVERS:
        raise InvalidArgument(f"{at}{len(servers)} servers; at most {MAX_SERVERS}")
    return servers


def _model_of(entry: dict[str, Any], where: str) -> type[StdioServer] | type[HttpServer]:
    kind = entry.get("type")
    if kind == "sse":
        raise InvalidArgument(
            f"{where}: the SSE transport (deprecated by MCP) is not supported; use the server's"
            " Streamable HTTP endpoint (type http)"
        )
    if kind is not None and kind not in (*_STDIO_TYPES, *_HTTP_TYPES):
        raise InvalidArgument(f"{where}.type: {kind!r} is not stdio or http")
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        raise InvalidArgument(
            f"{where}: give command (a server run over stdio) or url (Streamable HTTP)"
            + (", not both" if has_command else "")
        )
    if (kind in _STDIO_TYPES and has_url) or (kind in _HTTP_TYPES and has_command):
        raise InvalidArgument(f"{where}.type: {kind!r} does not fit {'url' if has_url else 'command'}")
    return StdioServer if has_command else HttpServer


def _field(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _message(error: Any) -> str:
    if error["type"] == "missing":
        return "is required"
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    if error["type"] in ("string_type", "list_type", "dict_type", "int_type"):
        wanted = {"string_type": "a string", "list_type": "a list", "dict_type": "a mapping"}
        return f"must be {wanted.get(error['type'], 'a whole number')}, not {type(error['input']).__name__}"
    return str(error["msg"])


def _expanded(value: Any, environ: Callable[[str], str | None], where: str) -> Any:
    """`value` with `${VAR}` and `${VAR:-default}` filled in every string (keys left alone)."""
    if isinstance(value, str):

        def fill(match: re.Match[str]) -> str:
            found = environ(match[1])
            if found is not None and found != "":
                return found
            if match[2] is not None:
                return match[2]
            raise InvalidArgument(f"{where}: ${{{match[1]}}} is not set in the server's environment")

        return _REFERENCE.sub(fill, value)
    if isinstance(value, list):
        return [_expanded(item, environ, where) for item in value]
    if isinstance(value, dict):
        return {key: _expanded(item, environ, where) for key, item in value.items()}
    return value


def load_config_file(path: Path, environ: Callable[[str], str | None]) -> dict[str, ServerSpec]:
    """The operator's file (JSON, or YAML for .yaml/.yml), `${VAR}` filled from `environ`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidArgument(f"cannot read the MCP config {path}: {reason}") from None
    return parse_servers(
        parse_text(text, str(path), yaml=path.suffix.lower() in (".yaml", ".yml")), str(path), environ=environ
    )


def operator_servers(path: Path | None) -> dict[str, ServerSpec]:
    """The servers of the operator's file (`--mcp-config`), `${VAR}` filled from the server's
    environment (its withheld secrets too)."""
    if path is None:
        return {}
    return load_config_file(path, lambda name: os.environ.get(name) or secrets.withheld(name))


def parse_text(text: str, source: str, *, yaml: bool = False, max_chars: int = MAX_CHARS) -> Any:
    """JSON (or YAML) text of a config; InvalidArgument names the source."""
    if yaml:
        import yaml as pyyaml

        try:
            return pyyaml.safe_load(text)
        except pyyaml.YAMLError as exc:
            raise InvalidArgument(f"{source}: invalid YAML: {exc}") from None
    return parse_json(text, source, max_chars=max_chars)


def as_json(servers: Mapping[str, ServerSpec]) -> dict[str, dict[str, Any]]:
    """The JSON form a config is stored in (parse_servers reads it back)."""
    return {name: spec.model_dump(exclude_defaults=True) | _kind(spec) for name, spec in servers.items()}


def _kind(spec: ServerSpec) -> dict[str, str]:
    return {"type": spec.transport}


def carries_credentials(spec: ServerSpec, marked: frozenset[str] = frozenset()) -> bool:
    """Whether the config holds a secret: an env entry named like one, or an auth header."""
    if isinstance(spec, StdioServer):
        return any(is_secret_name(name, marked) for name in spec.env)
    return any(
        name.lower() in _CREDENTIAL_HEADERS or is_secret_name(name.replace("-", "_"), marked)
        for name in spec.headers
    )


def storable(
    servers: Mapping[str, dict[str, Any]], marked: frozenset[str] = frozenset()
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(the stored servers, the names of those withheld): a config with credentials never reaches
    the disk; the host gives it again after a restart."""
    kept: dict[str, dict[str, Any]] = {}
    for name, data in servers.items():
        spec = parse_server(name, data, "stored")
        if spec is not None and not carries_credentials(spec, marked):
            kept[name] = data
    return kept, sorted(set(servers) - set(kept))
