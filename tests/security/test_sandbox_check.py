"""`a3s-agent sandbox check`: the operator's self-test of the sandbox this machine gives."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def sandbox_check(*args: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "a3s_agent", "sandbox", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "A3S_SANDBOX": "auto"},
    )
    return done.returncode, done.stdout.splitlines()


def test_auto_takes_bwrap_here_and_passes_every_line() -> None:
    code, lines = sandbox_check()
    assert code == 0, lines
    assert lines[0].startswith("mechanism: bwrap (asked for auto)")
    assert len(lines) >= 9 and all(line.startswith("pass ") for line in lines[1:])


def test_landlock_passes_and_names_what_it_cannot_do() -> None:
    code, lines = sandbox_check("--sandbox", "landlock")
    assert code == 0, lines
    assert lines[0].startswith("mechanism: landlock")
    limits = [line for line in lines[1:] if not line.startswith("pass ")]
    assert [line.split(":")[0] for line in limits] == [
        "limit make a file beside a hidden path",
        "limit see the server's process",
    ]
    assert any(line.startswith("pass read the server's environment") for line in lines)
    assert any(line.startswith("pass read a planted secret in the server's data dir") for line in lines)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--sandbox", "off"), "FAIL the sandbox is off"),
        (
            ("--sandbox", "landlock", "--sandbox-network", "allow:pypi.org"),
            "FAIL the network allow:pypi.org needs bwrap",
        ),
    ],
)
def test_a_policy_that_cannot_hold_fails_the_check(args: tuple[str, ...], said: str) -> None:
    code, lines = sandbox_check(*args)
    assert code == 1 and lines[1].startswith(said), lines
