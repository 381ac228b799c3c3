"""Running commands in the workspace: bash command lines and scripts (Python, bash, sh, node)."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .process import ProcessResult, find_binary, run_process
from .registry import RuleSubject, Tool, ToolContext, ToolFailure, ToolOutput, tool
from .sandbox import Place
from .workspace_paths import resolve_in_workspace

DEFAULT_TIMEOUT_MS = 120_000
MAX_TIMEOUT_MS = 600_000
# Room kept under the output limit for the truncation note, so the note itself is never cut.
_NOTE_RESERVE_BYTES = 256
_REDIRECT_HINT = "redirect the output to a file (`command > out.log 2>&1`) and read that with read_file"

ScriptLanguage = Literal["python", "bash", "sh", "node"]
_SCRIPT_SUFFIX: dict[str, str] = {"python": ".py", "bash": ".sh", "sh": ".sh", "node": ".js"}


def _timeout_field() -> Any:
    return Field(default=DEFAULT_TIMEOUT_MS, ge=1, le=MAX_TIMEOUT_MS)


class BashArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1)
    timeout_ms: int = _timeout_field()
    cwd: str = "."


class RunScriptArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    language: ScriptLanguage = "python"
    code: str | None = Field(default=None, description="The script; or give path.")
    path: str | None = None
    args: list[str] = Field(default_factory=list)
    timeout_ms: int = _timeout_field()

    @model_validator(mode="after")
    def _one_source(self) -> RunScriptArgs:
        if (self.code is None) == (self.path is None):
            raise ValueError("give exactly one of code or path")
        return self


@tool("bash", family="command", lane="execute", truncation_hint=_REDIRECT_HINT)
async def bash(args: BashArgs, ctx: ToolContext) -> ToolOutput:
    """Run a command with `bash -c`: tests, builds, package managers. Returns stdout and stderr
    interleaved; a non-zero exit fails the call. To read, find, edit or write files and for git
    use the dedicated tools, not cat/grep/sed/echo. No terminal or stdin: pass flags that keep
    programs from prompting. When the call ends or times out, everything it started is killed,
    servers (`&`) too. Redirect long output to a file and read_file it.
    """
    cwd = resolve_in_workspace(ctx.workspace, args.cwd, field="cwd")
    if not cwd.is_dir():
        raise ToolFailure(f"cwd {args.cwd!r} is not a directory in the workspace")
    result = await _run(ctx, [_interpreter("bash"), "-c", args.command], cwd, args.timeout_ms, ctx.place)
    return command_output(result, args.timeout_ms)


@tool(
    "run_script",
    family="command",
    lane="execute",
    truncation_hint=_REDIRECT_HINT,
    rule_subject=RuleSubject("path", otherwise=RuleSubject("code", "text")),
)
async def run_script(args: RunScriptArgs, ctx: ToolContext) -> ToolOutput:
    """Run a script given as code, or a workspace file's path, with args, in the workspace root;
    results as for bash. Better than bash for a multi-line program. Python is the agent's own.
    """
    interpreter = _interpreter(args.language)
    workspace = ctx.workspace.resolve()
    if args.path is not None:
        script = resolve_in_workspace(ctx.workspace, args.path)
        if not script.is_file():
            raise ToolFailure(f"{args.path} is not a file in the workspace")
        result = await _run(
            ctx, [interpreter, str(script), *args.args], workspace, args.timeout_ms, ctx.place
        )
    else:
        assert args.code is not None  # guaranteed by the model
        with tempfile.TemporaryDirectory(prefix="a3s-script-") as temp:
            script = Path(temp) / f"script{_SCRIPT_SUFFIX[args.language]}"
            script.write_text(args.code, encoding="utf-8")
            place = replace(ctx.place, readable=(Path(temp),))  # the script, outside the workspace
            result = await _run(
                ctx, [interpreter, str(script), *args.args], workspace, args.timeout_ms, place
            )
    output = command_output(result, args.timeout_ms)
    output.metadata["language"] = args.language
    return output


def _interpreter(name: str) -> str:
    if name == "python":
        return sys.executable
    exe = find_binary(name)
    if exe is None:
        raise ToolFailure(f"{name} is not installed on this machine (not found on PATH); install it first")
    return exe


def output_cap(ctx: ToolContext) -> int:
    """The bytes of output a command may give, leaving room for the notes command_output adds."""
    return max(ctx.max_output_bytes - _NOTE_RESERVE_BYTES, 1)


async def _run(ctx: ToolContext, argv: list[str], cwd: Path, timeout_ms: int, place: Place) -> ProcessResult:
    return await run_process(
        argv,
        cwd=cwd,
        place=place,
        extra_env=ctx.env,
        timeout_s=timeout_ms / 1000,
        max_output_bytes=output_cap(ctx),
    )


def command_output(result: ProcessResult, timeout_ms: int) -> ToolOutput:
    """The shape bash and run_script share: output, success from the exit code, and why it failed."""
    output = result.output
    if result.truncated:
        output += f"\n[output truncated: only its start and end are shown; {_REDIRECT_HINT}]"
    if result.timed_out:
        error = f"timed out after {timeout_ms} ms; the process and its children were killed (exit code 124)"
    elif result.exit_code < 0:
        error = f"killed by signal {-result.exit_code}"
    elif result.exit_code != 0:
        error = f"exited with code {result.exit_code}"
    else:
        error = ""
    if error and not result.timed_out:
        error += f"; {result.denial}" if result.denial else ""
    metadata = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "truncated": result.truncated,
        "duration_ms": result.duration_ms,
    }
    return ToolOutput(success=not error, output=output, error=error, metadata=metadata)


TOOLS: list[Tool] = [bash, run_script]
