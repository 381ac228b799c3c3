"""The `a3s-agent` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from . import __version__
from .config import settings_from


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="a3s-agent", description="A coding agent served over gRPC.")
    parser.add_argument("--version", action="version", version=f"a3s-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--listen", help="HOST:PORT to listen on (env LISTEN_ADDR; default 0.0.0.0:4088)")
    serve.add_argument(
        "--workspace", help="the workspace directory (env WORKSPACE; default: current directory)"
    )
    serve.add_argument(
        "--data-dir", help="where sessions are stored (env A3S_DATA_DIR; default <workspace>/.a3s)"
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (env A3S_LOG_LEVEL; default INFO)")
    serve.add_argument("--max-sessions", type=int, help="most sessions held at once (env A3S_MAX_SESSIONS)")
    serve.add_argument(
        "--skills-dir",
        action="append",
        default=[],
        help="a directory of skills; repeatable (env A3S_SKILL_DIRS)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        settings = settings_from(
            listen=args.listen,
            workspace=args.workspace,
            data_dir=args.data_dir,
            log_level=args.log_level,
            max_sessions=args.max_sessions,
            skills_dirs=args.skills_dir,
        )
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
