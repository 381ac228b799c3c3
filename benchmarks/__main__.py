"""`python -m benchmarks`: the command line (see README.md beside this file)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from . import (
    a2a,
    checkpoints,
    cpu,
    cron,
    delegation,
    faces,
    generation,
    hardening,
    lsp,
    memory,
    replicas,
    server,
    startup,
    telemetry,
    tool_calls,
)
from .page import PAGE, write_page
from .report import Row, Skipped, Table, machine, rows_table, today

SECTIONS: dict[str, Callable[[float, Path], Awaitable[list[Row]]]] = {
    "foundation": server.bench_foundation,
    "tools": tool_calls.bench_tools,
    "agent": generation.bench_agent,
    "context": generation.bench_context,
    "control": generation.bench_control,
    "http": faces.bench_http,
    "security": hardening.bench_security,
    "sizes": hardening.bench_sizes,
    "flood": hardening.bench_flood,
    "durability": server.bench_durability,
    "mcp": tool_calls.bench_mcp,
    "lsp": lsp.bench_lsp,
    "acp": faces.bench_acp,
    "replicas": replicas.bench_replicas,
    "memory": memory.bench_memory,
    "dialect": faces.bench_dialect,
    "sandbox": tool_calls.bench_sandbox,
    "cron": cron.bench_cron,
    "delegation": delegation.bench_delegation,
    "task_cpu": cpu.bench_task_cpu,
    "turn_cpu": cpu.bench_turn_cpu,
    "first": startup.bench_first,
    "checkpoints": checkpoints.bench_checkpoints,
    "telemetry": telemetry.bench_telemetry,
    "a2a": a2a.bench_a2a,
}
PEER_SECTION = "opencode"
"""The performance page's section of `--peer opencode`, after the others."""


async def run_sections(names: Sequence[str], seconds: float) -> dict[str, Table | Skipped]:
    """Each section of `names` in a workspace of its own: its table, or why it was skipped."""
    results: dict[str, Table | Skipped] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            workspace = Path(tmp) / name
            workspace.mkdir()
            try:
                results[name] = rows_table(await SECTIONS[name](seconds, workspace))
            except Skipped as skipped:
                results[name] = skipped
            print(f"[{name} done]", file=sys.stderr, flush=True)
    return results


def one_table(results: Mapping[str, Table | Skipped]) -> Table:
    """The sections' rows in one table, as the terminal shows them."""
    rows: list[tuple[str, ...]] = []
    for name, result in results.items():
        rows += [(name, f"skipped: {result}", "")] if isinstance(result, Skipped) else result.rows
    return Table(("metric", "value", "target"), rows)


def _positive(kind: type[float] | type[int]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid float value"
    return parse


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of a3s-agent, as ratios against baselines measured in the same run "
        "(benchmarks/README.md).",
    )
    parser.add_argument(
        "--seconds", type=_positive(float), default=5.0, help="duration of each throughput run"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        metavar="NAME",
        help=f"sections to run: {', '.join(SECTIONS)} (with --peer: its phases start, task, concurrent)",
    )
    parser.add_argument(
        "--peer", choices=["opencode"], help="compare with a peer (benchmarks/peer_opencode.py)"
    )
    parser.add_argument("--runs", type=_positive(int), default=5, help="runs of each side with --peer")
    parser.add_argument(
        "--write-docs",
        nargs="?",
        const=PAGE,
        type=Path,
        metavar="PAGE",
        help="also write the results into the performance page (default docs/performance.md), "
        "replacing the sections that ran and keeping the others",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = _arguments()
    args = parser.parse_args(argv)
    if args.peer:
        from . import peer_opencode as peer  # psutil, from the test extra

        if unknown := sorted(set(args.only) - set(peer.PHASES)):
            parser.error(f"--peer opencode --only takes {', '.join(peer.PHASES)}, not {', '.join(unknown)}")
        if args.write_docs and args.only:
            parser.error("--write-docs writes the opencode section from all its phases: drop --only")
        if args.write_docs and (missing := peer.unavailable()):
            parser.error(
                f"--write-docs with --peer opencode needs OpenCode, which cannot run here: {missing}"
            )
        table = asyncio.run(peer.run(args.runs, phases=args.only or peer.PHASES))
        results: dict[str, Table | Skipped] = {PEER_SECTION: table}
        options = f"--peer opencode --runs {args.runs}"
        print(f"a3s-agent vs OpenCode {peer.OPENCODE_VERSION}, {today()}, {machine()}")
    else:
        if unknown := sorted(set(args.only) - set(SECTIONS)):
            parser.error(f"--only: no section {', '.join(unknown)}; the sections: {', '.join(SECTIONS)}")
        names = [name for name in SECTIONS if not args.only or name in args.only]
        results = asyncio.run(run_sections(names, args.seconds))
        table = one_table(results)
        options = f"--seconds {args.seconds:g}"
        print(f"a3s-agent benchmark, {today()}, {machine()}")
    print(table.markdown())
    if args.write_docs:
        written = write_page(args.write_docs, results, [*SECTIONS, PEER_SECTION], options)
        print(f"[{args.write_docs}: {', '.join(written) or 'no section'} written]", file=sys.stderr)


if __name__ == "__main__":
    main()
