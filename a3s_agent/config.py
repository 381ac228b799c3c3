"""Server settings: command-line flags > environment > defaults."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from functools import cached_property
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .base.allow_list import AllowList
from .base.errors import InvalidArgument
from .base.log_lines import LOG_FORMATS, LogFormat
from .base.memories import MemorySettings
from .base.models import LLMConfig
from .base.prices import ModelPrice, load_prices
from .base.providers import KeyReference, checked_base_url
from .base.secrets import operator_secret_names
from .base.skill_sources import SkillSource, parse_skill_sources
from .base.sqlite import DURABILITY_LEVELS, Durability
from .datadir import default_data_dir, legacy_data_dir

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:4088"
DEFAULT_HTTP_LISTEN = "127.0.0.1:4089"
DEFAULT_MAX_SESSIONS = 1000
DEFAULT_MAX_GENERATIONS = 256
DEFAULT_MAX_TOOLS_PER_REQUEST = 50
DEFAULT_MAX_CONTEXT_TOKENS = 2_000_000  # the largest max_context_length a session may set
DEFAULT_COMPACT_THRESHOLD = 0.8  # share of the window past which auto-compaction runs
DEFAULT_COMPACT_TARGET = 0.5  # share of the window the whole prompt fits in after compaction
DEFAULT_GRACE_SECONDS = 10.0
DEFAULT_LLM_TIMEOUT_S = 120.0
DEFAULT_A2A_MAX_TASKS = 10_000  # A2A tasks kept in the store; the oldest ended ones go first
DEFAULT_LLM_RETRIES = 3
DEFAULT_MAX_HTTP_CONNECTIONS = 512
DEFAULT_MAX_GRPC_CONNECTIONS = 256  # with the HTTP cap and the reserve (faces/open_files.py): 1,024 files
DEFAULT_MAX_TOOL_CALLS = 64
DEFAULT_MAX_MEMORIES = 100_000  # shared memories a workspace keeps (core/store/memories.py)
DEFAULT_MAX_SPACE_RUNS = 16
DEFAULT_SUBAGENT_DEPTH = 1  # how deep subagents nest: a top-level session's children start none
DEFAULT_MAX_SUBAGENTS = 4  # children of one generation running at once (more task calls wait)
DEFAULT_MAX_SPACES = 1000  # Agent Spaces kept in the store; the protocol has no way to delete one
DEFAULT_MAX_REQUEST_MESSAGES = 10_000
DEFAULT_LEASE_TTL_S = 10.0  # a running generation's lease: renewed every third of it
DEFAULT_EVENT_RETENTION_HOURS = 168.0  # event log entries older than this are removed
DEFAULT_EVENT_RETENTION_COUNT = 10_000  # and all but the newest this many of each session
DEFAULT_CHECKPOINT_KEEP = 100  # checkpoints kept per session (A3S_CHECKPOINT_KEEP)
DEFAULT_CHECKPOINT_MAX_AGE_HOURS = 720.0  # and none older than this, but each session's newest
DEFAULT_CHECKPOINT_MAX_FILE_BYTES = 10 * 1024 * 1024  # a larger file is left out of checkpoints
BOX_SKILLS_DIR = Path("/a3s/skills")  # A3S Box mounts skills here, read-only
SANDBOX_MECHANISMS = ("auto", "bwrap", "landlock", "off")
DEFAULT_LSP_IDLE_S = 600.0
DEFAULT_SANDBOX_PROCESSES = 4096  # processes and threads of one tool call at once (A3S_SANDBOX_PROCESSES)
CRON_MISSED_RULES = ("skip", "run-once")
DEFAULT_CRON_TIMEZONE = "UTC"


@dataclass(frozen=True)
class SandboxSettings:
    """The operator's bounds for the OS sandbox every tool process runs in (tools/sandbox/)."""

    mechanism: str = "auto"  # auto (bwrap, else landlock, else refuse), bwrap, landlock or off
    network: Literal["off", "on", "allow"] = "off"
    allowed_hosts: tuple[str, ...] = ()  # with network "allow": reached through the server's proxy
    read: tuple[Path, ...] = ()  # further trees commands may read
    write: tuple[Path, ...] = ()  # further trees commands may read and write
    deny: tuple[Path, ...] = ()  # paths commands may not read even inside the trees above
    memory_bytes: int | None = None  # per call, where a limit can be set (tools/sandbox/__init__.py)
    processes: int = DEFAULT_SANDBOX_PROCESSES  # per call, where a cgroup can count them (tools/cgroups.py)

    @property
    def network_text(self) -> str:
        """The network setting as written: off, on or allow:host,host."""
        return f"allow:{','.join(self.allowed_hosts)}" if self.network == "allow" else self.network


@dataclass(frozen=True)
class CronSettings:
    """Scheduled jobs (A3S's cron group, runtime/cron/): off unless the operator turns them on, so
    that no client can leave a command running every minute on the machine without the operator's say."""

    enabled: bool = False
    missed: Literal["skip", "run-once"] = "skip"  # firings due while no server ran: none, or one at start
    timezone: str = DEFAULT_CRON_TIMEZONE  # the IANA zone schedules are read in

    @property
    def zone(self) -> tzinfo:
        return _zone(self.timezone, _TIMEZONE_SETTING)


@dataclass(frozen=True)
class CheckpointSettings:
    """Checkpoints of sessions' workspaces (core/sessions/checkpoints.py): where their shadow
    repositories live (None: `<data dir>/checkpoints`), how many and how old are kept, and the size
    over which a file is left out (reported as skipped)."""

    enabled: bool = True
    directory: Path | None = None
    keep: int = DEFAULT_CHECKPOINT_KEEP
    max_age_hours: float = DEFAULT_CHECKPOINT_MAX_AGE_HOURS
    max_file_bytes: int = DEFAULT_CHECKPOINT_MAX_FILE_BYTES


@dataclass(frozen=True)
class ProviderKeySettings:
    """Which keys provider entries (A3S's provider group, runtime/provider_settings.py) may use: a
    key a client gives is stored only with `stored` (else kept in the memory of the server it was
    given to); a reference resolves only when the operator lists it, and only for the endpoint listed
    with it."""

    stored: bool = False
    references: Mapping[KeyReference, str] = field(default_factory=dict)  # reference -> its base URL

    @property
    def env_names(self) -> frozenset[str]:
        """The variables references name: secrets, withheld from every tool."""
        return frozenset(ref.target for ref in self.references if ref.kind == "env")


@dataclass
class Settings:
    listen: str = DEFAULT_LISTEN
    http_listen: str = DEFAULT_HTTP_LISTEN  # HOST:PORT of the HTTP face, or "off"
    auth_token: str = ""  # when set, callers must send `authorization: Bearer <token>`
    auth_token_file: Path | None = None  # where the token was read from (commands may not read it)
    allow_unauthenticated: bool = False  # serve a non-loopback address without a token (operator's choice)
    allowed_origins: list[str] = field(default_factory=list)  # browser Origins the HTTP face accepts
    allowed_hosts: list[str] = field(default_factory=list)  # Host names the HTTP face accepts besides its own
    tls_cert: Path | None = None  # PEM certificate chain for both listeners
    tls_key: Path | None = None  # PEM private key for both listeners
    max_http_connections: int = DEFAULT_MAX_HTTP_CONNECTIONS
    max_grpc_connections: int = DEFAULT_MAX_GRPC_CONNECTIONS
    secret_env_names: frozenset[str] = frozenset()  # further variables the operator marks secret
    trust_workspace_skills: bool = False  # a workspace skill's allowed-tools may become allow rules
    project_instructions: bool = True  # AGENTS.md, CLAUDE.md, .a3s/instructions.md go into the prompt
    workspace_root: Path | None = None  # session workspaces must lie inside it; default the workspace
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS  # direct ExecuteTool/ExecuteToolBatch calls at once
    max_space_runs: int = DEFAULT_MAX_SPACE_RUNS  # Agent Spaces runs at once
    max_spaces: int = DEFAULT_MAX_SPACES  # Agent Spaces in the store
    max_request_messages: int = DEFAULT_MAX_REQUEST_MESSAGES  # messages in one request
    max_memories: int = DEFAULT_MAX_MEMORIES  # shared memories kept per workspace (A3S_MAX_MEMORIES)
    coven_gateway: str = ""  # HOST:PORT of a coven gateway to serve as an agent, alongside the server
    workspace: Path = field(default_factory=Path.cwd)
    data_dir: Path | None = None
    durability: Durability = "full"  # how store commits are synced (A3S_DURABILITY): see core/sqlite.connect
    store: str = ""  # postgresql://... (A3S_STORE) for replicas on one database; "" the SQLite file
    replica_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    event_retention_hours: float = DEFAULT_EVENT_RETENTION_HOURS
    event_retention_count: int = DEFAULT_EVENT_RETENTION_COUNT
    log_level: str = "INFO"
    log_format: LogFormat = "text"
    llm: LLMConfig = field(default_factory=LLMConfig)
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_generations: int = DEFAULT_MAX_GENERATIONS
    max_tools_per_request: int = DEFAULT_MAX_TOOLS_PER_REQUEST
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS
    compact_threshold: float = DEFAULT_COMPACT_THRESHOLD
    compact_target: float = DEFAULT_COMPACT_TARGET
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    llm_timeout_s: float = DEFAULT_LLM_TIMEOUT_S
    llm_retries: int = DEFAULT_LLM_RETRIES
    skill_dirs: list[Path] = field(default_factory=list)
    skill_sources: tuple[SkillSource, ...] = ()  # where SearchSkills and InstallSkill look (--skill-source)
    agent_dirs: list[Path] = field(default_factory=list)  # the operator's agent files (core/agents/)
    trust_workspace_agents: bool = False  # a workspace agent may get more than read-only tools
    subagent_depth: int = DEFAULT_SUBAGENT_DEPTH  # 0: no `task` tool
    max_subagents: int = DEFAULT_MAX_SUBAGENTS
    llm_tool_mode: Literal["native", "text"] = "native"  # the default of LLM configs without +text/+native
    relay_dir: str = ""
    mcp_tools: list[str] = field(default_factory=list)  # what the MCP server face offers (empty: all)
    mcp_http: bool = False  # serve the MCP server face at /mcp on the HTTP listener
    prometheus_metrics: bool = False  # serve /metrics (Prometheus) on the HTTP listener
    a2a: bool = False  # serve the A2A face (agent card, /a2a) on the HTTP listener
    a2a_push_urls: list[str] = field(default_factory=list)  # where A2A push notifications may go (prefixes)
    a2a_max_tasks: int = DEFAULT_A2A_MAX_TASKS
    mcp_config: Path | None = None  # the operator's MCP servers (runtime/mcp.py), JSON or YAML
    allow_api_mcp_commands: bool = False  # MCP servers given over the API may be commands (stdio)
    lsp_servers: list[str] = field(default_factory=list)  # LANGUAGE[:.ext,...]=COMMAND (tools/lsp/catalog.py)
    lsp_idle_s: float = DEFAULT_LSP_IDLE_S  # a language server unused this long is stopped
    model_prices: dict[str, ModelPrice] = field(default_factory=dict)  # for cost summaries (base/prices.py)
    release_identity: str = ""  # sha256:<64 hex> harness requests must name ("": any digest)
    a3s_dialect: str = "auto"  # gRPC dialect: auto (per request), box or later (faces/grpc/dialect_choice.py)
    memory: MemorySettings = field(default_factory=MemorySettings)  # what models get of memories (--memory)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    cron: CronSettings = field(default_factory=CronSettings)
    checkpoints: CheckpointSettings = field(default_factory=CheckpointSettings)
    provider_keys: ProviderKeySettings = field(default_factory=ProviderKeySettings)

    @property
    def resolved_workspace_root(self) -> Path:
        """The directory every session workspace must lie in: --workspace-root, else the workspace."""
        return (self.workspace_root or self.workspace).resolve()

    @cached_property
    def resolved_data_dir(self) -> Path:
        """The data directory (Runtime.start creates it): --data-dir (A3S_DATA_DIR); else
        `<workspace>/.a3s` if a server of the old default left its sessions there (with a warning,
        once); else datadir.default_data_dir, outside the workspace."""
        if self.data_dir is not None:
            return self.data_dir.resolve()
        legacy = legacy_data_dir(self.workspace)
        if legacy is None:
            return default_data_dir(self.workspace)
        log.warning(
            "using %s, inside the workspace, as the data directory: a server of the old default left"
            " its sessions there, and git may pick them up. To move them, stop the server and move its"
            " files there (sessions.db*, spaces.db*, ...; not skills/) to %s, or set --data-dir"
            " (A3S_DATA_DIR)",
            legacy.resolve(),
            default_data_dir(self.workspace),
        )
        return legacy.resolve()


def llm_from_env(env: Mapping[str, str]) -> LLMConfig:
    """Server-level LLM settings: A3S_LLM_* first, then the standard OPENAI_* names."""
    return LLMConfig(
        provider=env.get("A3S_LLM_PROVIDER", ""),
        model=env.get("A3S_LLM_MODEL", ""),
        api_key=env.get("A3S_LLM_API_KEY") or env.get("OPENAI_API_KEY", ""),
        base_url=env.get("A3S_LLM_BASE_URL") or env.get("OPENAI_BASE_URL", ""),
    )


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name} must be 1/true/yes/on or 0/false/no/off, not {value!r}")


def _switch(env: Mapping[str, str], name: str) -> bool:
    """A setting on by default: only an explicit 0/false/no/off turns it off."""
    return name not in env or not env[name].strip() or _flag(env, name)


def _list(values: list[str] | None, env: Mapping[str, str], name: str) -> list[str]:
    """Flag values (repeatable) then the comma-separated env value."""
    return [v.strip() for v in [*(values or []), *env.get(name, "").split(",")] if v.strip()]


def _number(
    env: Mapping[str, str], name: str, default: float, kind: type = int, zero_ok: bool = False
) -> float:
    value = env.get(name)
    if not value:
        return default
    try:
        number = kind(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {value!r}") from None
    if number < 0 or (number == 0 and not zero_ok):
        raise ConfigError(f"{name} must be {'zero or more' if zero_ok else 'positive'}, not {value!r}")
    return number


def _share(env: Mapping[str, str], name: str, default: float) -> float:
    """A share of the context window: a number above 0 and below 1."""
    share = _number(env, name, default, float)
    if share >= 1:
        raise ConfigError(f"{name} must be a share of the window below 1 (e.g. 0.5), not {env[name]!r}")
    return share


def _log_format(flag: str | None, env: Mapping[str, str]) -> LogFormat:
    """--log-format or A3S_LOG_FORMAT: text (the default) or json."""
    value = flag or env.get("A3S_LOG_FORMAT", "")
    wanted = value.strip().lower() or "text"
    for form in LOG_FORMATS:
        if wanted == form:
            return form
    raise ConfigError(f"--log-format (A3S_LOG_FORMAT) must be {' or '.join(LOG_FORMATS)}, not {value[:50]!r}")


def _durability(env: Mapping[str, str]) -> Durability:
    """A3S_DURABILITY: full (the default) or normal."""
    value = env.get("A3S_DURABILITY", "")
    wanted = value.strip().lower() or "full"
    for level in DURABILITY_LEVELS:
        if wanted == level:
            return level
    raise ConfigError(f"A3S_DURABILITY must be {' or '.join(DURABILITY_LEVELS)}, not {value!r}")


_TOKEN_CHARACTERS = re.compile(r"[\x21-\x7e]+")  # it travels in a header: printable ASCII, no spaces


def _auth_token(file_flag: str | None, env: Mapping[str, str]) -> str:
    """The bearer token: the file's contents (--auth-token-file, A3S_AUTH_TOKEN_FILE), else A3S_AUTH_TOKEN."""
    path = file_flag or env.get("A3S_AUTH_TOKEN_FILE", "")
    source = "--auth-token-file" if file_flag else "A3S_AUTH_TOKEN_FILE"
    if path:
        try:
            token = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not text"
            raise ConfigError(f"cannot read the token file {path} ({source}): {reason}") from None
        if not token:
            raise ConfigError(f"the token file {path} ({source}) is empty")
    else:
        token, source = env.get("A3S_AUTH_TOKEN", "").strip(), "A3S_AUTH_TOKEN"
    if token and not _TOKEN_CHARACTERS.fullmatch(token):
        raise ConfigError(f"the token from {source} must be printable ASCII without spaces")
    return token


def settings_from(
    *,
    listen: str | None = None,
    http_listen: str | None = None,
    workspace: str | None = None,
    data_dir: str | None = None,
    log_level: str | None = None,
    log_format: str | None = None,
    max_sessions: int | None = None,
    skills_dirs: list[str] | None = None,
    skill_sources: list[str] | None = None,
    agents_dirs: list[str] | None = None,
    trust_workspace_agents: bool = False,
    auth_token_file: str | None = None,
    coven_gateway: str | None = None,
    allow_unauthenticated: bool = False,
    allowed_origins: list[str] | None = None,
    allowed_hosts: list[str] | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    trust_workspace_skills: bool = False,
    no_project_instructions: bool = False,
    workspace_root: str | None = None,
    grace_seconds: float | None = None,
    mcp_tools: list[str] | None = None,
    mcp_http: bool = False,
    prometheus_metrics: bool = False,
    a2a: bool = False,
    a2a_push_urls: list[str] | None = None,
    mcp_config: str | None = None,
    allow_api_mcp_commands: bool = False,
    lsp_servers: list[str] | None = None,
    store: str | None = None,
    replica_id: str | None = None,
    model_prices: str | None = None,
    release_identity: str | None = None,
    a3s_dialect: str | None = None,
    memory: str | None = None,
    sandbox: str | None = None,
    sandbox_network: str | None = None,
    sandbox_read: list[str] | None = None,
    sandbox_write: list[str] | None = None,
    sandbox_deny: list[str] | None = None,
    enable_cron: bool = False,
    cron_missed: str | None = None,
    cron_timezone: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Build settings from flag values (None = not given) over the environment."""
    env = os.environ if env is None else env
    workspace_value = workspace or env.get("WORKSPACE")
    data_value = data_dir or env.get("A3S_DATA_DIR")
    cert_value = tls_cert or env.get("A3S_TLS_CERT")
    key_value = tls_key or env.get("A3S_TLS_KEY")
    root_value = workspace_root or env.get("A3S_WORKSPACE_ROOT")
    provider_keys = provider_key_settings(env)
    return Settings(
        listen=listen or env.get("LISTEN_ADDR") or DEFAULT_LISTEN,
        http_listen=http_listen or env.get("A3S_HTTP_LISTEN") or DEFAULT_HTTP_LISTEN,
        auth_token=_auth_token(auth_token_file, env),
        auth_token_file=_path(auth_token_file or env.get("A3S_AUTH_TOKEN_FILE")),
        coven_gateway=coven_gateway or env.get("A3S_COVEN_GATEWAY", ""),
        allow_unauthenticated=allow_unauthenticated or _flag(env, "A3S_ALLOW_UNAUTHENTICATED"),
        allowed_origins=_list(allowed_origins, env, "A3S_ALLOWED_ORIGINS"),
        allowed_hosts=_list(allowed_hosts, env, "A3S_ALLOWED_HOSTS"),
        tls_cert=Path(cert_value) if cert_value else None,
        tls_key=Path(key_value) if key_value else None,
        max_http_connections=int(_number(env, "A3S_MAX_HTTP_CONNECTIONS", DEFAULT_MAX_HTTP_CONNECTIONS)),
        max_grpc_connections=int(_number(env, "A3S_MAX_GRPC_CONNECTIONS", DEFAULT_MAX_GRPC_CONNECTIONS)),
        secret_env_names=operator_secret_names(env) | provider_keys.env_names,
        trust_workspace_skills=trust_workspace_skills or _flag(env, "A3S_TRUST_WORKSPACE_SKILLS"),
        project_instructions=not no_project_instructions and _switch(env, "A3S_PROJECT_INSTRUCTIONS"),
        workspace_root=Path(root_value).resolve() if root_value else None,
        max_tool_calls=int(_number(env, "A3S_MAX_TOOL_CALLS", DEFAULT_MAX_TOOL_CALLS)),
        max_space_runs=int(_number(env, "A3S_MAX_SPACE_RUNS", DEFAULT_MAX_SPACE_RUNS)),
        max_spaces=int(_number(env, "A3S_MAX_SPACES", DEFAULT_MAX_SPACES)),
        max_request_messages=int(_number(env, "A3S_MAX_REQUEST_MESSAGES", DEFAULT_MAX_REQUEST_MESSAGES)),
        max_memories=int(_number(env, "A3S_MAX_MEMORIES", DEFAULT_MAX_MEMORIES)),
        workspace=Path(workspace_value).resolve() if workspace_value else Path.cwd(),
        data_dir=Path(data_value) if data_value else None,
        durability=_durability(env),
        store=_store(store or env.get("A3S_STORE", ""), env.get("PGPASSWORD", "")),
        replica_id=_replica_id(replica_id or env.get("A3S_REPLICA_ID", "")),
        model_prices=_model_prices(model_prices, env),
        release_identity=_release_identity(release_identity or env.get("A3S_RELEASE_IDENTITY", "")),
        a3s_dialect=_a3s_dialect(a3s_dialect, env),
        memory=_memory(memory, env),
        sandbox=sandbox_settings(
            env,
            mechanism=sandbox,
            network=sandbox_network,
            read=sandbox_read,
            write=sandbox_write,
            deny=sandbox_deny,
        ),
        cron=cron_settings(env, enabled=enable_cron, missed=cron_missed, timezone=cron_timezone),
        checkpoints=checkpoint_settings(env),
        provider_keys=provider_keys,
        lease_ttl_s=_number(env, "A3S_LEASE_TTL_S", DEFAULT_LEASE_TTL_S, float),
        event_retention_hours=_number(env, "A3S_EVENT_RETENTION_HOURS", DEFAULT_EVENT_RETENTION_HOURS, float),
        event_retention_count=int(_number(env, "A3S_EVENT_RETENTION_COUNT", DEFAULT_EVENT_RETENTION_COUNT)),
        log_level=(log_level or env.get("A3S_LOG_LEVEL") or "INFO").upper(),
        log_format=_log_format(log_format, env),
        llm=llm_from_env(env),
        max_sessions=max_sessions or int(_number(env, "A3S_MAX_SESSIONS", DEFAULT_MAX_SESSIONS)),
        max_generations=int(_number(env, "A3S_MAX_GENERATIONS", DEFAULT_MAX_GENERATIONS)),
        max_context_tokens=int(_number(env, "A3S_MAX_CONTEXT_TOKENS", DEFAULT_MAX_CONTEXT_TOKENS)),
        compact_threshold=_share(env, "A3S_COMPACT_THRESHOLD", DEFAULT_COMPACT_THRESHOLD),
        compact_target=_share(env, "A3S_COMPACT_TARGET", DEFAULT_COMPACT_TARGET),
        llm_timeout_s=_number(env, "A3S_LLM_TIMEOUT_S", DEFAULT_LLM_TIMEOUT_S, float),
        grace_seconds=_grace(grace_seconds, env),
        llm_retries=int(_number(env, "A3S_LLM_RETRIES", DEFAULT_LLM_RETRIES, zero_ok=True)),
        llm_tool_mode="text" if env.get("A3S_LLM_TOOL_MODE", "").lower() == "text" else "native",
        relay_dir=env.get("A3S_RELAY_DIR", ""),
        mcp_tools=_list(mcp_tools, env, "A3S_MCP_TOOLS"),
        mcp_http=mcp_http or _flag(env, "A3S_MCP_HTTP"),
        prometheus_metrics=prometheus_metrics or _flag(env, "A3S_PROMETHEUS_METRICS"),
        a2a=a2a or _flag(env, "A3S_A2A"),
        a2a_push_urls=_list(a2a_push_urls, env, "A3S_A2A_PUSH_URLS"),
        a2a_max_tasks=int(_number(env, "A3S_A2A_MAX_TASKS", DEFAULT_A2A_MAX_TASKS)),
        mcp_config=_path(mcp_config or env.get("A3S_MCP_CONFIG")),
        allow_api_mcp_commands=allow_api_mcp_commands or _flag(env, "A3S_ALLOW_API_MCP_COMMANDS"),
        lsp_servers=[
            s for s in [*(lsp_servers or []), *env.get("A3S_LSP_SERVERS", "").split(";")] if s.strip()
        ],
        lsp_idle_s=_number(env, "A3S_LSP_IDLE_S", DEFAULT_LSP_IDLE_S, float),
        skill_dirs=[
            Path(p) for p in [*(skills_dirs or []), *env.get("A3S_SKILL_DIRS", "").split(os.pathsep)] if p
        ],
        skill_sources=_skill_sources(_list(skill_sources, env, "A3S_SKILL_SOURCES")),
        agent_dirs=[
            Path(p) for p in [*(agents_dirs or []), *env.get("A3S_AGENT_DIRS", "").split(os.pathsep)] if p
        ],
        trust_workspace_agents=trust_workspace_agents or _flag(env, "A3S_TRUST_WORKSPACE_AGENTS"),
        subagent_depth=int(_number(env, "A3S_SUBAGENT_DEPTH", DEFAULT_SUBAGENT_DEPTH, zero_ok=True)),
        max_subagents=int(_number(env, "A3S_MAX_SUBAGENTS", DEFAULT_MAX_SUBAGENTS)),
    )


def _skill_sources(values: list[str]) -> tuple[SkillSource, ...]:
    try:
        return parse_skill_sources(values)
    except InvalidArgument as exc:
        raise ConfigError(f"--skill-source (A3S_SKILL_SOURCES): {exc}") from None


_REPLICA_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def store_holds_password(value: str) -> bool:
    """Whether a --store URL carries a password: in its user part, or as `password=` in its query."""
    try:
        parts = urlsplit(value.strip())
        return bool(parts.password) or any(
            key == "password" and secret for key, secret in parse_qsl(parts.query, keep_blank_values=True)
        )
    except ValueError:  # a malformed URL: _store names the fault
        return False


def _store(value: str, password: str) -> str:
    """--store (A3S_STORE): empty (the SQLite file in the data directory) or a PostgreSQL URL. A
    URL without a password takes PGPASSWORD's now: the server withholds that variable from its
    environment at start, so libpq would not find it when the store connects."""
    value = value.strip()
    if value and not value.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"--store (A3S_STORE) must be a postgresql://user:password@host:port/database URL, not {value[:60]!r}"
        )
    parts = urlsplit(value)
    if value and password and parts.password is None:
        user, _, hosts = parts.netloc.rpartition("@")
        value = urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{hosts}"))
    return value


def _model_prices(flag: str | None, env: Mapping[str, str]) -> dict[str, ModelPrice]:
    """The price file (--model-prices, A3S_MODEL_PRICES), read now: a fault stops the start."""
    path = flag or env.get("A3S_MODEL_PRICES", "")
    if not path:
        return {}
    try:
        return load_prices(Path(path))
    except ValueError as exc:
        raise ConfigError(f"{'--model-prices' if flag else 'A3S_MODEL_PRICES'}: {exc}") from None


def _replica_id(value: str) -> str:
    """--replica-id (A3S_REPLICA_ID): names this process in leases and logs; default host-pid."""
    if not value:
        return f"{socket.gethostname()}-{os.getpid()}"[:64]
    if not _REPLICA_ID.fullmatch(value):
        raise ConfigError("--replica-id (A3S_REPLICA_ID) must be 1-64 letters, digits, '.', '_', ':' or '-'")
    return value


_RELEASE_IDENTITY = re.compile(r"sha256:[0-9a-f]{64}")


def _release_identity(value: str) -> str:
    """--release-identity (A3S_RELEASE_IDENTITY): the digest A3S harness requests must name."""
    value = value.strip()
    if value and not _RELEASE_IDENTITY.fullmatch(value):
        raise ConfigError(
            "--release-identity (A3S_RELEASE_IDENTITY) must be sha256: followed by 64 lowercase hex"
            f" digits, not {value[:80]!r}"
        )
    return value


A3S_DIALECTS = ("auto", "box", "later")


def _a3s_dialect(flag: str | None, env: Mapping[str, str]) -> str:
    """--a3s-dialect (A3S_DIALECT): auto (the default), box or later."""
    value = flag or env.get("A3S_DIALECT", "")
    wanted = value.strip().lower() or "auto"
    if wanted not in A3S_DIALECTS:
        raise ConfigError(
            f"--a3s-dialect (A3S_DIALECT) must be {', '.join(A3S_DIALECTS[:-1])} or {A3S_DIALECTS[-1]},"
            f" not {value[:40]!r}"
        )
    return wanted


def _memory(flag: str | None, env: Mapping[str, str]) -> MemorySettings:
    """--memory (A3S_MEMORY): off (the default), tools, prompt=N or tools,prompt=N."""
    value = flag or env.get("A3S_MEMORY", "") or "off"
    try:
        return MemorySettings.parse(value, "--memory (A3S_MEMORY)")
    except InvalidArgument as exc:
        raise ConfigError(str(exc)) from None


def checkpoint_settings(env: Mapping[str, str]) -> CheckpointSettings:
    """A3S_CHECKPOINTS, A3S_CHECKPOINT_DIR, A3S_CHECKPOINT_KEEP, A3S_CHECKPOINT_MAX_AGE_HOURS and
    A3S_CHECKPOINT_MAX_FILE_BYTES."""
    directory = env.get("A3S_CHECKPOINT_DIR", "").strip()
    return CheckpointSettings(
        enabled=_switch(env, "A3S_CHECKPOINTS"),
        directory=Path(directory).resolve() if directory else None,
        keep=int(_number(env, "A3S_CHECKPOINT_KEEP", DEFAULT_CHECKPOINT_KEEP)),
        max_age_hours=_number(env, "A3S_CHECKPOINT_MAX_AGE_HOURS", DEFAULT_CHECKPOINT_MAX_AGE_HOURS, float),
        max_file_bytes=int(_number(env, "A3S_CHECKPOINT_MAX_FILE_BYTES", DEFAULT_CHECKPOINT_MAX_FILE_BYTES)),
    )


def cron_settings(
    env: Mapping[str, str],
    *,
    enabled: bool = False,
    missed: str | None = None,
    timezone: str | None = None,
) -> CronSettings:
    """--enable-cron, --cron-missed and --cron-timezone over A3S_ENABLE_CRON, A3S_CRON_MISSED and
    A3S_CRON_TIMEZONE."""
    rule = (missed or env.get("A3S_CRON_MISSED", "")).strip().lower() or "skip"
    if rule not in CRON_MISSED_RULES:
        raise ConfigError(f"--cron-missed (A3S_CRON_MISSED) must be skip or run-once, not {rule[:40]!r}")
    zone = (timezone or env.get("A3S_CRON_TIMEZONE", "")).strip() or DEFAULT_CRON_TIMEZONE
    _zone(zone, _TIMEZONE_SETTING)  # now: a zone this machine does not know stops the start
    return CronSettings(
        enabled=enabled or _flag(env, "A3S_ENABLE_CRON"),
        missed="skip" if rule == "skip" else "run-once",
        timezone=zone,
    )


_TIMEZONE_SETTING = "--cron-timezone (A3S_CRON_TIMEZONE)"


def _zone(name: str, what: str) -> tzinfo:
    """The time zone of an IANA name (UTC without a time zone database); ConfigError naming `what`."""
    if name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"{what} must be an IANA time zone name such as UTC or Europe/Paris, not {name[:60]!r}"
        ) from None


def sandbox_settings(
    env: Mapping[str, str],
    *,
    mechanism: str | None = None,
    network: str | None = None,
    read: list[str] | None = None,
    write: list[str] | None = None,
    deny: list[str] | None = None,
) -> SandboxSettings:
    """--sandbox, --sandbox-network, --sandbox-read/-write/-deny (repeatable) over A3S_SANDBOX,
    A3S_SANDBOX_NETWORK, A3S_SANDBOX_READ/WRITE/DENY (`:`-separated), A3S_SANDBOX_MEMORY and
    A3S_SANDBOX_PROCESSES."""
    wanted = (mechanism or env.get("A3S_SANDBOX", "")).strip().lower() or "auto"
    if wanted not in SANDBOX_MECHANISMS:
        raise ConfigError(
            f"--sandbox (A3S_SANDBOX) must be auto, bwrap, landlock or off, not {wanted[:40]!r}"
        )
    mode, hosts = parse_sandbox_network(network or env.get("A3S_SANDBOX_NETWORK", ""))
    return SandboxSettings(
        mechanism=wanted,
        network=mode,
        allowed_hosts=hosts,
        read=_sandbox_paths(read, env, "A3S_SANDBOX_READ", "--sandbox-read", must_exist=True),
        write=_sandbox_paths(write, env, "A3S_SANDBOX_WRITE", "--sandbox-write", must_exist=True),
        deny=_sandbox_paths(deny, env, "A3S_SANDBOX_DENY", "--sandbox-deny", must_exist=False),
        memory_bytes=_size(env, "A3S_SANDBOX_MEMORY"),
        processes=int(_number(env, "A3S_SANDBOX_PROCESSES", DEFAULT_SANDBOX_PROCESSES)),
    )


def parse_sandbox_network(
    value: str, what: str = "--sandbox-network (A3S_SANDBOX_NETWORK)"
) -> tuple[Literal["off", "on", "allow"], tuple[str, ...]]:
    """off (the default), on, or allow:host,host (names, `*.domain`, `*`, IP addresses, each with an
    optional :port: base/allow_list.py), the hosts normalized; ConfigError naming `what`."""
    text = value.strip()
    if text.lower() in ("", "off"):
        return "off", ()
    if text.lower() == "on":
        return "on", ()
    kind, colon, listed = text.partition(":")
    if kind.strip().lower() != "allow" or not colon or not listed.strip(" ,"):
        raise ConfigError(f"{what} must be off, on or allow:HOST,HOST, not {text[:80]!r}")
    try:
        hosts = AllowList.parse(listed, what)
    except InvalidArgument as exc:
        raise ConfigError(str(exc)) from None
    return "allow", tuple(dict.fromkeys(entry.text for entry in hosts.hosts))


def sandbox_network_setting(value: str) -> str:
    """A network an MCP server or skill is given (off, on, allow:...), in its normalized text; ""
    for none; ValueError (ConfigError) saying what is wrong."""
    if not value.strip():
        return ""
    mode, hosts = parse_sandbox_network(value, "a sandbox network")
    return SandboxSettings(network=mode, allowed_hosts=hosts).network_text


def _sandbox_paths(
    values: list[str] | None, env: Mapping[str, str], variable: str, flag: str, *, must_exist: bool
) -> tuple[Path, ...]:
    """Flag values then the `:`-separated `variable`, absolute and symlink-resolved; a tree to read
    or write must exist."""
    paths = []
    for value in [*(values or []), *env.get(variable, "").split(os.pathsep)]:
        if not value.strip():
            continue
        path = Path(value).expanduser().resolve()
        if must_exist and not path.exists():
            raise ConfigError(f"{flag} ({variable}) {value!r}: no such file or directory")
        paths.append(path)
    return tuple(dict.fromkeys(paths))


_SIZE = re.compile(r"([0-9]+)\s*([KMGT]?)I?B?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(env: Mapping[str, str], name: str) -> int | None:
    """A byte size such as 4G, 512M or 1073741824 (units of 1024); None when unset."""
    value = env.get(name, "").strip()
    if not value:
        return None
    match = _SIZE.fullmatch(value)
    if match is None or int(match.group(1)) == 0:
        raise ConfigError(f"{name} must be a size such as 4G, 512M or 1073741824 bytes, not {value[:40]!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def _path(value: str | None) -> Path | None:
    return Path(value).resolve() if value else None


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT names this machine only: 127.0.0.0/8, ::1 or localhost (0.0.0.0 and :: do not)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or empty (all interfaces)
        return False


def exposed_listeners(settings: Settings) -> list[str]:
    """The listeners other machines may reach, e.g. ['gRPC on 0.0.0.0:4088']."""
    listeners = (("gRPC", settings.listen), ("HTTP", settings.http_listen))
    return [
        f"{face} on {address}" for face, address in listeners if address != "off" and not is_loopback(address)
    ]


def _grace(flag: float | None, env: Mapping[str, str]) -> float:
    """--grace-seconds, else A3S_GRACE_SECONDS: zero or more seconds."""
    if flag is None:
        return _number(env, "A3S_GRACE_SECONDS", DEFAULT_GRACE_SECONDS, float, zero_ok=True)
    if not 0 <= flag < float("inf"):
        raise ConfigError(f"--grace-seconds must be zero or more seconds, not {flag:g}")
    return flag


_PORT = re.compile(r"[0-9]+")


def check_address(address: str, source: str, *, listener: bool) -> None:
    """Refuse an address that is not HOST:PORT, a port outside 1-65535 and a host that does not
    resolve. A listener may also take port 0 (the system picks a free port, which the log names).
    `source` names the setting, e.g. '--listen (LISTEN_ADDR)'."""
    host, colon, port = address.rpartition(":")
    if not colon or not _PORT.fullmatch(port):
        raise ConfigError(f"{source} {address!r} is not HOST:PORT")
    number, lowest = int(port), 0 if listener else 1
    if not lowest <= number <= 65535:
        raise ConfigError(f"{source} {address!r}: port {number} is outside {lowest}-65535")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host:
        raise ConfigError(f"{source} {address!r} names no host (every interface is 0.0.0.0 or [::])")
    try:
        socket.getaddrinfo(host, number, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise ConfigError(f"{source} {address!r}: cannot resolve host {host!r} ({reason})") from None


def check_serving(settings: Settings) -> None:
    """Refuse what `serve` must not start with: an unusable address, a non-loopback listener
    without a token (unless the operator opted in), and TLS files that cannot be used."""
    check_address(settings.listen, "--listen (LISTEN_ADDR)", listener=True)
    if settings.http_listen != "off":
        check_address(settings.http_listen, "--http-listen (A3S_HTTP_LISTEN)", listener=True)
    if settings.coven_gateway:
        check_address(settings.coven_gateway, "--coven-gateway (A3S_COVEN_GATEWAY)", listener=False)
    if settings.mcp_http and settings.http_listen == "off":
        raise ConfigError("--mcp-http (A3S_MCP_HTTP) serves /mcp on the HTTP listener: do not turn it off")
    if settings.prometheus_metrics and settings.http_listen == "off":
        raise ConfigError(
            "--prometheus-metrics (A3S_PROMETHEUS_METRICS) serves /metrics on the HTTP listener:"
            " do not turn it off"
        )
    if settings.a2a and settings.http_listen == "off":
        raise ConfigError("--a2a (A3S_A2A) serves A2A on the HTTP listener: do not turn it off")
    for prefix in settings.a2a_push_urls:
        parsed = urlsplit(prefix)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"--a2a-push-url (A3S_A2A_PUSH_URLS): {prefix!r} is not an http or https URL")
    exposed = exposed_listeners(settings)
    if exposed and not settings.auth_token and not settings.allow_unauthenticated:
        raise ConfigError(
            f"refusing to serve {' and '.join(exposed)} without a token: anyone who can reach it could"
            " run commands here. Set a token with --auth-token-file FILE, A3S_AUTH_TOKEN_FILE or"
            " A3S_AUTH_TOKEN, listen on 127.0.0.1, or opt in with --allow-unauthenticated"
            " (A3S_ALLOW_UNAUTHENTICATED=1)"
        )
    _check_tls(settings.tls_cert, settings.tls_key)
    if settings.compact_target >= settings.compact_threshold:
        raise ConfigError(
            f"A3S_COMPACT_TARGET ({settings.compact_target:g}) must be below A3S_COMPACT_THRESHOLD"
            f" ({settings.compact_threshold:g}): compaction must bring the context under the threshold"
        )


def _check_tls(cert: Path | None, key: Path | None) -> None:
    if cert is None and key is None:
        return
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise ConfigError(
            f"{given} needs {missing} too (env A3S_TLS_CERT, A3S_TLS_KEY): give both or neither"
        )
    texts = {}
    for path, flag in ((cert, "--tls-cert"), (key, "--tls-key")):
        try:
            texts[flag] = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {flag} {path}: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in texts["--tls-cert"]:
        raise ConfigError(f"--tls-cert {cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if b"PRIVATE KEY-----" not in texts["--tls-key"] or b"ENCRYPTED" in texts["--tls-key"]:
        raise ConfigError(
            f"--tls-key {key} holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)"
        )
    try:  # parses both and checks that the key belongs to the certificate
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        raise ConfigError(
            f"--tls-cert {cert} and --tls-key {key} are not a usable certificate and its private key:"
            f" {exc.reason or exc}"
        ) from None


def provider_key_settings(env: Mapping[str, str]) -> ProviderKeySettings:
    """A3S_STORE_PROVIDER_KEYS, and A3S_PROVIDER_KEY_REFS: comma-separated `env:NAME=URL` or
    `file:/absolute/path=URL`, each a reference provider entries may use, bound to that base URL."""
    references: dict[KeyReference, str] = {}
    for item in env.get("A3S_PROVIDER_KEY_REFS", "").split(","):
        if not item.strip():
            continue
        reference, _, url = item.strip().partition("=")
        kind, _, target = reference.partition(":")
        if kind not in ("env", "file") or not target.strip() or not url.strip():
            raise ConfigError(
                f"A3S_PROVIDER_KEY_REFS: {item.strip()[:60]!r} is not env:NAME=URL or file:/path=URL"
            )
        if kind == "file" and not Path(target).is_absolute():
            raise ConfigError(f"A3S_PROVIDER_KEY_REFS: the file {target[:60]!r} must be an absolute path")
        try:
            references[KeyReference(kind, target.strip())] = checked_base_url(url, f"the URL of {reference}")
        except InvalidArgument as exc:
            raise ConfigError(f"A3S_PROVIDER_KEY_REFS: {exc}") from None
    return ProviderKeySettings(stored=_flag(env, "A3S_STORE_PROVIDER_KEYS"), references=references)
