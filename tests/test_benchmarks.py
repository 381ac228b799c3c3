"""`python -m benchmarks` (the package benchmarks/) as a developer runs it: from the repository's root,
a real subprocess. Only its cheapest section runs here; the figures are not looked at (no timed
assertions), only that the rows come out, where `--write-docs` puts them in the performance page
and what it keeps there, and that bad options are refused before anything runs."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(
    *args: str, timeout_s: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_a_section_runs_and_prints_its_table() -> None:
    done = bench("--only", "dialect", "--seconds", "0.2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("a3s-agent benchmark, ") and " cores, " in lines[0] and "Python " in lines[0]
    assert [cell.strip() for cell in lines[1].split("|")] == ["", "metric", "value", "target", ""]
    assert any(line.startswith("| detection / one HealthCheck's server time ") for line in lines)
    assert "[dialect done]" in done.stderr


def test_the_delegation_section_plays_the_delegated_and_the_inline_runs() -> None:
    """Its fake plays every conversation to its answer (no run failed, each final request seen),
    and each of its figures comes out, whatever its value."""
    done = bench("--only", "delegation", "--seconds", "0.2")
    assert done.returncode == 0, done.stderr
    rows = {
        cells[1].strip(): cells[2].strip()
        for cells in (line.split("|") for line in done.stdout.splitlines()[3:])
    }
    assert rows["model requests per run: delegated (parent and 2 children) / inline"] == "10 / 7"
    for figure in ("server CPU", "wall time"):
        for kind in ("delegated", "inline", "inline with an extra turn"):
            float(rows[f"{figure} per run: {kind}, median (ms)"])
        assert f"{figure}: overhead per child / one extra model turn" in rows
    parent = int(rows["parent's request at its final turn (bytes)"])
    inline = int(rows["inline run's request at its final turn (bytes)"])
    assert rows["parent's final request / inline's"] == f"{parent / inline:.2f}"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--only", "dialect", "nosuch"), "no section nosuch; the sections: foundation, tools"),
        (("--seconds", "0"), "--seconds: must be above 0, not 0"),
        (("--seconds", "soon"), "--seconds: invalid float value: 'soon'"),
        (("--peer", "opencode", "--runs", "-1"), "--runs: must be above 0, not -1"),
        (("--peer", "opencode", "--only", "start", "dialect"), "takes start, task, concurrent, not dialect"),
        (("--peer", "opencode", "--only", "start", "--write-docs"), "from all its phases: drop --only"),
    ],
)
def test_bad_options_are_refused_naming_what_is_wrong(args: tuple[str, ...], named: str) -> None:
    done = bench(*args, timeout_s=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert named in done.stderr and done.stdout == ""
    assert "done]" not in done.stderr  # nothing ran


SANDBOX_KEPT = """## sandbox

Measured long ago; kept as it was.

| metric | value | target |
|---|---|---|
| a figure | 1 | |
"""


def test_write_docs_rewrites_the_sections_that_ran_and_keeps_the_others(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    page.write_text(
        "# Performance\n\nAn introduction edited by hand.\n\n## dialect\n\nOLD FIGURES\n\n"
        f"## gone\n\nA section no longer measured.\n\n{SANDBOX_KEPT}"
    )
    done = bench("--only", "dialect", "--seconds", "0.2", "--write-docs", str(page))
    assert done.returncode == 0, done.stderr
    assert f"[{page}: dialect written]" in done.stderr
    header, *sections = page.read_text().split("\n## ")
    assert header.startswith("# Performance\n") and "An introduction" not in header
    assert "[Benchmarks](contributing/benchmarks.md)" in header  # the method, where d-docs includes it
    assert [section.split("\n", 1)[0] for section in sections] == ["dialect", "sandbox"]  # their order
    assert f"## {sections[1]}" == SANDBOX_KEPT
    dialect = sections[0].splitlines()
    machine = f"{os.cpu_count()} cores, .+, {platform.system()} {re.escape(platform.release())}, Python "
    measured = (
        rf"Measured \d{{4}}-\d\d-\d\d on {machine}{platform.python_version()}; `--seconds 0.2`; commit \w+"
    )
    assert re.fullmatch(measured + r"( with uncommitted changes)?\.", dialect[2]), dialect[2]
    assert [cell.strip() for cell in dialect[4].split("|")] == ["", "metric", "value", "target", ""]
    assert any(line.startswith("| detection / one HealthCheck's server time ") for line in dialect)


def test_write_docs_fills_the_page_as_committed_before_any_run(tmp_path: Path) -> None:
    """The committed page, with no section yet ("Nothing measured yet"), takes a first one."""
    page = tmp_path / "performance.md"
    page.write_text((ROOT / "docs" / "performance.md").read_text().split("\n## ")[0])
    done = bench("--only", "dialect", "--seconds", "0.2", "--write-docs", str(page))
    assert done.returncode == 0, done.stderr
    assert "\n## dialect\n" in page.read_text() and "Nothing measured yet" not in page.read_text()


def test_a_skipped_section_keeps_its_last_figures_on_the_page(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "pgserver.py").write_text('raise ImportError("hidden by the test")\n')
    without_pgserver = {"PYTHONPATH": str(hidden)}
    page, fresh = tmp_path / "performance.md", tmp_path / "fresh.md"
    page.write_text("# Performance\n\n## replicas\n\nLAST FIGURES\n")
    for target in (page, fresh):
        done = bench("--only", "replicas", "--write-docs", str(target), env=without_pgserver, timeout_s=60)
        assert done.returncode == 0, done.stderr
        assert "| skipped: pgserver (the test extra) is not installed |" in done.stdout
        assert f"[{target}: no section written]" in done.stderr
    assert page.read_text().endswith("\n## replicas\n\nLAST FIGURES\n")
    assert fresh.read_text().endswith(
        "\n## replicas\n\nNot measured yet: pgserver (the test extra) is not installed.\n"
    )


def test_write_docs_with_the_peer_needs_the_peer(tmp_path: Path) -> None:
    """Without OpenCode (none installed in this HOME, no npm on PATH) the comparison would be our
    side alone: the page's is not replaced by it."""
    done = bench(
        "--peer",
        "opencode",
        "--write-docs",
        str(tmp_path / "page.md"),
        env={"HOME": str(tmp_path), "PATH": str(tmp_path)},
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "needs OpenCode, which cannot run here: npm is not on PATH" in done.stderr
    assert not (tmp_path / "page.md").exists()
