"""`python -m benchmarks` (the package benchmarks/) as a developer runs it: from the repository's root,
a real subprocess. Only its cheapest section runs here; the figures are not looked at (no timed
assertions), only that the rows come out, and that bad options are refused before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
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


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--only", "dialect", "nosuch"), "no section nosuch; the sections: foundation, tools"),
        (("--seconds", "0"), "--seconds: must be above 0, not 0"),
        (("--seconds", "soon"), "--seconds: invalid float value: 'soon'"),
        (("--peer", "opencode", "--runs", "-1"), "--runs: must be above 0, not -1"),
        (("--peer", "opencode", "--only", "start", "dialect"), "takes start, task, concurrent, not dialect"),
    ],
)
def test_bad_options_are_refused_naming_what_is_wrong(args: tuple[str, ...], named: str) -> None:
    done = bench(*args, timeout_s=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert named in done.stderr and done.stdout == ""
    assert "done]" not in done.stderr  # nothing ran
