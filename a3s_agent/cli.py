"""The `a3s-agent` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from . import __version__
from .config import ConfigError, settings_from


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="a3s-agent", description="A coding agent served over gRPC.")
    parser.add_argument("--version", action="version", version=f"a3s-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--listen", help="HOST:PORT to listen on (env LISTEN_ADDR; default 127.0.0.1:4088)")
    serve.add_argument(
        "--http-listen",
        help="HOST:PORT for REST, server-sent events, WebSocket and /healthz, or 'off'"
        " (env A3S_HTTP_LISTEN; default 127.0.0.1:4089)",
    )
    serve.add_argument(
        "--workspace", help="the workspace directory (env WORKSPACE; default: current directory)"
    )
    serve.add_argument(
        "--data-dir", help="where sessions are stored (env A3S_DATA_DIR; default <workspace>/.a3s)"
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (env A3S_LOG_LEVEL; default INFO)")
    serve.add_argument("--max-sessions", type=int, help="most sessions held at once (env A3S_MAX_SESSIONS)")
    serve.add_argument(
        "--auth-token",
        help="require 'authorization: Bearer TOKEN' on every call but health checks (env A3S_AUTH_TOKEN)",
    )
    serve.add_argument(
        "--auth-token-file",
        help="read the bearer token from this file (env A3S_AUTH_TOKEN_FILE, or the token in A3S_AUTH_TOKEN)",
    )
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback address without a token (env A3S_ALLOW_UNAUTHENTICATED=1)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        help="a browser Origin the HTTP face accepts, e.g. https://app.example; repeatable"
        " (env A3S_ALLOWED_ORIGINS, comma-separated; default none)",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="a Host name the HTTP face accepts besides its own address; repeatable (env A3S_ALLOWED_HOSTS)",
    )
    serve.add_argument("--tls-cert", help="PEM certificate chain for both listeners (env A3S_TLS_CERT)")
    serve.add_argument("--tls-key", help="PEM private key for both listeners (env A3S_TLS_KEY)")
    serve.add_argument(
        "--workspace-root",
        help="session workspaces must lie inside this directory (env A3S_WORKSPACE_ROOT; default the workspace)",
    )
    serve.add_argument(
        "--trust-workspace-skills",
        action="store_true",
        help="let skills in <workspace>/.a3s/skills turn their allowed-tools into allow rules"
        " (env A3S_TRUST_WORKSPACE_SKILLS=1)",
    )
    serve.add_argument(
        "--skills-dir",
        action="append",
        default=[],
        help="a directory of skills; repeatable (env A3S_SKILL_DIRS)",
    )
    serve.add_argument(
        "--coven-gateway",
        help="also connect to this coven gateway (HOST:PORT) as an agent (env A3S_COVEN_GATEWAY)",
    )
    coven = commands.add_parser("coven", help="connect to a coven gateway as an agent")
    coven.add_argument("--gateway", required=True, help="HOST:PORT of the gateway")
    coven.add_argument("--name", help="the agent's name (default a3s-agent@HOSTNAME)")
    coven.add_argument(
        "--agent-id", help="a fixed agent id (default: one made once and kept in the data dir)"
    )
    coven.add_argument(
        "--workspace", help="the workspace directory (env WORKSPACE; default: current directory)"
    )
    coven.add_argument(
        "--data-dir", help="where sessions are stored (env A3S_DATA_DIR; default <workspace>/.a3s)"
    )
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
        sub.add_argument("--relay-dir", help="holds outbox/, inbox/ and sessions.json (env A3S_RELAY_DIR)")
        sub.add_argument(
            "--wait-timeout", type=float, default=3600.0, help="seconds to wait for each reply (default 3600)"
        )
    health = commands.add_parser("health", help="exit 0 when a server answers SERVING (for HEALTHCHECK)")
    health.add_argument("--address", default="127.0.0.1:4088", help="HOST:PORT of the server")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer")
    return parser


def _coven(args: argparse.Namespace) -> int:
    """The agent alone, talking only to the gateway (no gRPC or HTTP listener)."""
    from .faces.coven import default_name, run_coven_agent
    from .runtime import Runtime
    from .tools.builtin import builtin_registry

    try:
        settings = settings_from(workspace=args.workspace, data_dir=args.data_dir)
    except ConfigError as exc:
        print(f"a3s-agent: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def main() -> int:
        runtime = Runtime(settings, registry=builtin_registry())
        await runtime.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            name = args.name or default_name()
            return await run_coven_agent(runtime, args.gateway, name=name, agent_id=args.agent_id, stop=stop)
        finally:
            await runtime.close()

    return asyncio.run(main())


def _relay(args: argparse.Namespace) -> int:
    import os

    from .llm.relay import RelayTiming
    from .relay_cli import relay_new, relay_resume

    relay_dir = args.relay_dir or os.environ.get("A3S_RELAY_DIR")
    if not relay_dir:
        print("a3s-agent relay: give --relay-dir DIR or set A3S_RELAY_DIR", file=sys.stderr)
        return 2
    timing = RelayTiming(wait_timeout_s=args.wait_timeout)
    if args.relay_command == "new":
        return relay_new(args.task, workspace=Path(args.workspace), relay_dir=Path(relay_dir), timing=timing)
    return relay_resume(relay_dir=Path(relay_dir), handle=args.handle, timing=timing)


def _health(address: str, timeout_s: float) -> int:
    """Ask grpc.health.v1 for the server's overall status."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
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


def _ops(file: Path, workspace: Path, policy: str) -> int:
    """Print the events message; exit 1 when the message itself is invalid, 0 otherwise."""
    import json

    from .core.errors import AgentError
    from .spaces import run_operations_file

    try:
        result = asyncio.run(run_operations_file(file, workspace.resolve(), policy))
    except (AgentError, OSError) as exc:
        print(f"a3s-agent ops: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "health":
        return _health(args.address, args.timeout)
    if args.command == "relay":
        return _relay(args)
    if args.command == "coven":
        return _coven(args)
    if args.command == "ops":
        return _ops(Path(args.file), Path(args.workspace), args.policy)
    if args.command == "serve":
        try:
            settings = settings_from(
                listen=args.listen,
                http_listen=args.http_listen,
                workspace=args.workspace,
                data_dir=args.data_dir,
                log_level=args.log_level,
                max_sessions=args.max_sessions,
                skills_dirs=args.skills_dir,
                auth_token=args.auth_token,
                coven_gateway=args.coven_gateway,
                allow_unauthenticated=args.allow_unauthenticated,
                allowed_origins=args.allowed_origin,
                allowed_hosts=args.allowed_host,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                trust_workspace_skills=args.trust_workspace_skills,
                workspace_root=args.workspace_root,
            )
        except ConfigError as exc:
            print(f"a3s-agent: {exc}", file=sys.stderr)
            return 2
        logging.basicConfig(
            level=settings.log_level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        if not settings.workspace.is_dir():
            logging.getLogger("a3s_agent").error("workspace %s is not a directory", settings.workspace)
            return 2
        from .server import run  # imported here so `--help` stays fast

        return asyncio.run(run(settings))
    return 2


if __name__ == "__main__":
    sys.exit(main())
