"""Faces stay faces (a lint, by AST scan): no face reaches through the runtime into its parts, and
the faces that can be (coven, the Agent Spaces routes, the relay CLI, the commands) are given the
application layer, never the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import a3s_agent

PACKAGE = Path(a3s_agent.__file__).parent
FACES = sorted((PACKAGE / "faces").rglob("*.py"))
APPLICATION_ONLY = [
    *sorted((PACKAGE / "faces" / "coven").glob("*.py")),
    PACKAGE / "faces" / "http" / "spaces.py",
    *sorted((PACKAGE / "faces" / "relay").glob("*.py")),
    PACKAGE / "cli.py",
]

# The runtime's parts, which only the application layer may use or change.
RUNTIME_PARTS = frozenset(
    {"agent", "client_tools", "context", "control", "events", "init", "providers", "registry",
     "sessions", "skills", "spaces", "store", "tools", "workspace"}
)  # fmt: skip
RUNTIME_NAMES = frozenset({"runtime", "rt", "_runtime", "_rt"})


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _is_runtime(node: ast.expr) -> bool:
    """`runtime`, `rt`, `self._runtime`, `self._rt`..."""
    if isinstance(node, ast.Name):
        return node.id in RUNTIME_NAMES
    return (
        isinstance(node, ast.Attribute)
        and node.attr in RUNTIME_NAMES
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def runtime_reaches(source: str, name: str) -> list[str]:
    return [
        f"{name}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in RUNTIME_PARTS and _is_runtime(node.value)
    ]


def runtime_imports(source: str, name: str, package: tuple[str, ...]) -> list[str]:
    """Imports of a3s_agent.runtime (absolute, or relative to `package`) in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            if node.module:
                modules = [".".join([*base, node.module])]
            else:
                modules = [".".join([*base, alias.name]) for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [
            f"{name}:{node.lineno}: {module}"
            for module in modules
            if module == "a3s_agent.runtime" or module.startswith("a3s_agent.runtime.")
        ]
    return found


@pytest.mark.parametrize("path", FACES, ids=_name)
def test_no_face_reaches_into_the_runtimes_parts(path: Path) -> None:
    assert runtime_reaches(path.read_text(encoding="utf-8"), _name(path)) == []


@pytest.mark.parametrize("path", APPLICATION_ONLY, ids=_name)
def test_these_faces_are_given_the_application_not_the_runtime(path: Path) -> None:
    package = path.relative_to(PACKAGE.parent).parent.parts
    assert runtime_imports(path.read_text(encoding="utf-8"), _name(path), package) == []


def test_the_scan_finds_what_it_looks_for() -> None:
    """The lint itself: reaches through `self._rt` and `runtime`, and runtime imports of each form."""
    source = (
        "from ...runtime import Runtime\n"
        "from ... import runtime\n"
        "import a3s_agent.runtime.providers\n"
        "from ...app import Application\n"
        "class A:\n"
        "    def f(self, runtime):\n"
        "        return self._rt.sessions, runtime.control.cancel, runtime.settings, self.app.sessions\n"
    )
    assert runtime_reaches(source, "m") == ["m:7: self._rt.sessions", "m:7: runtime.control"]
    assert runtime_imports(source, "m", ("a3s_agent", "faces", "coven")) == [
        "m:1: a3s_agent.runtime",
        "m:2: a3s_agent.runtime",
        "m:3: a3s_agent.runtime.providers",
    ]
