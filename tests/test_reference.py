"""The reference pages cannot drift from the code: docs/reference/cli.md and environment.md are what
tools/gen_reference.py writes now, and the table they are written from (a3s_agent/variables.py)
holds every A3S_* variable the code reads, and no variable it does not."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from a3s_agent.config import settings_from
from a3s_agent.variables import VARIABLES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "a3s_agent"
TABLE = PACKAGE / "variables.py"
A3S_NAME = re.compile(r"A3S_[A-Z0-9_]*[A-Z0-9]")


def _names_in_code() -> dict[str, set[str]]:
    """Every string literal in the package that is an environment variable's name (a whole A3S_*
    name, or one of the table's), with the files it is in; the table itself, the generated
    protobuf modules and the names a module exports (`__all__`) left out."""
    wanted = set(VARIABLES)
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path == TABLE or "proto" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        exported = {  # names in `__all__` are the module's own names, not variables
            id(element)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
            for element in ast.walk(node.value)
        }
        for node in ast.walk(tree):
            if id(node) in exported:
                continue
            name = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if A3S_NAME.fullmatch(name) or name in wanted:
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("page", ["cli.md", "environment.md"])
def test_the_committed_page_is_what_the_generator_writes(tmp_path: Path, page: str) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_reference.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    committed = ROOT / "docs" / "reference" / page
    assert committed.read_text() == (tmp_path / page).read_text(), (
        f"docs/reference/{page} is stale: run tools/gen_reference.py"
    )


def test_the_table_holds_every_a3s_variable_the_code_reads() -> None:
    missing = {
        name: sorted(files)
        for name, files in _names_in_code().items()
        if name.startswith("A3S_") and name not in VARIABLES
    }
    assert not missing, f"add these to a3s_agent/variables.py, then run tools/gen_reference.py: {missing}"


def test_the_table_names_no_variable_the_code_does_not_read() -> None:
    unread = sorted(set(VARIABLES) - set(_names_in_code()))
    assert not unread, f"a3s_agent/variables.py names variables nothing reads: {unread}"


def test_the_help_names_each_variable_and_the_default_the_server_uses() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "a3s_agent", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "1000"},  # no line breaks inside a note
    ).stdout
    options: dict[str, str] = {}  # each option's usage and help, its lines joined
    option = ""
    for line in shown.split("options:")[1].splitlines():
        if line.startswith("  -"):
            option = line.split()[0]
        options[option] = f"{options.get(option, '')} {line.strip()}"
    used = settings_from(env={})
    assert f"(env LISTEN_ADDR; default {used.listen})" in options["--listen"]
    assert f"(env A3S_HTTP_LISTEN; default {used.http_listen})" in options["--http-listen"]
    assert f"(env A3S_MAX_SESSIONS; default {used.max_sessions})" in options["--max-sessions"]
    assert f"(env A3S_GRACE_SECONDS; default {used.grace_seconds:g})" in options["--grace-seconds"]
    assert "(env A3S_ALLOWED_ORIGINS, comma-separated; default none)" in options["--allowed-origin"]
    assert not used.mcp_http and "(env A3S_MCP_HTTP=1)" in options["--mcp-http"]
