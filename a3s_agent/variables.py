"""Every environment variable a3s-agent reads: what it sets, its default and how it is written.

One table, read three ways: the command line's help names a flag's variable and default from it
(`env_note`), tools/gen_reference.py writes docs/reference/environment.md from it, and
tests/test_reference.py fails when the code reads an A3S_* variable the table lacks or the table
names one the code no longer reads. Which flag stands for a variable is the parser's to say (its
help holds the note); config.py and the tools read the variables themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .config import (
    DEFAULT_A2A_MAX_TASKS,
    DEFAULT_CHECKPOINT_KEEP,
    DEFAULT_CHECKPOINT_MAX_AGE_HOURS,
    DEFAULT_CHECKPOINT_MAX_FILE_BYTES,
    DEFAULT_COMPACT_TARGET,
    DEFAULT_COMPACT_THRESHOLD,
    DEFAULT_CRON_TIMEZONE,
    DEFAULT_EVENT_RETENTION_COUNT,
    DEFAULT_EVENT_RETENTION_HOURS,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_HTTP_LISTEN,
    DEFAULT_LEASE_TTL_S,
    DEFAULT_LISTEN,
    DEFAULT_LLM_RETRIES,
    DEFAULT_LLM_TIMEOUT_S,
    DEFAULT_LSP_IDLE_S,
    DEFAULT_MAX_CONTEXT_TOKENS,
    DEFAULT_MAX_GENERATIONS,
    DEFAULT_MAX_GRPC_CONNECTIONS,
    DEFAULT_MAX_HTTP_CONNECTIONS,
    DEFAULT_MAX_MEMORIES,
    DEFAULT_MAX_REQUEST_MESSAGES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SPACE_RUNS,
    DEFAULT_MAX_SPACES,
    DEFAULT_MAX_SUBAGENTS,
    DEFAULT_MAX_TOOL_CALLS,
    DEFAULT_SANDBOX_PROCESSES,
    DEFAULT_SUBAGENT_DEPTH,
)

Form = Literal["value", "on", "off", "list", "paths"]
"""How a variable is written: a value; a switch off by default that `1` turns on (also true, yes,
on); a switch on by default that `0` turns off (also false, no, off); a comma-separated list; a
`:`-separated list of paths."""


@dataclass(frozen=True)
class Variable:
    name: str
    sets: str
    """What it sets, as a sentence without its final period (Markdown)."""
    default: str = ""
    """The value when it is unset, as the documents write it; "" for nothing."""
    form: Form = "value"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


SECTIONS: dict[str, tuple[Variable, ...]] = {
    # The reference page shows them in this order, under these titles.
    "Listeners and access": (
        Variable(
            "LISTEN_ADDR",
            "the gRPC address, HOST:PORT (port 0: a free one, which the log names)",
            DEFAULT_LISTEN,
        ),
        Variable(
            "A3S_HTTP_LISTEN",
            "the HTTP face's address, HOST:PORT, or `off`",
            DEFAULT_HTTP_LISTEN,
        ),
        Variable(
            "A3S_AUTH_TOKEN_FILE",
            "a file whose contents are the bearer token every call but the health checks must send",
        ),
        Variable(
            "A3S_AUTH_TOKEN",
            "the bearer token itself, when no token file is given (printable ASCII, no spaces)",
        ),
        Variable(
            "A3S_ALLOW_UNAUTHENTICATED",
            "serve a non-loopback address without a token (a warning at every start)",
            form="on",
        ),
        Variable(
            "A3S_ALLOWED_ORIGINS",
            "browser Origins the HTTP face accepts and answers CORS for, e.g. `https://app.example`",
            "none",
            form="list",
        ),
        Variable(
            "A3S_ALLOWED_HOSTS",
            "Host names the HTTP face accepts besides its own address (a proxy's public name)",
            form="list",
        ),
        Variable(
            "A3S_TLS_CERT",
            "the PEM certificate chain of both listeners (with `A3S_TLS_KEY`), and the CA `a3s-agent health`"
            " trusts by default",
        ),
        Variable("A3S_TLS_KEY", "the unencrypted PEM private key of both listeners (with `A3S_TLS_CERT`)"),
        Variable(
            "A3S_TLS_SERVER_NAME",
            "`a3s-agent health`: the name to check the server's certificate against, when not the"
            " address's host",
        ),
        Variable(
            "A3S_MAX_HTTP_CONNECTIONS",
            "HTTP connections at once; beyond it 503 and close",
            _number(DEFAULT_MAX_HTTP_CONNECTIONS),
        ),
        Variable(
            "A3S_MAX_GRPC_CONNECTIONS",
            "gRPC connections at once; beyond it closed as soon as accepted",
            _number(DEFAULT_MAX_GRPC_CONNECTIONS),
        ),
        Variable(
            "A3S_DIALECT",
            "the A3S gRPC dialect: `auto` (each request's own, told from its bytes), `box` or `later`",
            "auto",
        ),
        Variable(
            "A3S_RELEASE_IDENTITY",
            "the `sha256:` and 64 hex digits release digest A3S harness requests must name",
            "any well-formed digest",
        ),
        Variable("A3S_COVEN_GATEWAY", "a coven gateway, HOST:PORT, to serve as an agent besides the server"),
        Variable("A3S_MCP_HTTP", "serve the MCP server face at `/mcp` on the HTTP listener", form="on"),
        Variable(
            "A3S_PROMETHEUS_METRICS",
            "serve the server's metrics in Prometheus' text format at `/metrics` on the HTTP listener",
            form="on",
        ),
        Variable(
            "A3S_A2A", "serve the A2A face (agent card, JSON-RPC at `/a2a`) on the HTTP listener", form="on"
        ),
        Variable(
            "A3S_A2A_PUSH_URLS",
            "the URL prefixes A2A push notifications may be sent to (through the checked fetcher)",
            "none: push notifications are not offered",
            form="list",
        ),
        Variable(
            "A3S_A2A_MAX_TASKS",
            "how many A2A tasks the server keeps (in the session store); past it the oldest ended"
            " ones are forgotten (GetTask: task not found)",
            _number(DEFAULT_A2A_MAX_TASKS),
        ),
        Variable(
            "A3S_MCP_TOOLS",
            "the tools the MCP server face offers",
            "every tool the server has, and agent_task",
            form="list",
        ),
        Variable(
            "A3S_GRACE_SECONDS",
            "on SIGTERM, SIGINT or Shutdown: how long running calls may go on before they are cancelled",
            _number(DEFAULT_GRACE_SECONDS),
        ),
        Variable("A3S_LOG_LEVEL", "`DEBUG`, `INFO`, `WARNING` or `ERROR`", "INFO"),
        Variable(
            "A3S_LOG_FORMAT",
            "`text`, or `json`: each log line one JSON object with its trace, span, session and replica",
            "text",
        ),
    ),
    "Workspace and data": (
        Variable("WORKSPACE", "the workspace directory", "the current directory"),
        Variable(
            "A3S_WORKSPACE_ROOT", "the directory every session's workspace must lie in", "the workspace"
        ),
        Variable(
            "A3S_DATA_DIR",
            "where the stores live",
            "~/.local/share/a3s-agent/workspaces/<name>-<hash>, under $XDG_DATA_HOME if set",
        ),
        Variable(
            "A3S_DURABILITY",
            "`full`: every SQLite commit is synced before the reply; `normal`: at checkpoints",
            "full",
        ),
        Variable(
            "A3S_STORE",
            "a `postgresql://` URL: sessions, event logs, leases and Agent Spaces in that database,"
            " shared by replicas",
            "the SQLite files in the data directory",
        ),
        Variable("PGPASSWORD", "the PostgreSQL password of an `A3S_STORE` URL that has none"),
        Variable("A3S_REPLICA_ID", "this replica's name in leases and logs", "host-pid"),
        Variable(
            "A3S_LEASE_TTL_S",
            "a running generation's lease, in seconds, renewed every third of it",
            _number(DEFAULT_LEASE_TTL_S),
        ),
        Variable(
            "A3S_EVENT_RETENTION_HOURS",
            "event log entries older than this many hours are removed",
            _number(DEFAULT_EVENT_RETENTION_HOURS),
        ),
        Variable(
            "A3S_EVENT_RETENTION_COUNT",
            "and all but this many newest entries of each session",
            _number(DEFAULT_EVENT_RETENTION_COUNT),
        ),
    ),
    "The model": (
        Variable(
            "A3S_LLM_PROVIDER",
            "the server's LLM provider (`openai`, `anthropic`, `claude+thinking`, `relay`; `+text` for"
            " tools as text commands): the last fallback after a session's and Initialize's",
        ),
        Variable("A3S_LLM_MODEL", "the server's LLM model"),
        Variable("A3S_LLM_API_KEY", "the server's LLM API key"),
        Variable("OPENAI_API_KEY", "the server's LLM API key when `A3S_LLM_API_KEY` is unset"),
        Variable("A3S_LLM_BASE_URL", "the server's LLM endpoint"),
        Variable("OPENAI_BASE_URL", "the server's LLM endpoint when `A3S_LLM_BASE_URL` is unset"),
        Variable(
            "A3S_LLM_TIMEOUT_S",
            "the bound, in seconds, on each wait for the LLM",
            _number(DEFAULT_LLM_TIMEOUT_S),
        ),
        Variable(
            "A3S_LLM_RETRIES",
            "retries of an LLM call answered 408, 409, 429 or 5xx",
            _number(DEFAULT_LLM_RETRIES),
        ),
        Variable(
            "A3S_LLM_TOOL_MODE",
            "`text`: LLM configs without `+text` or `+native` offer tools as text commands",
            "native",
        ),
        Variable(
            "A3S_RELAY_DIR", "the relay's directory (outbox/, inbox/), for the relay provider and command"
        ),
        Variable(
            "A3S_MODEL_PRICES",
            "a JSON file of model prices, US dollars per million input and output tokens, for GetCostSummary",
            "none: costs are 0",
        ),
        Variable(
            "A3S_STORE_PROVIDER_KEYS",
            "keep the API keys clients give provider entries (AddProvider, UpdateProvider) in the session"
            " store; off, a key is kept in the memory of the server it was given to",
            form="on",
        ),
        Variable(
            "A3S_PROVIDER_KEY_REFS",
            "the key references provider entries may use, each with the only base URL it is sent to:"
            " `env:NAME=URL` (a variable of the server's, withheld from tools) or `file:/path=URL`",
            form="list",
        ),
        Variable(
            "A3S_MAX_CONTEXT_TOKENS",
            "the largest context window a session may set",
            _number(DEFAULT_MAX_CONTEXT_TOKENS),
        ),
        Variable(
            "A3S_COMPACT_THRESHOLD",
            "the share of the context window past which auto-compaction runs",
            _number(DEFAULT_COMPACT_THRESHOLD),
        ),
        Variable(
            "A3S_COMPACT_TARGET",
            "the share of the window the prompt fits in after compaction (below the threshold)",
            _number(DEFAULT_COMPACT_TARGET),
        ),
    ),
    "Limits": (
        Variable(
            "A3S_MAX_SESSIONS",
            "sessions held at once; beyond it CreateSession answers `RESOURCE_EXHAUSTED`",
            _number(DEFAULT_MAX_SESSIONS),
        ),
        Variable(
            "A3S_MAX_GENERATIONS",
            "generations running or waiting for their session at once",
            _number(DEFAULT_MAX_GENERATIONS),
        ),
        Variable(
            "A3S_MAX_TOOL_CALLS",
            "direct ExecuteTool and ExecuteToolBatch calls running at once",
            _number(DEFAULT_MAX_TOOL_CALLS),
        ),
        Variable(
            "A3S_MAX_SPACE_RUNS", "Agent Spaces runs executing at once", _number(DEFAULT_MAX_SPACE_RUNS)
        ),
        Variable("A3S_MAX_SPACES", "Agent Spaces kept in the store", _number(DEFAULT_MAX_SPACES)),
        Variable(
            "A3S_MAX_REQUEST_MESSAGES",
            "messages in one request; beyond it `INVALID_ARGUMENT`",
            _number(DEFAULT_MAX_REQUEST_MESSAGES),
        ),
        Variable(
            "A3S_MAX_MEMORIES",
            "memories a workspace keeps (those its sessions share); beyond it `RESOURCE_EXHAUSTED`",
            _number(DEFAULT_MAX_MEMORIES),
        ),
    ),
    "Skills, instructions and MCP servers": (
        Variable("A3S_SKILL_DIRS", "directories of skills, before the example skills", form="paths"),
        Variable(
            "A3S_SKILL_SOURCES",
            "where SearchSkills and InstallSkill find skills, `[NAME=]LOCATION` each: a git URL"
            " (`https://`, `http://`, `file://`) or an absolute directory of skills; unset, they answer"
            " `FAILED_PRECONDITION`",
            form="list",
        ),
        Variable(
            "A3S_TRUST_WORKSPACE_SKILLS",
            "let skills in `<workspace>/.a3s/skills` turn their allowed-tools into allow rules",
            form="on",
        ),
        Variable(
            "A3S_AGENT_DIRS",
            "directories of agent files, the subagents the `task` tool starts besides explore, plan"
            " and general (docs/agent/subagents.md)",
            form="paths",
        ),
        Variable(
            "A3S_TRUST_WORKSPACE_AGENTS",
            "let agents in `<workspace>/.a3s/agents` have the tools and the model they name (else"
            " read-only tools and the session's model)",
            form="on",
        ),
        Variable(
            "A3S_SUBAGENT_DEPTH",
            "how deep subagents nest: 1, children start none; 0, no `task` tool",
            _number(DEFAULT_SUBAGENT_DEPTH),
        ),
        Variable(
            "A3S_MAX_SUBAGENTS",
            "subagents one generation runs at once; further `task` calls wait for one to end",
            _number(DEFAULT_MAX_SUBAGENTS),
        ),
        Variable(
            "A3S_PROJECT_INSTRUCTIONS",
            "put AGENTS.md, CLAUDE.md and .a3s/instructions.md of the workspace and the directories"
            " above it into the system prompt",
            form="off",
        ),
        Variable(
            "A3S_MEMORY",
            "what models get of the memories sessions keep: `off`, `tools` (remember and recall),"
            " `prompt=N` (the N most relevant in the system prompt, up to 10) or `tools,prompt=N`;"
            " a session's `a3s-memory` metadata overrides it",
            "off",
        ),
        Variable(
            "A3S_MCP_CONFIG", 'the operator\'s MCP servers: a JSON or YAML file of `{"mcpServers": ...}`'
        ),
        Variable(
            "A3S_ALLOW_API_MCP_COMMANDS",
            "MCP servers given over the API may be commands run here, not only URLs",
            form="on",
        ),
        Variable(
            "A3S_LSP_SERVERS",
            "language servers the operator adds or replaces, `;`-separated `LANGUAGE[:.EXT,...]=COMMAND`"
            " entries, e.g. `rust=rust-analyzer;zig:.zig=zls` (docs/agent/lsp.md)",
            "basedpyright or pylsp, typescript-language-server, rust-analyzer, gopls, clangd where installed",
        ),
        Variable(
            "A3S_LSP_IDLE_S",
            "seconds a language server may go unused before it is stopped",
            _number(DEFAULT_LSP_IDLE_S),
        ),
    ),
    "Tools and their sandbox": (
        Variable(
            "A3S_SANDBOX",
            "the OS sandbox of every tool process: `auto` (bwrap, else Landlock), `bwrap`, `landlock` or `off`",
            "auto",
        ),
        Variable(
            "A3S_SANDBOX_NETWORK",
            "what those processes may reach: `off`, `on`, or `allow:HOST,HOST` through the server's proxy",
            "off",
        ),
        Variable("A3S_SANDBOX_READ", "further trees tool processes may read", form="paths"),
        Variable("A3S_SANDBOX_WRITE", "further trees tool processes may read and write", form="paths"),
        Variable(
            "A3S_SANDBOX_DENY", "paths tool processes may not read even inside those trees", form="paths"
        ),
        Variable(
            "A3S_SANDBOX_MEMORY",
            "the memory of each call's processes, e.g. `4G` (units of 1024)",
            "no limit",
        ),
        Variable(
            "A3S_SANDBOX_PROCESSES",
            "the processes and threads of one call at once (an MCP server: of the server and all it"
            " starts), `pids.max` of its cgroup where the server has cgroups",
            _number(DEFAULT_SANDBOX_PROCESSES),
        ),
        Variable(
            "A3S_TOOL_CGROUPS", "put each tool call in a cgroup of its own where one can be made", form="off"
        ),
        Variable(
            "A3S_FETCH_ALLOW_PRIVATE",
            "`1`, `true` or `yes`: `web_fetch`, MCP and skill URLs may reach non-public addresses (also"
            " in Initialize's `env`)",
            "off",
        ),
        Variable(
            "A3S_SEARCH_PROVIDER",
            "`web_search`'s backend: `searxng`, `brave` or `tavily` (also in Initialize's `env`)",
            "searxng with A3S_SEARCH_URL, else brave with BRAVE_API_KEY, else tavily with TAVILY_API_KEY",
        ),
        Variable(
            "A3S_SEARCH_URL",
            "the SearXNG base URL, or another backend's endpoint (a proxy) (also in Initialize's `env`)",
        ),
        Variable(
            "A3S_SEARCH_API_KEY", "the search backend's API key, for any backend (also in Initialize's `env`)"
        ),
        Variable(
            "BRAVE_API_KEY",
            "the Brave Search API key, when `A3S_SEARCH_API_KEY` is unset (also in Initialize's `env`)",
        ),
        Variable(
            "TAVILY_API_KEY",
            "the Tavily API key, when `A3S_SEARCH_API_KEY` is unset (also in Initialize's `env`)",
        ),
        Variable(
            "A3S_SECRET_ENV",
            "names of further variables the server treats as secrets: withheld from its environment and"
            " from every tool",
            form="list",
        ),
    ),
    "Scheduled jobs": (
        Variable(
            "A3S_ENABLE_CRON",
            "serve the scheduled-jobs RPCs (ListCronJobs, CreateCronJob...) and fire the stored jobs;"
            " off, they answer `FAILED_PRECONDITION`",
            form="on",
        ),
        Variable(
            "A3S_CRON_MISSED",
            "firings due while no server ran: `skip` them, or `run-once` (one firing of each such job at"
            " start)",
            "skip",
        ),
        Variable("A3S_CRON_TIMEZONE", "the IANA time zone schedules are read in", DEFAULT_CRON_TIMEZONE),
    ),
    "Checkpoints": (
        Variable(
            "A3S_CHECKPOINTS",
            "a checkpoint of the session's workspace before each generation and direct tool call that"
            " may change files (see Checkpoints, rewind and fork)",
            form="on",
        ),
        Variable(
            "A3S_CHECKPOINT_DIR",
            "where the workspaces' shadow repositories are kept; replicas set it to one directory on"
            " the volume their workspaces share",
            "`<data dir>/checkpoints`",
        ),
        Variable(
            "A3S_CHECKPOINT_KEEP",
            "the checkpoints kept per session (older ones are pruned)",
            _number(DEFAULT_CHECKPOINT_KEEP),
        ),
        Variable(
            "A3S_CHECKPOINT_MAX_AGE_HOURS",
            "checkpoints older than this many hours are pruned (never a session's newest)",
            _number(DEFAULT_CHECKPOINT_MAX_AGE_HOURS),
        ),
        Variable(
            "A3S_CHECKPOINT_MAX_FILE_BYTES",
            "a file larger than this is left out of checkpoints, and listed as skipped",
            _number(DEFAULT_CHECKPOINT_MAX_FILE_BYTES),
        ),
    ),
    "Set by the server": (
        Variable(
            "A3S_AGENT_SCOPE",
            "in every tool process's environment: marks it as a tool call's, so that the server can find"
            " and kill what the call left running (not a setting)",
        ),
    ),
}

VARIABLES: dict[str, Variable] = {v.name: v for section in SECTIONS.values() for v in section}


def written(variable: Variable) -> str:
    """The variable as it is set to change something: `A3S_MCP_HTTP=1`, `A3S_TOOL_CGROUPS=0`, or its name."""
    return {"on": f"{variable.name}=1", "off": f"{variable.name}=0"}.get(variable.form, variable.name)


def separated(variable: Variable) -> str:
    """How a list's items are separated: "comma-separated", "':'-separated", or "" for a single value."""
    return {"list": "comma-separated", "paths": "':'-separated"}.get(variable.form, "")


def default_of(variable: Variable) -> str:
    """The default as the documents write it: a switch's is off or on."""
    if variable.form in ("on", "off"):
        return "off" if variable.form == "on" else "on"
    return variable.default


def env_note(name: str) -> str:
    """The note a flag's help ends with: `(env A3S_X; default Y)`, `(env A3S_X=1)`, ..."""
    variable = VARIABLES[name]
    items = f", {separated(variable)}" if separated(variable) else ""
    default = (
        f"; default {variable.default}" if variable.default and variable.form not in ("on", "off") else ""
    )
    return f"(env {written(variable)}{items}{default})"
