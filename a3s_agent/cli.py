"""The `a3s-agent` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import (
    CRON_MISSED_RULES,
    ConfigError,
    Settings,
    check_address,
    check_serving,
    settings_from,
    store_holds_password,
)
from .variables import env_note

if TYPE_CHECKING:
    import grpc


SERVE = (
    "run the server: gRPC (both A3S dialects) on --listen; HTTP (REST, SSE, WebSocket, Agent Spaces,"
    " the A3S harness; /mcp with --mcp-http) on --http-listen; coven with --coven-gateway"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a3s-agent",
        description="A coding agent other programs drive over gRPC, HTTP, MCP, ACP and coven.",
    )
    parser.add_argument("--version", action="version", version=f"a3s-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help=SERVE, description=f"{SERVE[0].upper()}{SERVE[1:]}.")
    serve.add_argument("--listen", help=f"HOST:PORT to listen on {env_note('LISTEN_ADDR')}")
    serve.add_argument(
        "--http-listen",
        help="HOST:PORT for REST, server-sent events, WebSocket and /healthz, or 'off'"
        f" {env_note('A3S_HTTP_LISTEN')}",
    )
    _workspace_flags(serve)
    serve.add_argument(
        "--max-sessions", type=int, help=f"most sessions held at once {env_note('A3S_MAX_SESSIONS')}"
    )
    serve.add_argument(
        "--auth-token",
        help="refused: a token on the command line is visible to every local user; use --auth-token-file",
    )
    serve.add_argument(
        "--auth-token-file",
        help="require 'authorization: Bearer TOKEN' on every call but health checks, TOKEN being this"
        f" file's contents, else A3S_AUTH_TOKEN's value {env_note('A3S_AUTH_TOKEN_FILE')}",
    )
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help=f"serve a non-loopback address without a token {env_note('A3S_ALLOW_UNAUTHENTICATED')}",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        help="a browser Origin the HTTP face accepts, e.g. https://app.example; repeatable"
        f" {env_note('A3S_ALLOWED_ORIGINS')}",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="a Host name the HTTP face accepts besides its own address; repeatable"
        f" {env_note('A3S_ALLOWED_HOSTS')}",
    )
    serve.add_argument(
        "--tls-cert", help=f"PEM certificate chain for both listeners {env_note('A3S_TLS_CERT')}"
    )
    serve.add_argument("--tls-key", help=f"PEM private key for both listeners {env_note('A3S_TLS_KEY')}")
    serve.add_argument(
        "--workspace-root",
        help=f"session workspaces must lie inside this directory {env_note('A3S_WORKSPACE_ROOT')}",
    )
    serve.add_argument(
        "--trust-workspace-skills",
        action="store_true",
        help="let skills in <workspace>/.a3s/skills turn their allowed-tools into allow rules"
        f" {env_note('A3S_TRUST_WORKSPACE_SKILLS')}",
    )
    serve.add_argument(
        "--no-project-instructions",
        action="store_true",
        help="do not put AGENTS.md, CLAUDE.md and .a3s/instructions.md from the workspace and the"
        " directories above it (up to the repository root) into the system prompt"
        f" {env_note('A3S_PROJECT_INSTRUCTIONS')}",
    )
    serve.add_argument(
        "--skills-dir",
        action="append",
        default=[],
        help=f"a directory of skills; repeatable {env_note('A3S_SKILL_DIRS')}",
    )
    serve.add_argument(
        "--skill-source",
        action="append",
        default=[],
        metavar="[NAME=]LOCATION",
        help="where SearchSkills and InstallSkill find skills: a git URL (https://, http://, file://) or"
        f" an absolute directory of skills; repeatable {env_note('A3S_SKILL_SOURCES')}",
    )
    serve.add_argument(
        "--agents-dir",
        action="append",
        default=[],
        help=f"a directory of agent files (subagents the task tool starts); repeatable {env_note('A3S_AGENT_DIRS')}",
    )
    serve.add_argument(
        "--trust-workspace-agents",
        action="store_true",
        help="let agents in <workspace>/.a3s/agents have the tools and the model they name, not only"
        f" read-only tools and the session's model {env_note('A3S_TRUST_WORKSPACE_AGENTS')}",
    )
    serve.add_argument(
        "--coven-gateway",
        help=f"also connect to this coven gateway (HOST:PORT) as an agent {env_note('A3S_COVEN_GATEWAY')}",
    )
    serve.add_argument(
        "--grace-seconds",
        type=float,
        help="on SIGTERM/SIGINT/Shutdown: how long running calls may go on before they are cancelled"
        f" {env_note('A3S_GRACE_SECONDS')}",
    )
    serve.add_argument(
        "--mcp-http",
        action="store_true",
        help="also serve the MCP server face at /mcp on the HTTP listener, behind its token"
        f" {env_note('A3S_MCP_HTTP')}",
    )
    _mcp_tools_flag(serve)
    serve.add_argument(
        "--prometheus-metrics",
        action="store_true",
        help="serve the server's metrics for Prometheus at /metrics on the HTTP listener, behind its"
        f" token {env_note('A3S_PROMETHEUS_METRICS')}",
    )
    serve.add_argument(
        "--a2a",
        action="store_true",
        help="also serve the A2A face (agent card, JSON-RPC at /a2a) on the HTTP listener, behind its"
        f" token {env_note('A3S_A2A')}",
    )
    serve.add_argument(
        "--a2a-push-url",
        action="append",
        default=[],
        help="a URL prefix A2A push notifications may be sent to (none: push notifications are not"
        f" offered); comma-separated, repeatable {env_note('A3S_A2A_PUSH_URLS')}",
    )
    serve.add_argument(
        "--mcp-config",
        help="MCP servers whose tools the agent uses: a JSON or YAML file of the"
        ' {"mcpServers": {name: {command, args, env, cwd} | {url, headers}}} shape'
        f" {env_note('A3S_MCP_CONFIG')}",
    )
    serve.add_argument(
        "--allow-api-mcp-commands",
        action="store_true",
        help="let MCP servers given over the API (Initialize, session metadata, skills sent as content)"
        f" be commands run here, not only URLs {env_note('A3S_ALLOW_API_MCP_COMMANDS')}",
    )
    serve.add_argument(
        "--lsp-server",
        action="append",
        metavar="LANGUAGE[:.EXT,...]=COMMAND",
        help="the language server of a language (or of files with these extensions), run by command:"
        f" e.g. rust=rust-analyzer; repeatable {env_note('A3S_LSP_SERVERS')}",
    )
    serve.add_argument(
        "--store",
        help="postgresql://user@host:port/database: keep sessions, event logs and leases there, so that"
        f" several replicas serve the same sessions {env_note('A3S_STORE')}. A password here is refused"
        " (ps shows it): set PGPASSWORD, use ~/.pgpass or PGPASSFILE, or put the whole URL in A3S_STORE",
    )
    serve.add_argument(
        "--replica-id",
        help=f"this replica's name in leases and logs {env_note('A3S_REPLICA_ID')}",
    )
    serve.add_argument(
        "--release-identity",
        metavar="DIGEST",
        help="the sha256:<64 hex> release digest A3S harness requests must name"
        f" {env_note('A3S_RELEASE_IDENTITY')}",
    )
    serve.add_argument(
        "--model-prices",
        metavar="FILE",
        help='prices for GetCostSummary: a JSON file {"<model>": {"input_per_mtok": 3.0,'
        ' "output_per_mtok": 15.0}} in USD per million tokens'
        f" {env_note('A3S_MODEL_PRICES')}",
    )
    serve.add_argument(
        "--a3s-dialect",
        help="the A3S gRPC dialect: auto (each request's own, told from its bytes), box (the Box-era"
        f" proto) or later (the string dialect of the TypeScript SDK) {env_note('A3S_DIALECT')}",
    )
    serve.add_argument(
        "--memory",
        help="what models get of the memories sessions keep: off (the default), tools (the remember"
        " and recall tools), prompt=N (the N memories most relevant to each request, up to 10, in"
        " the system prompt) or tools,prompt=N; a session's a3s-memory metadata overrides it"
        f" {env_note('A3S_MEMORY')}",
    )
    _sandbox_flags(serve)
    _cron_flags(serve)
    sandbox = commands.add_parser("sandbox", help="the OS sandbox tool processes run in")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True)
    check = sandbox_commands.add_parser(
        "check",
        help="print the sandbox mechanism this machine gives and try its policy: a planted secret read,"
        " a write outside the workspace, a connection (exit 0 only when every check passes)",
    )
    _sandbox_flags(check)
    mcp = commands.add_parser(
        "mcp", help="serve the tools and the agent (agent_task) as an MCP server over stdin and stdout"
    )
    _workspace_flags(mcp)
    _mcp_tools_flag(mcp)
    acp = commands.add_parser(
        "acp", help="serve an editor over the Agent Client Protocol on stdin and stdout (Zed, JetBrains...)"
    )
    _workspace_flags(acp)
    acp.add_argument(
        "--workspace-root",
        help="session directories (the editor's cwd) must lie inside this one"
        f" {env_note('A3S_WORKSPACE_ROOT')}",
    )
    acp.add_argument(
        "--editor-tools",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read, write and edit files through the editor (its unsaved buffers) and run bash in its"
        " terminals, when it offers them (default on; --no-editor-tools: on the disk, as the server does)",
    )
    coven = commands.add_parser("coven", help="connect to a coven gateway as an agent")
    coven.add_argument("--gateway", required=True, help="HOST:PORT of the gateway")
    coven.add_argument("--name", help="the agent's name (default a3s-agent@HOSTNAME)")
    coven.add_argument(
        "--agent-id", help="a fixed agent id (default: one made once and kept in the data dir)"
    )
    _workspace_flags(coven, log_level=False)
    ops = commands.add_parser("ops", help="run an Agent Spaces operations message and print the events")
    ops.add_argument("file", help="the operations message (JSON)")
    ops.add_argument("--workspace", default=".", help="the directory the operations work in")
    ops.add_argument("--policy", default="standard", help="restrictive, standard or permissive")
    relay = commands.add_parser("relay", help="run a task with an LLM you relay by copy-paste (no network)")
    relay_commands = relay.add_subparsers(dest="relay_command", required=True)
    new = relay_commands.add_parser("new", help="start a session on TASK and write its first outbox file")
    new.add_argument("task", help="what the agent should do")
    new.add_argument("--workspace", default=".", help="the workspace directory (default: current directory)")
    resume = relay_commands.add_parser("resume", help="go on with a relay session (default: the latest)")
    resume.add_argument("--handle", help="the session's 8-hex-digit handle, as in its outbox file names")
    for sub in (new, resume):
        sub.add_argument(
            "--relay-dir", help=f"holds outbox/, inbox/ and sessions.json {env_note('A3S_RELAY_DIR')}"
        )
        sub.add_argument(
            "--wait-timeout", type=float, default=3600.0, help="seconds to wait for each reply (default 3600)"
        )
    health = commands.add_parser("health", help="exit 0 when a server answers SERVING (for HEALTHCHECK)")
    health.add_argument("--address", default="127.0.0.1:4088", help="HOST:PORT of the server")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer")
    health.add_argument(
        "--tls-ca",
        help="speak TLS, trusting the CA certificate(s) in this PEM file"
        " (default: A3S_TLS_CERT when set, i.e. the server's own, possibly self-signed, certificate)",
    )
    health.add_argument(
        "--tls-server-name",
        help="the name to check the server's certificate against, when not the host in --address"
        f" {env_note('A3S_TLS_SERVER_NAME')}",
    )
    return parser


def _workspace_flags(parser: argparse.ArgumentParser, *, log_level: bool = True) -> None:
    """--workspace, --data-dir and (but for coven) --log-level, as every command serving a workspace takes them."""
    parser.add_argument("--workspace", help=f"the workspace directory {env_note('WORKSPACE')}")
    parser.add_argument("--data-dir", help=f"where sessions are stored {env_note('A3S_DATA_DIR')}")
    if log_level:
        parser.add_argument("--log-level", help=f"DEBUG, INFO, WARNING or ERROR {env_note('A3S_LOG_LEVEL')}")
        parser.add_argument(
            "--log-format",
            help="text, or json: each log line one JSON object with the trace, span, session and"
            f" replica it belongs to {env_note('A3S_LOG_FORMAT')}",
        )


def _mcp_tools_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mcp-tools",
        action="append",
        default=[],
        help="the tools the MCP server face offers, comma-separated, e.g. read_file,grep,agent_task;"
        f" repeatable {env_note('A3S_MCP_TOOLS')}",
    )


def _sandbox_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sandbox",
        help="the OS sandbox every process a tool starts runs in: auto (bwrap, else Landlock; if neither"
        " works, tools that start processes refuse), bwrap, landlock, or off (unsandboxed)"
        f" {env_note('A3S_SANDBOX')}",
    )
    parser.add_argument(
        "--sandbox-network",
        help="what those processes may reach: off, on, or allow:HOST,HOST through the server's proxy"
        " (names, *.domain, *, addresses, each with an optional :PORT; allow: needs bwrap)"
        f" {env_note('A3S_SANDBOX_NETWORK')}",
    )
    for kind, what, variable in (
        ("read", "a further tree they may read", "A3S_SANDBOX_READ"),
        ("write", "a further tree they may read and write", "A3S_SANDBOX_WRITE"),
        ("deny", "a path they may not read even inside those trees", "A3S_SANDBOX_DENY"),
    ):
        parser.add_argument(
            f"--sandbox-{kind}",
            action="append",
            default=[],
            metavar="PATH",
            help=f"{what}; repeatable {env_note(variable)}",
        )


def _cron_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--enable-cron",
        action="store_true",
        help="serve the scheduled-jobs RPCs and fire the stored jobs: their shell commands and prompts"
        f" run here, unattended {env_note('A3S_ENABLE_CRON')}",
    )
    parser.add_argument(
        "--cron-missed",
        choices=CRON_MISSED_RULES,
        help="firings due while no server ran: skip them, or run-once (one firing of each such job at"
        f" start) {env_note('A3S_CRON_MISSED')}",
    )
    parser.add_argument(
        "--cron-timezone",
        metavar="ZONE",
        help=f"the IANA time zone schedules are read in, e.g. Europe/Paris {env_note('A3S_CRON_TIMEZONE')}",
    )


def _sandbox_check(args: argparse.Namespace) -> int:
    """Print the mechanism and the self-test's lines; 0 when everything passed."""
    from .config import sandbox_settings
    from .tools.sandbox.selftest import report

    try:
        settings = sandbox_settings(
            os.environ,
            mechanism=args.sandbox,
            network=args.sandbox_network,
            read=args.sandbox_read,
            write=args.sandbox_write,
            deny=args.sandbox_deny,
        )
    except ConfigError as exc:
        print(f"a3s-agent: {exc}", file=sys.stderr)
        return 2
    lines, passed = report(settings)
    print("\n".join(lines))
    return 0 if passed else 1


def _names(values: list[str]) -> list[str]:
    """Flag values that may each hold several comma-separated names."""
    return [name for value in values for name in value.split(",")]


def _mcp(args: argparse.Namespace) -> int:
    """The MCP server over stdio: stdout is the protocol, so every log line goes to stderr."""
    from .app.standalone import standalone
    from .faces.mcp import serve_stdio

    settings = _started(
        workspace=args.workspace,
        data_dir=args.data_dir,
        log_level=args.log_level,
        log_format=args.log_format,
        mcp_tools=_names(args.mcp_tools),
    )
    if settings is None:
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):  # before the runtime's SIGCHLD handler (containment)
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        async with standalone(settings) as app:
            ended = await serve_stdio(app, settings.mcp_tools, stop)
        if not ended:  # the SDK's stdin reader, a thread in read(), would keep the process alive
            logging.shutdown()
            os._exit(0)

    asyncio.run(main())
    return 0


def _acp(args: argparse.Namespace) -> int:
    """ACP over stdio: stdout is the protocol, so every log line goes to stderr."""
    from .faces.acp import run_acp

    settings = _started(
        workspace=args.workspace,
        data_dir=args.data_dir,
        workspace_root=args.workspace_root,
        log_level=args.log_level,
        log_format=args.log_format,
    )
    if settings is None:
        return 2
    if not settings.workspace.is_dir():
        logging.getLogger("a3s_agent").error("workspace %s is not a directory", settings.workspace)
        return 2
    return asyncio.run(run_acp(settings, editor_tools=args.editor_tools))


def _started(**values: Any) -> Settings | None:
    """The settings of a command that runs the agent, checked (the MCP config file too), with its
    logging and secrets begun; None after saying on stderr what is wrong (the command exits 2)."""
    try:
        settings = settings_from(**values)
        _check_mcp_config(settings)
        _check_sandbox_network(settings)
    except ConfigError as exc:
        print(f"a3s-agent: {exc}", file=sys.stderr)
        return None
    _begin(settings)
    return settings


def _check_mcp_config(settings: Settings) -> None:
    """The operator's MCP servers are read before anything starts: a fault is a start-up error."""
    if settings.mcp_config is None:
        return
    from .base.errors import InvalidArgument
    from .tools.mcp.config import operator_servers

    try:
        operator_servers(settings.mcp_config)
    except InvalidArgument as exc:
        raise ConfigError(f"--mcp-config (A3S_MCP_CONFIG): {exc}") from None


def _check_lsp_servers(settings: Settings) -> None:
    """The operator's language servers are read before anything starts: a fault is a start-up error."""
    from .tools.lsp.catalog import Catalog

    try:
        Catalog.with_configured(settings.lsp_servers)
    except ValueError as exc:
        raise ConfigError(f"--lsp-server (A3S_LSP_SERVERS): {exc}") from None


def _check_sandbox_network(settings: Settings) -> None:
    """A network of allow:... (the server's, or one the MCP config gives a server) needs a mechanism
    that can keep commands to the proxy (bwrap): under Landlock it is a start-up error, not a
    refusal of every such command later."""
    networks = {"--sandbox-network (A3S_SANDBOX_NETWORK)": settings.sandbox.network_text}
    if settings.mcp_config is not None:
        from .tools.mcp.config import StdioServer, operator_servers

        for name, spec in operator_servers(settings.mcp_config).items():
            if isinstance(spec, StdioServer):
                networks[f"--mcp-config: mcpServers.{name}.sandbox_network"] = spec.sandbox_network
    wanted = {what: network for what, network in networks.items() if network.startswith("allow:")}
    if not wanted or settings.sandbox.mechanism == "off":
        return
    from .tools.sandbox import Sandbox, network_problem

    mechanism = Sandbox(settings.sandbox).mechanism
    for what, network in wanted.items():
        problem = network_problem(mechanism, network)
        if problem:
            raise ConfigError(f"{what}: {problem}")


def _coven(args: argparse.Namespace) -> int:
    """The agent alone, talking only to the gateway (no gRPC or HTTP listener)."""
    from .app.standalone import standalone
    from .faces.coven import default_name, run_coven_agent

    try:
        check_address(args.gateway, "--gateway", listener=False)
    except ConfigError as exc:
        print(f"a3s-agent: {exc}", file=sys.stderr)
        return 2
    settings = _started(workspace=args.workspace, data_dir=args.data_dir)
    if settings is None:
        return 2

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # before the runtime's SIGCHLD handler (containment)
            loop.add_signal_handler(sig, stop.set)
        async with standalone(settings) as app:
            name = args.name or default_name()
            return await run_coven_agent(app, args.gateway, name=name, agent_id=args.agent_id, stop=stop)

    return asyncio.run(main())


def _relay(args: argparse.Namespace) -> int:
    from .faces.relay import relay_new, relay_resume
    from .text_protocol.relay import RelayTiming

    relay_dir = args.relay_dir or os.environ.get("A3S_RELAY_DIR")
    if not relay_dir:
        print("a3s-agent relay: give --relay-dir DIR or set A3S_RELAY_DIR", file=sys.stderr)
        return 2
    timing = RelayTiming(wait_timeout_s=args.wait_timeout)
    if args.relay_command == "new":
        return relay_new(args.task, workspace=Path(args.workspace), relay_dir=Path(relay_dir), timing=timing)
    return relay_resume(relay_dir=Path(relay_dir), handle=args.handle, timing=timing)


def _begin(settings: Settings) -> None:
    """Once the settings hold what the agent needs: log to stderr (stdout may be a protocol), then
    the secrets out of the environment (base/secrets.py)."""
    from .base.log_lines import begin_logging
    from .base.secrets import withhold_secrets

    begin_logging(settings.log_level, settings.log_format, settings.replica_id)
    names = withhold_secrets(settings.secret_env_names)
    if names:
        logging.getLogger("a3s_agent").info("withheld from the environment: %s", ", ".join(names))


def _channel(address: str, ca_file: str | None, server_name: str | None) -> grpc.Channel:
    """A plaintext channel, or a TLS one trusting `ca_file`."""
    import grpc

    if not ca_file:
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, credentials, options=options)


def _health(address: str, timeout_s: float, ca_file: str | None, server_name: str | None) -> int:
    """Ask grpc.health.v1 for the server's overall status."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        channel = _channel(address, ca_file, server_name)
    except OSError as exc:
        print(f"a3s-agent health: cannot read the CA file {ca_file}: {exc.strerror}", file=sys.stderr)
        return 2
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError as err:
            print(
                f"a3s-agent at {address} is not reachable: {err.code().name}: {err.details()}",
                file=sys.stderr,
            )
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"a3s-agent at {address} is {status}", file=sys.stderr)
        return 1
    print(f"a3s-agent at {address} is {status}")
    return 0


def _ops_failures(result: Mapping[str, Any]) -> int:
    """How many events say an operation did not succeed: failed, invalid, denied or left awaiting
    approval (the command cannot resume a run)."""
    return sum(
        event.get("success") is False or event.get("type") in {"error", "policyDenied", "approvalRequired"}
        for event in result["events"]
    )


def _ops(file: Path, workspace: Path, policy: str) -> int:
    """Print the events message. Exit 0 when every operation succeeded, 1 when one failed, was
    invalid or denied, or awaits approval; 2 when nothing ran (the file, message, workspace or
    policy is invalid: the reason goes to stderr)."""
    import json

    from .app.standalone import run_operations_file
    from .base.errors import AgentError

    try:
        result = asyncio.run(run_operations_file(file, workspace.resolve(), policy))
    except (AgentError, OSError) as exc:
        print(f"a3s-agent ops: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    failures = _ops_failures(result)
    if failures or result["status"] != "completed":
        print(
            f"a3s-agent ops: run {result['status']}; {failures} of {len(result['events'])} events report"
            " an operation that did not succeed",
            file=sys.stderr,
        )
        return 1
    return 0


def _quiet_grpc() -> None:
    """gRPC core writes its own log lines (`E0000 ... chttp2_server.cc ... bind`) to stderr; our
    messages say what went wrong. Unless the operator set GRPC_VERBOSITY: before grpc is imported."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _quiet_grpc()
    if args.command == "health":
        ca_file = args.tls_ca or os.environ.get("A3S_TLS_CERT")
        server_name = args.tls_server_name or os.environ.get("A3S_TLS_SERVER_NAME")
        return _health(args.address, args.timeout, ca_file, server_name)
    if args.command == "relay":
        return _relay(args)
    if args.command == "sandbox":
        return _sandbox_check(args)
    if args.command == "coven":
        return _coven(args)
    if args.command == "acp":
        return _acp(args)
    if args.command == "mcp":
        return _mcp(args)
    if args.command == "ops":
        return _ops(Path(args.file), Path(args.workspace), args.policy)
    if args.command == "serve":
        if args.auth_token is not None:
            print(
                "a3s-agent: --auth-token is refused: every local user can read a command line (ps,"
                " /proc/<pid>/cmdline). Put the token in a file only you can read and pass"
                " --auth-token-file FILE, or set A3S_AUTH_TOKEN_FILE=FILE or A3S_AUTH_TOKEN",
                file=sys.stderr,
            )
            return 2
        if args.store is not None and store_holds_password(args.store):
            print(
                "a3s-agent: a password in --store is refused: every local user can read a command line"
                " (ps, /proc/<pid>/cmdline). Leave it out of the URL and set PGPASSWORD, or keep it in a"
                " password file (~/.pgpass, or PGPASSFILE=FILE), or give the whole URL in A3S_STORE",
                file=sys.stderr,
            )
            return 2
        try:
            settings = settings_from(
                listen=args.listen,
                http_listen=args.http_listen,
                workspace=args.workspace,
                data_dir=args.data_dir,
                log_level=args.log_level,
                log_format=args.log_format,
                max_sessions=args.max_sessions,
                skills_dirs=args.skills_dir,
                skill_sources=args.skill_source,
                agents_dirs=args.agents_dir,
                trust_workspace_agents=args.trust_workspace_agents,
                auth_token_file=args.auth_token_file,
                coven_gateway=args.coven_gateway,
                allow_unauthenticated=args.allow_unauthenticated,
                allowed_origins=args.allowed_origin,
                allowed_hosts=args.allowed_host,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                trust_workspace_skills=args.trust_workspace_skills,
                no_project_instructions=args.no_project_instructions,
                workspace_root=args.workspace_root,
                grace_seconds=args.grace_seconds,
                mcp_tools=_names(args.mcp_tools),
                mcp_http=args.mcp_http,
                prometheus_metrics=args.prometheus_metrics,
                a2a=args.a2a,
                a2a_push_urls=_names(args.a2a_push_url),
                mcp_config=args.mcp_config,
                allow_api_mcp_commands=args.allow_api_mcp_commands,
                lsp_servers=args.lsp_server,
                store=args.store,
                replica_id=args.replica_id,
                model_prices=args.model_prices,
                release_identity=args.release_identity,
                a3s_dialect=args.a3s_dialect,
                memory=args.memory,
                sandbox=args.sandbox,
                sandbox_network=args.sandbox_network,
                sandbox_read=args.sandbox_read,
                sandbox_write=args.sandbox_write,
                sandbox_deny=args.sandbox_deny,
                enable_cron=args.enable_cron,
                cron_missed=args.cron_missed,
                cron_timezone=args.cron_timezone,
            )
            check_serving(settings)
            _check_mcp_config(settings)
            _check_lsp_servers(settings)
            _check_sandbox_network(settings)
        except ConfigError as exc:
            print(f"a3s-agent: {exc}", file=sys.stderr)
            return 2
        _begin(settings)
        if not settings.workspace.is_dir():
            logging.getLogger("a3s_agent").error("workspace %s is not a directory", settings.workspace)
            return 2
        from .server import run  # imported here so `--help` stays fast

        return asyncio.run(run(settings))
    return 2


if __name__ == "__main__":
    sys.exit(main())
