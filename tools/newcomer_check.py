#!/usr/bin/env python3
"""Does the README's "Set up on a fresh machine" work on a fresh clone? Runs exactly its two commands.

Usage: python tools/newcomer_check.py [--repo PATH] [--serve-timeout S] [--test-timeout S] [--keep]

The repository (committed state only: it is cloned with git) goes to a temporary directory. The
section's first ```sh block (it starts the server) runs in the background until
`a3s-agent health --address 127.0.0.1:4088` says SERVING, then the server gets SIGTERM and must exit
0. The second block (it runs the tests) runs with a time limit. Each step is reported as PASS or FAIL
with its duration; the exit code is 0 only if both pass. Not a test: it takes minutes. The rest of
the README (its other commands and examples) is run on every test run by tests/test_readme.py,
which reads the README's blocks with `readme_blocks`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Set up on a fresh machine"
SERVER_ADDRESS = "127.0.0.1:4088"
PORTS = (4088, 4089)  # the README's server listens on the default gRPC and HTTP ports
POLL_S = 1.0
STOP_TIMEOUT_S = 20.0


@dataclass
class Step:
    name: str
    passed: bool
    seconds: float
    detail: str


NOT_RUN = re.compile(r"<!-- not run: (.+) -->")


@dataclass(frozen=True)
class Block:
    """A ```sh block of the README: the `## ` section it is in, its text, and why it is not run (the
    reason a `<!-- not run: why -->` line right above it gives; None: it runs)."""

    section: str
    code: str
    not_run: str | None


def readme_blocks(readme: str) -> list[Block]:
    """Every ```sh block of the README, in order."""
    blocks: list[Block] = []
    section, not_run = "", None
    code: list[str] | None = None
    for line in readme.splitlines():
        if code is not None:
            if line == "```":
                blocks.append(Block(section, "\n".join(code) + "\n", not_run))
                code, not_run = None, None
            else:
                code.append(line)
        elif line == "```sh":
            code = []
        else:
            marker = NOT_RUN.fullmatch(line)
            not_run = marker.group(1) if marker else None
            if line.startswith("## "):
                section = line
    return blocks


def readme_commands(readme: str) -> tuple[str, str]:
    """The two ```sh blocks of the set-up section: (start the server, run the tests)."""
    blocks = [b.code.strip() for b in readme_blocks(readme) if b.section == SECTION]
    if len(blocks) != 2:
        raise SystemExit(f"expected 2 ```sh blocks under {SECTION!r}, found {len(blocks)}")
    return blocks[0], blocks[1]


def clone(repo: Path, into: Path) -> Path:
    target = into / "a3s-agent"
    subprocess.run(["git", "clone", "--quiet", str(repo), str(target)], check=True)
    return target


def ports_taken() -> list[int]:
    """Those of PORTS that something already listens on."""
    taken = []
    for port in PORTS:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    return taken


def start(command: str, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """`bash -c command` in its own process group, output to a log file."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def healthy(clone_dir: Path) -> bool:
    binary = clone_dir / ".venv" / "bin" / "a3s-agent"
    if not binary.exists():
        return False
    probe = [str(binary), "health", "--address", SERVER_ADDRESS]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the process group, SIGKILL if it does not end in time; the exit code."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -signal.SIGKILL


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def serve_step(command: str, clone_dir: Path, timeout_s: float) -> Step:
    """Start the server with the README's command, wait for SERVING, stop it: exit 0 expected."""
    taken = ports_taken()
    if taken:
        return Step("serve", False, 0.0, f"ports already in use: {taken}")
    log = clone_dir.parent / "serve.log"
    started = time.monotonic()
    proc = start(command, clone_dir, log)
    try:
        while time.monotonic() - started < timeout_s and proc.poll() is None:
            if healthy(clone_dir):
                up = time.monotonic() - started
                code = stop(proc)
                detail = f"SERVING after {up:.1f} s (install included); SIGTERM -> exit {code}"
                return Step("serve", code == 0, time.monotonic() - started, detail)
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            stop(proc)
    reason = f"exited {proc.returncode}" if proc.returncode is not None else f"not SERVING in {timeout_s:g} s"
    return Step("serve", False, time.monotonic() - started, f"{reason}\n{tail(log)}")


def test_step(command: str, clone_dir: Path, timeout_s: float) -> Step:
    """Run the README's test command to its end (or the time limit)."""
    log = clone_dir.parent / "test.log"
    started = time.monotonic()
    proc = start(command, clone_dir, log)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc)
        return Step("tests", False, time.monotonic() - started, f"over {timeout_s:g} s\n{tail(log)}")
    summary = tail(log, 1) if code == 0 else tail(log)
    return Step("tests", code == 0, time.monotonic() - started, f"exit {code}: {summary}")


def report(steps: list[Step]) -> None:
    for step in steps:
        verdict = "PASS" if step.passed else "FAIL"
        print(f"NEWCOMER {step.name}: {verdict} in {step.seconds:.1f} s - {step.detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository to clone (default: this one)")
    parser.add_argument("--serve-timeout", type=float, default=900.0, help="seconds until SERVING")
    parser.add_argument("--test-timeout", type=float, default=3600.0, help="seconds for the tests")
    parser.add_argument(
        "--keep", action="store_true", help="keep the clone and logs (kept anyway on failure)"
    )
    args = parser.parse_args(argv)
    serve_command, test_command = readme_commands((args.repo / "README.md").read_text())
    workdir = Path(tempfile.mkdtemp(prefix="a3s-newcomer-"))
    clone_dir = clone(args.repo, workdir)
    print(f"NEWCOMER clone: {clone_dir}\n  serve: {serve_command}\n  tests: {test_command}", flush=True)
    steps = [serve_step(serve_command, clone_dir, args.serve_timeout)]
    steps.append(test_step(test_command, clone_dir, args.test_timeout))
    report(steps)
    passed = all(step.passed for step in steps)
    if args.keep or not passed:
        print(f"NEWCOMER clone and logs kept in {workdir}")
    else:
        shutil.rmtree(workdir)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
