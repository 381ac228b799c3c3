"""`a3s-agent sandbox check`: the mechanism this machine gives, and its policy tried for real.

In a throwaway workspace holding a planted data dir and another session's workspace (so the
hidden paths lie inside a tree the command may write, the hard case), commands run exactly as a
tool's do (run_process, a containment scope) and try: to run at all, to read the planted secrets,
to write outside the workspace directly and through a symlink, to reach a loopback TCP listener,
to see the server process; with a network of allow:..., to reach the proxy (which refuses a host
not on the list). Each check passes when the sandbox decides as the settings say; what a
mechanism cannot do (Landlock: no PID namespace, no entry made beside a hidden path) is a `limit`
line, shown but not failed.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ...config import SandboxSettings
from ..process import run_process
from . import Place, Sandbox, activate, deactivate, network_problem

SECRET = "a3s-sandbox-check-secret"
_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str
    limit: bool = False  # a known limit of the mechanism: reported, never failed

    @property
    def line(self) -> str:
        return f"{'limit' if self.limit else 'pass' if self.passed else 'FAIL'} {self.name}: {self.detail}"


def self_test(settings: SandboxSettings) -> tuple[Sandbox, list[Check]]:
    """The sandbox these settings give, and the checks run under it (none when it is unavailable)."""
    with tempfile.TemporaryDirectory(prefix="a3s-sandbox-check-") as temp:
        root = Path(os.path.realpath(temp))
        workspace, outside = root / "workspace", root / "outside"
        data_dir, other = workspace / ".server-data", workspace / "other-session"
        for directory in (workspace, workspace / "src", outside, data_dir, other):
            directory.mkdir()
        (data_dir / "sessions.db").write_text(SECRET)
        (other / "notes.txt").write_text(SECRET)
        sandbox = Sandbox(settings, data_dir=data_dir, workspaces=lambda: [str(workspace), str(other)])
        if sandbox.mechanism in ("", "off") or network_problem(sandbox.mechanism, sandbox.network()):
            return sandbox, []
        activate(sandbox)
        try:
            return sandbox, asyncio.run(_checks(sandbox, workspace, outside, data_dir, other))
        finally:
            deactivate(sandbox)


Runner = Callable[..., Awaitable[tuple[int, str]]]


async def _checks(
    sandbox: Sandbox, workspace: Path, outside: Path, data_dir: Path, other: Path
) -> list[Check]:
    try:
        return await _tried(sandbox, workspace, outside, data_dir, other)
    finally:
        await sandbox.stop()


async def _tried(
    sandbox: Sandbox, workspace: Path, outside: Path, data_dir: Path, other: Path
) -> list[Check]:
    place = Place(workspace, "sandbox-check")

    async def run(*argv: str) -> tuple[int, str]:
        result = await run_process(argv, cwd=workspace, place=place, timeout_s=_TIMEOUT_S)
        return result.exit_code, result.output.strip()

    landlock = sandbox.mechanism == "landlock"
    checks = []
    code, said = await run("sh", "-c", "echo ok > src/made-here && cat src/made-here")
    checks.append(Check("run a command, write in the workspace", code == 0 and said == "ok", said[-200:]))
    code, said = await run("sh", "-c", "echo ok > made-here && cat made-here")
    if landlock:
        said = "Landlock cannot let a command make entries in a directory that holds a hidden path"
    checks.append(Check("make a file beside a hidden path", code == 0, said[-200:], limit=landlock))
    planted = (
        ("the server's data dir", data_dir / "sessions.db"),
        ("another session's workspace", other / "notes.txt"),
    )
    for name, secret in planted:
        code, said = await run("cat", str(secret))
        checks.append(
            Check(f"read a planted secret in {name}", SECRET not in said, said[-200:] or f"exit {code}")
        )
    target = outside / "written"
    await run("sh", "-c", f"echo x > {shlex.quote(str(target))}")
    checks.append(Check("write outside the workspace", not target.exists(), f"{target} not created"))
    (workspace / "link").symlink_to(outside)
    await run("sh", "-c", "echo x > link/through-symlink")
    linked = outside / "through-symlink"
    checks.append(
        Check("write outside through a symlink made inside", not linked.exists(), f"{linked} not created")
    )
    checks.append(await _connection(sandbox, run))
    if sandbox.network().startswith("allow:"):
        checks.append(await _proxy(run))
    code, said = await run("cat", f"/proc/{os.getpid()}/environ")
    checks.append(Check("read the server's environment", "PATH=" not in said, said[-200:] or f"exit {code}"))
    code, said = await run("kill", "-0", str(os.getpid()))
    weak = sandbox.weakness is not None and code == 0
    if weak:
        said = str(sandbox.weakness)
    checks.append(Check("signal the server", code != 0, said[-200:] or f"exit {code}", weak))
    code, said = await run("cat", f"/proc/{os.getpid()}/cmdline")
    if landlock:
        said = "its command line is readable: Landlock has no PID namespace"
    checks.append(
        Check("see the server's process", "a3s" not in said, said[-200:] or f"exit {code}", landlock)
    )
    return checks


async def _connection(sandbox: Sandbox, run: Runner) -> Check:
    """A connection to a loopback listener of this process: refused unless the network is on."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code, said = await run(
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import socket; socket.create_connection(('127.0.0.1', {port}), 5)",
        )
    network = sandbox.network()
    if network == "on":
        return Check(
            "connect to a loopback port (network on: allowed)", code == 0, said[-200:] or "connected"
        )
    detail = said.splitlines()[-1][-200:] if said else f"exit {code}"
    return Check(f"connect to a loopback port (network {network})", code != 0, detail)


async def _proxy(run: Runner) -> Check:
    """Through the proxy its environment names, a request for a host on no list: the proxy's 403."""
    _, said = await run(
        sys.executable,
        "-I",
        "-S",
        "-c",
        "import urllib.request as u\ntry: u.urlopen('http://not-on-the-list.invalid/', timeout=10)\n"
        "except Exception as e: print(e)",
    )
    refused = "not one of the hosts the sandbox allows" in said
    return Check("reach the network proxy, which refuses a host not on the list", refused, said[-200:])


def report(settings: SandboxSettings) -> tuple[list[str], bool]:
    """The lines `sandbox check` prints, and whether everything passed."""
    sandbox, checks = self_test(settings)
    mechanism = sandbox.mechanism
    lines = [
        f"mechanism: {mechanism or 'unavailable'} (asked for {settings.mechanism}), network {sandbox.network()}"
    ]
    if not mechanism:
        lines.append(f"FAIL no sandbox works here: {sandbox.problem}")
        return lines, False
    if mechanism == "off":
        lines.append("FAIL the sandbox is off (--sandbox off): commands would run unsandboxed")
        return lines, False
    problem = network_problem(mechanism, sandbox.network())
    if problem:
        lines.append(f"FAIL {problem}")
        return lines, False
    lines += [check.line for check in checks]
    return lines, all(check.passed or check.limit for check in checks)
