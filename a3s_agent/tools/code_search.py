"""Code search: regex content search over the workspace with ripgrep, streamed and stopped early."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pydantic import BaseModel, ConfigDict, Field

from .containment import tool_call
from .environment import tool_environment
from .process import WatchedChild, find_binary
from .registry import PATH, Tool, ToolContext, ToolFailure, ToolOutput, tool
from .workspace_paths import relative_to_workspace, resolve_in_workspace

_RG_TIMEOUT_S = 60.0
_MAX_COLUMNS = 1000
_STDERR_CAP = 8192
_DIGITS = b"0123456789"


class GrepArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1, description="Rust regex; escape metacharacters: 'foo\\('.")
    path: str = Field(".", description="File or directory.")
    glob: str | None = Field(None, description="Files to search, e.g. '*.py'; '!*.min.js' excludes.")
    case_insensitive: bool = False
    context: int = Field(0, ge=0, le=10, description="Lines shown around each match.")
    max_results: int = Field(200, ge=1, le=5000)


@dataclass
class _Collector:
    """Turns rg's `path NUL line:text` output into `path:line:text` lines, up to max_results matches."""

    max_results: int
    context: int
    lines: list[str] = field(default_factory=list)
    files: set[bytes] = field(default_factory=set)
    matches: int = 0
    truncated: bool = False
    _last_path: bytes = b""
    _trailing_context: int = 0

    def feed(self, raw: bytes) -> bool:
        """Take one line of rg output; False once a match beyond max_results shows up."""
        path, nul, rest = raw.partition(b"\0")
        if not nul:  # "--" between context groups, or a notice such as "binary file matches"
            if self.matches < self.max_results:
                self.lines.append(raw.decode("utf-8", errors="replace"))
            return True
        number = len(rest) - len(rest.lstrip(_DIGITS))
        separator = rest[number : number + 1] or b":"
        is_match = separator == b":"
        if self.matches >= self.max_results:
            if is_match:
                self.truncated = True
                return False
            if path != self._last_path or self._trailing_context >= self.context:
                return True  # context belonging to matches we will not show
            self._trailing_context += 1
        elif is_match:
            self.matches += 1
            self.files.add(path)
            self._last_path = path
        self.lines.append((path + separator + rest).decode("utf-8", errors="replace").removesuffix("\r"))
        return True


class _Lines:
    """Feeds rg's output to the collector a complete line at a time (a WatchedChild sink); once the
    collector has enough, ignores the rest and calls `stop` (kills rg: that ends the search)."""

    def __init__(self, collector: _Collector, stop: Callable[[], None]) -> None:
        self.collector = collector
        self.stop = stop
        self.pending = b""
        self.done = False

    def take(self, chunk: bytes) -> None:
        if self.done:
            return
        if not chunk:  # the end of rg's output
            self.done = True
            if self.pending:
                self.collector.feed(self.pending)
            return
        *complete, self.pending = (self.pending + chunk).split(b"\n")
        for line in complete:
            if not self.collector.feed(line):
                self.done = True
                self.stop()
                return


async def _run_rg(argv: list[str], ctx: ToolContext, collector: _Collector) -> tuple[int, str, bool]:
    """Run rg, streaming its output into the collector; returns (exit code, stderr, timed out)."""
    stderr = bytearray()
    with tool_call(replace(ctx.place, network="off")) as scope:  # rg reads files, never the network
        # Spawned without an await: rg must be the scope's to kill before anything can cancel us.
        cwd, env = ctx.workspace.resolve(), scope.environment(tool_environment(ctx.env))
        proc = subprocess.Popen(  # noqa: ASYNC220
            scope.command(argv, cwd, env),
            bufsize=0,
            cwd=cwd,
            env=env,
            pass_fds=scope.pass_fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        scope.started(proc.pid)
        lines = _Lines(collector, proc.kill)  # the rest of the call is killed by child.end
        child = WatchedChild(
            proc,
            (
                (proc.stdout, lines.take),
                (proc.stderr, lambda chunk: stderr.extend(chunk[: _STDERR_CAP - len(stderr)])),
            ),
            None,
        )
        try:
            ended, _ = await asyncio.wait((child.drained, child.exited), timeout=_RG_TIMEOUT_S)
        finally:
            await child.end(scope)  # after a natural end harmless, after a timeout what ends rg
    message = stderr.decode("utf-8", errors="replace").strip()
    return proc.returncode, message.removeprefix("rg: "), len(ended) < 2


def _rg_argv(rg: str, args: GrepArgs, target: str) -> list[str]:
    argv = [rg, "--no-config", "--null", "--line-number", "--with-filename", "--no-heading"]
    argv += ["--color", "never", "--max-columns", str(_MAX_COLUMNS), "--max-columns-preview"]
    if args.case_insensitive:
        argv.append("--ignore-case")
    if args.context:
        argv += ["--context", str(args.context)]
    if args.glob:
        argv += ["--glob", args.glob]
    argv += ["-e", args.pattern]
    # Without a path rg searches the working directory and prints paths without "./".
    return argv if target == "." else [*argv, "--", target]


def _failure_message(stderr: str) -> str:
    if "regex parse error" in stderr:
        return (
            f"invalid regular expression: {stderr}\n"
            "Escape metacharacters such as ( ) [ ] { } . * + ? | \\ to match them literally."
        )
    return f"grep failed: {stderr or 'ripgrep exited with status 2'}"


@tool(
    "grep",
    family="code",
    lane="query",
    truncation_hint="narrow the pattern, path or glob to see the rest",
    rule_subject=PATH,
)
async def grep(args: GrepArgs, ctx: ToolContext) -> ToolOutput:
    """Search file contents with a regular expression (ripgrep): `path:line:text` per matching
    line. The way to find where text occurs; for a symbol's definition or uses find_definition
    and find_references are more precise, for file names use search_files. Ignored, hidden and
    binary files are skipped.
    """
    rg = find_binary("rg")
    if rg is None:
        raise ToolFailure("ripgrep (rg) is not installed on this server")
    resolved = resolve_in_workspace(ctx.workspace, args.path)
    if not resolved.exists():
        raise ToolFailure(f"path {args.path!r} does not exist")
    target = relative_to_workspace(ctx.workspace, resolved)
    collector = _Collector(args.max_results, args.context)
    exit_code, stderr, timed_out = await _run_rg(_rg_argv(rg, args, target), ctx, collector)
    nothing_searched = stderr.startswith("No files were searched")  # e.g. no file matches the glob
    if exit_code == 2 and not collector.matches and not nothing_searched:
        raise ToolFailure(_failure_message(stderr), exit_code=2)
    metadata: dict[str, object] = {
        "matches": collector.matches,
        "files": len(collector.files),
        "truncated": collector.truncated or timed_out,
    }
    if exit_code == 2 and not nothing_searched:
        metadata["warnings"] = stderr
    if collector.lines:
        output = "\n".join(collector.lines)
    else:
        output = f"No matches for {args.pattern!r} in {'the workspace' if target == '.' else repr(target)}."
    if timed_out:
        metadata["timed_out"] = True
        output += f"\n[search stopped after {_RG_TIMEOUT_S:.0f} s; narrow the path or glob to see the rest]"
    elif collector.truncated:
        output += (
            f"\n[stopped after {args.max_results} matches; more exist. Narrow the pattern, path or "
            "glob, or raise max_results (up to 5000).]"
        )
    return ToolOutput(output=output, metadata=metadata)


TOOLS: list[Tool] = [grep]
