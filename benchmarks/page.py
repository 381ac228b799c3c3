"""The performance page of the docs (docs/performance.md), which `--write-docs` keeps: one section
per benchmark section, each with when, on what and on which code it was measured."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from a3s_agent.tools.atomic import write_atomically

from .common import ROOT
from .report import Skipped, Table, machine, today

PAGE = ROOT / "docs" / "performance.md"

_HEADER = """# Performance

<!-- Written by `python -m benchmarks --write-docs` (benchmarks/page.py): edits by hand are lost. -->

The latest figures of each section of the benchmark (`python -m benchmarks`, the package
`benchmarks/`). Each section starts a3s-agent as real processes on 127.0.0.1, with a fake model that
answers at once or after a set latency, and measures it beside a baseline taken on the same machine
in the same run (a bare gRPC server, the code before a change, a direct client, a peer), in rounds
that alternate between them, and reports medians. The figures to judge are the ratios; times and
rates are there for scale and move with the machine and its load. What each section runs, and how:
[Benchmarks](contributing/benchmarks.md). Each section names when, on what and on which code it was
measured: a run with `--only` rewrites those sections and keeps the others.
"""
_NOTHING_YET = "Nothing measured yet: `python -m benchmarks --write-docs` fills this page."
_HEADING = re.compile(r"^## (\S+)[ \t]*$", re.MULTILINE)


def sections_of(page: str) -> dict[str, str]:
    """The sections of a performance page, by name: each from its `## name` heading to the next."""
    found = list(_HEADING.finditer(page))
    ends = [match.start() for match in found[1:]] + [len(page)] * bool(found)
    return {match.group(1): page[match.start() : end].strip() for match, end in zip(found, ends, strict=True)}


def code_version() -> str:
    """The commit measured, and whether the code had changes not committed ("" outside git)."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        changed = _git("status", "--porcelain", "--", "a3s_agent", "benchmarks")
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f"commit {commit}" + (" with uncommitted changes" if changed else "")


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _section(name: str, table: Table, options: str) -> str:
    measured = "; ".join(part for part in (f"`{options}`", code_version()) if part)
    return f"## {name}\n\nMeasured {today()} on {machine()}; {measured}.\n\n{table.markdown()}"


def write_page(
    path: Path, results: Mapping[str, Table | Skipped], order: Sequence[str], options: str
) -> list[str]:
    """Writes `results` (measured with `options`) into the page at `path`, its sections in `order`:
    the page's other sections stay as they were, and so does a skipped section's last measurement;
    a section whose name is not in `order` (no longer measured) is dropped. Returns the names of the
    sections written anew."""
    sections = sections_of(path.read_text()) if path.exists() else {}
    written = []
    for name, result in results.items():
        if isinstance(result, Table):
            sections[name] = _section(name, result, options)
            written.append(name)
        elif name not in sections:
            sections[name] = f"## {name}\n\nNot measured yet: {result}."
    body = "\n\n".join(sections[name] for name in order if name in sections) or _NOTHING_YET
    write_atomically(path, f"{_HEADER}\n{body}\n".encode())
    return written
