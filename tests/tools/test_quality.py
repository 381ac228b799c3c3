"""format_code and lint_code against real ruff, shfmt and shellcheck on real files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools import quality
from a3s_agent.tools.process import find_binary
from a3s_agent.tools.quality import TOOLS
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry

ONLY_PYFLAKES = '[tool.ruff.lint]\nselect = ["F"]\n'


async def call(workspace: Path, name: str, **arguments: Any) -> ToolOutput:
    return await ToolRegistry(TOOLS).run(name, json.dumps(arguments), ToolContext(workspace=workspace))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


# --- format_code ---------------------------------------------------------------------------


async def test_format_rewrites_python_file_and_returns_diff(tmp_path: Path) -> None:
    source = write(tmp_path / "src" / "app.py", "x=1\ny = [1,\n  2]\n")
    result = await call(tmp_path, "format_code", path="src/app.py")
    assert result.success, result.error
    assert source.read_text() == "x = 1\ny = [1, 2]\n"
    assert "--- a/src/app.py" in result.output and "+++ b/src/app.py" in result.output
    assert "-x=1\n" in result.output and "+x = 1\n" in result.output
    assert result.metadata["changed"] is True and result.metadata["formatter"] == "ruff"
    assert entries(source.parent) == ["app.py"]  # no temporary file left behind


async def test_format_check_shows_diff_without_touching_file(tmp_path: Path) -> None:
    source = write(tmp_path / "app.py", "print( 'hi' )\n")
    before = source.stat().st_mtime_ns
    result = await call(tmp_path, "format_code", path="app.py", check=True)
    assert result.success and result.metadata["changed"] is True
    assert "would be reformatted" in result.output and '+print("hi")' in result.output
    assert source.read_text() == "print( 'hi' )\n" and source.stat().st_mtime_ns == before


async def test_format_formatted_file_says_so(tmp_path: Path) -> None:
    write(tmp_path / "ok.py", "x = 1\n")
    result = await call(tmp_path, "format_code", path="ok.py")
    assert result.success and result.metadata["changed"] is False
    assert "already formatted" in result.output


async def test_format_honours_workspace_ruff_config(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.ruff.format]\nquote-style = "single"\n')
    result = await call(tmp_path, "format_code", content='x = "a"\n', language="python")
    assert result.success
    assert "x = 'a'" in result.output


async def test_format_shell_with_shfmt_keeps_file_mode(tmp_path: Path) -> None:
    script = write(tmp_path / "run.sh", 'if [ -n "$1" ];then\necho hi\nfi\n')
    script.chmod(0o755)
    result = await call(tmp_path, "format_code", path="run.sh")
    assert result.success and result.metadata["formatter"] == "shfmt"
    assert script.read_text() == 'if [ -n "$1" ]; then\n\techo hi\nfi\n'
    assert script.stat().st_mode & 0o777 == 0o755


async def test_format_language_overrides_extension(tmp_path: Path) -> None:
    script = write(tmp_path / "deploy", "if true;then\necho ok\nfi\n")
    result = await call(tmp_path, "format_code", path="deploy", language="shell")
    assert result.success, result.error
    assert script.read_text() == "if true; then\n\techo ok\nfi\n"


async def test_format_content_returns_formatted_text_and_diff(tmp_path: Path) -> None:
    result = await call(tmp_path, "format_code", content="def f( a ):\n  return a", language="python")
    assert result.success
    assert "def f(a):\n    return a\n" in result.output
    assert "-def f( a ):" in result.output and "\\ No newline at end of file" in result.output
    assert entries(tmp_path) == []


async def test_format_content_check_gives_only_the_diff(tmp_path: Path) -> None:
    result = await call(tmp_path, "format_code", content="x=1\n", language="python", check=True)
    assert result.success
    assert result.output.startswith("The content would be reformatted by ruff")
    assert "Formatted content" not in result.output and "+x = 1" in result.output


async def test_format_syntax_error_fails_with_formatter_message(tmp_path: Path) -> None:
    source = write(tmp_path / "bad.py", "def f(:\n    pass\n")
    result = await call(tmp_path, "format_code", path="bad.py")
    assert not result.success
    assert "ruff failed" in result.error and "bad.py:1:" in result.error
    assert str(tmp_path) not in result.error  # paths shown relative to the workspace
    assert source.read_text() == "def f(:\n    pass\n"


async def test_format_unsupported_extension_names_supported_languages(tmp_path: Path) -> None:
    write(tmp_path / "app.rb", "puts 'hi'\n")
    result = await call(tmp_path, "format_code", path="app.rb")
    assert not result.success
    assert "no formatter for '.rb' files" in result.error and "ruff" in result.error


async def test_format_missing_prettier_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hide_binary(monkeypatch, "prettier")
    write(tmp_path / "app.ts", "let x:number=1\n")
    result = await call(tmp_path, "format_code", path="app.ts")
    assert not result.success
    assert "install prettier: npm install -g prettier" in result.error


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"path": "a.py", "content": "x", "language": "python"},
        {"content": "x=1"},
        {"path": "a.py", "x": 1},
    ],
)
async def test_format_rejects_invalid_argument_combinations(
    tmp_path: Path, arguments: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgument):
        await call(tmp_path, "format_code", **arguments)


async def test_format_refuses_paths_outside_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    outside = write(tmp_path / "outside.py", "x=1\n")
    (workspace).mkdir()
    (workspace / "link.py").symlink_to(outside)
    for path in ("../outside.py", str(outside), "link.py"):
        result = await call(workspace, "format_code", path=path)
        assert not result.success and "outside the workspace" in result.error
    assert outside.read_text() == "x=1\n"


async def test_format_missing_file(tmp_path: Path) -> None:
    result = await call(tmp_path, "format_code", path="nope.py")
    assert not result.success and "nope.py does not exist" in result.error


# --- lint_code -----------------------------------------------------------------------------


async def test_lint_reports_unused_import(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", ONLY_PYFLAKES)
    write(tmp_path / "pkg" / "mod.py", "import os\n\nprint(1)\n")
    result = await call(tmp_path, "lint_code", path="pkg/mod.py")
    assert result.success
    assert result.output.splitlines()[0] == "pkg/mod.py:1:8: F401 `os` imported but unused"
    assert result.metadata["count"] == 1 and result.metadata["fixable"] == 1
    [diagnostic] = result.metadata["diagnostics"]
    assert diagnostic == {
        "file": "pkg/mod.py",
        "line": 1,
        "col": 8,
        "code": "F401",
        "message": "`os` imported but unused",
        "fixable": True,
    }
    assert "fix=true" in result.output


async def test_lint_fix_applies_fixes_and_reports_what_remains(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", ONLY_PYFLAKES)
    source = write(tmp_path / "app.py", "import os\n\nprint(undefined_name)\n")
    result = await call(tmp_path, "lint_code", path="app.py", fix=True)
    assert result.success
    assert source.read_text() == "\nprint(undefined_name)\n"
    assert result.metadata["fixed"] == 1 and result.metadata["count"] == 1
    assert "app.py:2:7: F821 Undefined name `undefined_name`" in result.output
    assert "fixed 1 problem(s)" in result.output and "1 remain" in result.output


async def test_lint_directory_lists_problems_across_files(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", ONLY_PYFLAKES)
    write(tmp_path / "b.py", "import sys\n")
    write(tmp_path / "a" / "x.py", "def f(:\n")
    write(tmp_path / "clean.py", "print(1)\n")
    result = await call(tmp_path, "lint_code")
    assert result.success
    files = [d["file"] for d in result.metadata["diagnostics"]]
    assert files[0] == "a/x.py" and files[-1] == "b.py" and "clean.py" not in files
    assert any(d["code"] == "invalid-syntax" for d in result.metadata["diagnostics"])
    assert ".ruff_cache" not in entries(tmp_path)


async def test_lint_clean_file_has_no_diagnostics(tmp_path: Path) -> None:
    write(tmp_path / "ok.py", "print(1)\n")
    result = await call(tmp_path, "lint_code", path="ok.py")
    assert result.success
    assert result.metadata["count"] == 0 and result.metadata["diagnostics"] == []
    assert "found 0 problem(s)" in result.output


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_lint_fix_never_changes_files_reached_through_symlink_out_of_workspace(
    tmp_path: Path, sandboxed: bool, request: pytest.FixtureRequest
) -> None:
    if not sandboxed:  # with --sandbox off, the tool's own check of ruff's report is the barrier
        request.getfixturevalue("unsandboxed")
    workspace = tmp_path / "ws"
    outside = write(tmp_path / "elsewhere" / "lib.py", "import os\n")
    write(workspace / "pyproject.toml", ONLY_PYFLAKES)
    write(workspace / "own.py", "import sys\n")
    (workspace / "linked.py").symlink_to(outside)
    listed = await call(workspace, "lint_code")
    assert [d["file"] for d in listed.metadata["diagnostics"]] == ["own.py"]
    fixed = await call(workspace, "lint_code", fix=True)
    if sandboxed:  # ruff does not even see the file outside: only the workspace's are fixed
        assert fixed.success and (workspace / "own.py").read_text() == ""
    else:
        assert not fixed.success and "outside the workspace" in fixed.error
    assert outside.read_text() == "import os\n"


def _hide_binary(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """As on a machine without that tool (shellcheck comes with the test extra; prettier may be around)."""
    monkeypatch.setattr(
        quality, "find_binary", lambda wanted: None if wanted == name else find_binary(wanted)
    )


async def test_lint_shell_script_with_shellcheck(tmp_path: Path) -> None:
    write(tmp_path / "bin" / "go.sh", "#!/bin/bash\necho $1\n")
    result = await call(tmp_path, "lint_code", path="bin/go.sh")
    assert result.success and result.metadata["linter"] == "shellcheck"
    assert result.output.startswith("bin/go.sh:2:6: SC2086 Double quote")
    fix = await call(tmp_path, "lint_code", path="bin/go.sh", fix=True)
    assert not fix.success and "cannot fix" in fix.error


async def test_lint_shell_without_shellcheck_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hide_binary(monkeypatch, "shellcheck")
    write(tmp_path / "go.sh", "echo $1\n")
    result = await call(tmp_path, "lint_code", path="go.sh")
    assert not result.success and "shellcheck is not installed" in result.error


async def test_lint_other_language_names_missing_linter(tmp_path: Path) -> None:
    write(tmp_path / "app.js", "var x\n")
    result = await call(tmp_path, "lint_code", path="app.js")
    assert not result.success
    assert "no linter for app.js" in result.error and "eslint" in result.error


async def test_lint_missing_and_escaping_paths(tmp_path: Path) -> None:
    missing = await call(tmp_path, "lint_code", path="gone.py")
    assert not missing.success and "gone.py does not exist" in missing.error
    escape = await call(tmp_path, "lint_code", path="../")
    assert not escape.success and "outside the workspace" in escape.error


async def test_configuration_symlinked_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    outside = write(tmp_path / "elsewhere" / "ruff.toml", "line-length = 20\n")
    write(workspace / "app.py", "x = 1\n")
    (workspace / "ruff.toml").symlink_to(outside)
    (workspace / ".editorconfig").symlink_to(outside)
    write(workspace / "run.sh", "echo hi\n")
    for name, arguments in (("lint_code", {"path": "app.py"}), ("format_code", {"path": "run.sh"})):
        result = await call(workspace, name, **arguments)
        assert not result.success and "outside the workspace" in result.error


async def test_nearest_ruff_configuration_applies_with_its_relative_paths(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.ruff.lint]\nselect = ["E"]\n')
    write(tmp_path / "pkg" / "ruff.toml", '[lint]\nselect = ["F"]\nper-file-ignores = {"gen/*" = ["F401"]}\n')
    write(tmp_path / "pkg" / "gen" / "out.py", "import os\n")
    write(tmp_path / "pkg" / "mod.py", "import os\n")
    result = await call(tmp_path, "lint_code", path="pkg")
    assert [(d["file"], d["code"]) for d in result.metadata["diagnostics"]] == [("pkg/mod.py", "F401")]
