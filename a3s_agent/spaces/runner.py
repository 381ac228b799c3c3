"""Executing a batch of operations in a workspace: validate, ask the policy, run; one event each.

File operations go through the registry's tools where their semantics match (write_file for
createFile and for editFile's result, delete_file), so sandboxing and atomic writes are shared.
readFile returns the whole content, and editFile's "every edit or none, first occurrence" rule
is its own, so both read directly inside the sandbox. Shell commands run through run_process,
which reports stdout and stderr apart and kills the whole process group.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import posixpath
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Literal

from ..base.errors import AgentError
from ..tools.process import find_binary, run_process
from ..tools.registry import ToolContext, ToolFailure, ToolOutput, ToolRegistry
from ..tools.workspace_paths import open_in_workspace, resolve_in_workspace
from .paths import hard_links, has_other_links, target_name
from .policies import SpacePolicy, Verdict, engine_tool
from .validation import operation_problems

log = logging.getLogger(__name__)

RunStatus = Literal["running", "awaiting_approval", "completed", "cancelled", "error"]
MAX_STREAM_BYTES = 1_000_000  # per stream of a shell command; the middle of longer output is dropped
_INLINE_READ_BYTES = 1 << 20  # bigger files are read in a worker thread
_FILE_OPERATIONS = frozenset({"createFile", "readFile", "editFile", "deleteFile"})
_SUBJECT = {
    "createFile": "path",
    "readFile": "path",
    "editFile": "path",
    "deleteFile": "path",
    "shell": "command",
}


def timestamp() -> str:
    """Now, as ISO 8601 in UTC with milliseconds: 2025-01-15T10:30:00.123Z."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def approval_id(operation: Mapping[str, Any], index: int) -> str:
    """The id an approval names: the operation's own id, else `op-<index>`, its place in the batch."""
    own = operation.get("id")
    return own if isinstance(own, str) else f"op-{index}"


def error_event(
    category: str, message: str, *, operation_id: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    event = _event("error", operation_id)
    event.update(category=category, message=message, details=details or {})
    return event


@dataclass(frozen=True)
class Outcome:
    """How a batch ended: completed, cancelled, or paused at `paused_at` awaiting approval."""

    status: RunStatus
    paused_at: int | None = None  # position in the batch of the operation awaiting approval
    operation_id: str | None = None


class BatchRunner:
    """Runs operations in order, appending one event per operation to `events` as it goes."""

    def __init__(
        self,
        registry: ToolRegistry,
        workspace: Path,
        policy: SpacePolicy,
        env: dict[str, str],
        events: list[dict[str, Any]] | None = None,
    ) -> None:
        self.events: list[dict[str, Any]] = [] if events is None else events
        self._registry = registry
        self._workspace = workspace
        self._policy = policy
        self._ctx = ToolContext(workspace=workspace, env=env)
        self._cancelled = False
        self._shell_task: asyncio.Future[Any] | None = None
        self._executors: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "message": self._message,
            "createFile": self._create_file,
            "readFile": self._read_file,
            "editFile": self._edit_file,
            "deleteFile": self._delete_file,
            "shell": self._shell,
        }

    def cancel(self) -> None:
        """Stop before the next operation; a running shell command is killed."""
        self._cancelled = True
        if self._shell_task is not None:
            self._shell_task.cancel()

    async def run(self, operations: Sequence[Any], *, offset: int = 0, approved: bool = False) -> Outcome:
        """Run `operations`, the batch's from index `offset` on; `approved` skips the policy for the first."""
        for position, operation in enumerate(operations):
            if self._cancelled:
                return Outcome("cancelled")
            index = offset + position
            problems = operation_problems(operation)
            if problems:
                self.events.append(_validation_error(operation, index, problems))
                continue
            operation_id = operation.get("id")
            is_approved = approved and position == 0
            if is_approved:
                operation_id = approval_id(operation, index)
            verdict = await self._verdict(operation)
            if verdict.decision == "deny":  # also after an approval: the files may have changed since
                self.events.append(
                    policy_denied_event(operation, operation_id, verdict.reason, verdict.suggestion)
                )
                continue
            if verdict.decision == "ask" and not is_approved:
                operation_id = approval_id(operation, index)
                self.events.append(_approval_required(operation, operation_id, verdict.reason, verdict.label))
                return Outcome("awaiting_approval", position, operation_id)
            self.events.append(await self._execute(operation, operation_id))
        return Outcome("cancelled" if self._cancelled else "completed")

    async def _verdict(self, operation: dict[str, Any]) -> Verdict:
        """The policy's decision, on every name the operation's path has; refused outright when the
        operator disabled the tool the operation runs as (Agent Spaces is no way around that)."""
        tool = engine_tool(operation["type"])
        if tool is not None and not self._registry.is_enabled(tool):
            return Verdict(
                "deny",
                f"The {tool} tool is disabled on this server, so {operation['type']} operations are refused",
                "Ask the operator to enable the tool",
            )
        return self._policy.check(operation, await self._other_names(operation))

    async def _other_names(self, operation: dict[str, Any]) -> list[str]:
        """Where a file operation's path leads and the file's other hard links in the workspace."""
        if operation["type"] not in _FILE_OPERATIONS:
            return []
        found = target_name(self._workspace, operation["path"], follow=operation["type"] != "deleteFile")
        if found is None:
            return []
        name, info = found
        if info is None or not has_other_links(info):
            return [name]
        return [name, *await asyncio.to_thread(hard_links, self._workspace, info)]

    async def _execute(self, operation: dict[str, Any], operation_id: str | None) -> dict[str, Any]:
        kind = operation["type"]
        event = _event(kind, operation_id)
        if kind in _SUBJECT:
            event[_SUBJECT[kind]] = operation[_SUBJECT[kind]]
        try:
            event.update(await self._executors[kind](operation))
        except (ToolFailure, AgentError) as exc:
            event.update(success=False, error=str(exc))
        except Exception as exc:  # a bug or an OS failure: this operation fails, the batch goes on
            log.exception("spaces: %s operation failed unexpectedly", kind)
            event.update(success=False, error=f"system error: {exc}")
        event["timestamp"] = timestamp()
        return event

    # --- the six operations; each returns its event's result fields or raises ToolFailure -----------

    async def _message(self, operation: dict[str, Any]) -> dict[str, Any]:
        return {"success": True}

    async def _create_file(self, operation: dict[str, Any]) -> dict[str, Any]:
        path, content = operation["path"], operation["content"]
        encoding = operation.get("encoding", "utf-8")
        overwrite = operation.get("overwrite", False)
        # base64 decodes to at most 3 bytes per 4 characters.
        size = (
            len(content) * 3 // 4 if encoding == "base64" else len(content.encode("utf-8", "surrogatepass"))
        )
        self._check_size(size)
        args = {"path": path, "content": content, "encoding": encoding, "overwrite": overwrite}
        output = await self._registry.run("write_file", args, self._ctx)
        if not output.success:
            # Looked at only on failure, so a successful write resolves its path once.
            existing = self._entry_stat(path, follow=True)
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                raise ToolFailure("Path is a directory")
            if existing is not None and not overwrite:
                raise ToolFailure("File already exists")
            raise ToolFailure(output.error)
        return {"success": True, "bytesWritten": output.metadata["bytes"]}

    async def _read_file(self, operation: dict[str, Any]) -> dict[str, Any]:
        encoding = operation.get("encoding", "utf-8")
        data = await self._read(operation["path"])
        if encoding == "base64":
            content = base64.b64encode(data).decode("ascii")
        else:
            content = _utf8(data, 'File is not valid UTF-8 text; read it with encoding "base64"')
        return {"success": True, "content": content, "encoding": encoding, "size": len(data)}

    async def _edit_file(self, operation: dict[str, Any]) -> dict[str, Any]:
        path, edits = operation["path"], operation["edits"]
        text = _utf8(await self._read(path), "File is not valid UTF-8 text; editFile edits only text files")
        if edits:
            await self._tool(
                "write_file", {"path": path, "content": apply_edits(text, edits), "overwrite": True}
            )
        return {"success": True, "editsApplied": len(edits)}

    async def _delete_file(self, operation: dict[str, Any]) -> dict[str, Any]:
        output = await self._registry.run("delete_file", {"path": operation["path"]}, self._ctx)
        if not output.success:
            existing = self._entry_stat(operation["path"], follow=False)
            if existing is None:
                raise ToolFailure("File not found")
            if stat.S_ISDIR(existing.st_mode):
                raise ToolFailure("Path is a directory; deleteFile deletes only files")
            raise ToolFailure(output.error)
        return {"success": True}

    async def _shell(self, operation: dict[str, Any]) -> dict[str, Any]:
        cwd = resolve_in_workspace(self._workspace, operation.get("cwd", "."), field="cwd")
        if not cwd.is_dir():
            raise ToolFailure(f"Working directory not found: {operation['cwd']}")
        timeout_ms = operation.get("timeout", self._policy.default_timeout_ms)
        task = asyncio.ensure_future(
            run_process(
                [_shell_binary(), "-c", operation["command"]],
                cwd=cwd,
                place=self._ctx.place,
                extra_env={**self._ctx.env, **operation.get("env", {})},
                timeout_s=timeout_ms / 1000,
                max_output_bytes=MAX_STREAM_BYTES,
            )
        )
        self._shell_task = task
        try:
            await asyncio.wait({task})
        finally:
            self._shell_task = None
            task.cancel()  # a no-op once done; if our caller was cancelled, run_process kills the group
        if task.cancelled():
            raise ToolFailure(
                "Cancelled: the run was cancelled while the command ran, and the command was killed"
            )
        result = task.result()
        fields: dict[str, Any] = {
            "success": result.exit_code == 0 and not result.timed_out,
            "exitCode": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "durationMs": round(result.duration_ms),
        }
        if result.timed_out:
            fields["timedOut"] = True
        return fields

    # --- helpers ----------------------------------------------------------------------------------

    async def _tool(self, name: str, args: dict[str, Any]) -> ToolOutput:
        output = await self._registry.run(name, args, self._ctx)
        if not output.success:
            raise ToolFailure(output.error)
        return output

    def _entry_stat(self, path: str, *, follow: bool) -> os.stat_result | None:
        """The stat of the workspace entry `path` names (None if missing); its directory is sandboxed."""
        parent = resolve_in_workspace(self._workspace, posixpath.dirname(path) or ".")
        entry = parent / posixpath.basename(path)
        try:
            return entry.stat() if follow else entry.lstat()
        except (FileNotFoundError, NotADirectoryError):
            return None

    async def _read(self, path: str) -> bytes:
        """The bytes of the regular file at `path` in the workspace, within the policy's size limit,
        read from the descriptor the workspace check opened (a swapped symlink cannot lead out)."""
        try:
            fd = open_in_workspace(self._workspace, path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ToolFailure("File not found") from exc
        except IsADirectoryError as exc:
            raise ToolFailure("Path is a directory, not a file") from exc
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise ToolFailure(
                "Path is a directory, not a file"
                if stat.S_ISDIR(info.st_mode)
                else "Path is not a regular file"
            )
        with open(fd, "rb") as handle:
            self._check_size(info.st_size)
            if info.st_size > _INLINE_READ_BYTES:
                return await asyncio.to_thread(handle.read)
            return handle.read()

    def _check_size(self, size: int) -> None:
        limit = self._policy.max_file_size
        if size > limit:
            raise ToolFailure(f"File size {size} bytes exceeds the policy's limit of {limit} bytes")


def apply_edits(text: str, edits: Sequence[Mapping[str, str]]) -> str:
    """`text` with each edit's first occurrence of oldContent replaced, in order; all must apply."""
    for number, edit in enumerate(edits, 1):
        old = edit["oldContent"]
        if not old:
            raise ToolFailure(
                f"Edit {number} of {len(edits)} failed: oldContent is empty; no edits were applied"
            )
        at = text.find(old)
        if at < 0:
            shown = old if len(old) <= 80 else old[:77] + "..."
            raise ToolFailure(
                f"Edit {number} of {len(edits)} failed: oldContent {shown!r} was not found; "
                "no edits were applied"
            )
        text = text[:at] + edit["newContent"] + text[at + len(old) :]
    return text


def policy_denied_event(
    operation: Mapping[str, Any], operation_id: str | None, reason: str, suggestion: str | None = None
) -> dict[str, Any]:
    event = _event("policyDenied", operation_id)
    event.update(operationType=operation["type"], reason=reason)
    if suggestion:
        event["suggestion"] = suggestion
    return event


def _approval_required(
    operation: Mapping[str, Any], operation_id: str, reason: str, policy: str
) -> dict[str, Any]:
    subject = _SUBJECT[operation["type"]]
    event = _event("approvalRequired", operation_id)
    event.update(
        operationType=operation["type"],
        reason=reason,
        details={subject: operation[subject], "policy": policy},
    )
    return event


def _validation_error(operation: Any, index: int, problems: list[Any]) -> dict[str, Any]:
    own = operation.get("id") if isinstance(operation, dict) else None
    return error_event(
        "validation",
        f"operations[{index}]: " + "; ".join(problem.message for problem in problems),
        operation_id=own if isinstance(own, str) else None,
        details={
            "index": index,
            "problems": [{"field": problem.field, "message": problem.message} for problem in problems],
        },
    )


def _event(kind: str, operation_id: str | None) -> dict[str, Any]:
    """An event's leading fields, in the spec's order; operationId only when there is one."""
    event: dict[str, Any] = {"type": kind}
    if operation_id is not None:
        event["operationId"] = operation_id
    event["timestamp"] = timestamp()
    return event


def _utf8(data: bytes, failure: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(f"{failure} (byte {exc.start})") from exc


@cache
def _shell_binary() -> str:
    return find_binary("bash") or "/bin/sh"
