"""Every process the server starts goes through a tool call's sandbox: no module spawns another way.

The package's source is parsed, every name imported resolved (`import subprocess as sp`, `from os
import execv`), and every call of a function that starts a process found. Each must take its argv
from a call scope's `command(...)` (tools/containment.py, which wraps it in the call's sandbox), but
for the sandbox's own probe of its binary (tools/sandbox/bwrap.py, landlock.py), which runs a fixed
command of ours to find out whether the mechanism works, and for the Landlock launcher
(tools/sandbox/launch.py), which runs inside a process so spawned and execs the command once it
has restricted itself. The test doubles (a3s_agent/testing/: fake model servers the tests and the
benchmarks start) are not the server's: the contract "The agent never imports its test doubles"
keeps every agent package from importing them, so they are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import a3s_agent

PACKAGE = Path(a3s_agent.__file__).parent
SPAWNING = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {
        "system", "popen", "fork", "forkpty", "execl", "execle", "execlp", "execlpe", "execv", "execve",
        "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
        "spawnvpe", "posix_spawn", "posix_spawnp",
    },
    "pty": {"fork", "spawn"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "anyio": {"open_process", "run_process"},
    "multiprocessing": {"Process", "Pool"},
}  # fmt: skip
LOOP_SPAWNING = {"subprocess_exec", "subprocess_shell"}  # loop.subprocess_exec(...)
PROBES = {"tools/sandbox/bwrap.py", "tools/sandbox/landlock.py", "tools/sandbox/launch.py"}
TEST_DOUBLES = PACKAGE / "testing"


def _spawns(tree: ast.AST) -> list[tuple[int, str, ast.Call]]:
    """(line, what, call) of every call that starts a process."""
    names: dict[str, tuple[str, str | None]] = {}  # local name -> (module, function or None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in SPAWNING:
                    names[alias.asname or top] = (top, None)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in SPAWNING:
            module = node.module.split(".")[0]
            for alias in node.names:
                names[alias.asname or alias.name] = (module, alias.name)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in LOOP_SPAWNING:
            found.append((node.lineno, func.attr, node))
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module, imported = names.get(func.value.id, ("", "x"))
            if imported is None and func.attr in SPAWNING[module]:
                found.append((node.lineno, f"{module}.{func.attr}", node))
        elif isinstance(func, ast.Name) and func.id in names:
            module, imported = names[func.id]
            if imported in SPAWNING[module]:
                found.append((node.lineno, f"{module}.{imported}", node))
    return found


def _through_scope(call: ast.Call) -> bool:
    """Whether the spawned argv is `<scope>.command(...)`."""
    argv = (
        call.args[0]
        if call.args
        else next((k.value for k in call.keywords if k.arg in ("args", "command")), None)
    )
    return isinstance(argv, ast.Call) and isinstance(argv.func, ast.Attribute) and argv.func.attr == "command"


def test_every_process_is_spawned_through_a_call_scope_of_the_sandbox() -> None:
    outside = []
    spawning_modules = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(TEST_DOUBLES):
            continue
        relative = path.relative_to(PACKAGE).as_posix()
        for line, what, call in _spawns(ast.parse(path.read_text(), str(path))):
            spawning_modules.add(relative)
            if relative not in PROBES and not _through_scope(call):
                outside.append(f"{relative}:{line}: {what} not given a call scope's command(...)")
    assert outside == []
    # The scan finds what it must: the runner, grep's rg and the stdio servers (MCP, LSP) spawn this way.
    assert {"tools/process.py", "tools/code_search.py", "tools/stdio_server.py"} <= spawning_modules


def test_the_scan_finds_every_way_of_spawning() -> None:
    source = """
import subprocess as sp
import os
from asyncio import create_subprocess_exec as spawn
from anyio import open_process
import pty
sp.Popen(["x"])
os.execv("/bin/x", ["x"])
spawn("x")
open_process(scope.command(["x"], cwd, env))
loop.subprocess_exec(factory, "x")
pty.fork()
os.path.join("a", "b")
"""
    found = [(line, what, _through_scope(call)) for line, what, call in _spawns(ast.parse(source))]
    assert found == [
        (7, "subprocess.Popen", False),
        (8, "os.execv", False),
        (9, "asyncio.create_subprocess_exec", False),
        (10, "anyio.open_process", True),
        (11, "subprocess_exec", False),
        (12, "pty.fork", False),
    ]
