"""The benchmark's results: rows and tables as Markdown, and the machine they were measured on."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Row:
    """One figure of a section; `target` is what its ratio should meet, if anything."""

    metric: str
    value: str
    target: str = ""


class Skipped(Exception):
    """A section that cannot run here (a missing package or platform), with the reason."""


@dataclass
class Table:
    """A Markdown table, and notes printed under it."""

    head: tuple[str, ...]
    rows: list[tuple[str, ...]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        cells = [[cell.replace("|", "\\|") for cell in row] for row in [self.head, *self.rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.head))]
        lines = [
            "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells
        ]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n\n".join(["\n".join(lines), *self.notes])


def rows_table(rows: Sequence[Row]) -> Table:
    return Table(("metric", "value", "target"), [(r.metric, r.value, r.target) for r in rows])


def machine() -> str:
    """This machine as a results line names it: cores, CPU model, kernel, Python."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return (
        f"{os.cpu_count()} cores, {model or platform.processor() or platform.machine()}, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def today() -> str:
    return time.strftime("%Y-%m-%d")
