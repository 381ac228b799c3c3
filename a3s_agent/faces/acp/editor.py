"""File and shell tools through the editor: read_file, write_file and edit_file use its
`fs/read_text_file` and `fs/write_text_file` (so they see and change what its buffers hold, unsaved
edits included), bash runs in a terminal it shows (`terminal/*`), when the editor offers them and
routing is on (`a3s-agent acp --no-editor-tools` turns it off).

The seam is the tool itself: the same tool (name, schema, permission rules, confirmation, lanes,
events, cancellation, output caps: everything the tool gate does) with its run going to the editor
instead of the disk. Paths are checked against the session's workspace as the local tools check
them, before the editor is asked; what the editor then does with a file or a command is its own
(a command in its terminal runs with the editor's environment, outside our process containment).
Base64 reads and writes, images, and every other tool work on the disk.
"""

from __future__ import annotations

import asyncio
import io
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from acp import RequestError
from acp.interfaces import Client
from acp.schema import ClientCapabilities, EnvVariable, WaitForTerminalExitResponse
from pydantic import BaseModel

from ...app.tool_kit import (
    MAGIC_BYTES,
    MAX_WRITE_BYTES,
    BashArgs,
    EditFileArgs,
    ProcessResult,
    ReadFileArgs,
    ToolContext,
    WriteFileArgs,
    apply_edit,
    check_edit,
    command_output,
    edit_output,
    looks_like_image,
    output_cap,
    read_text,
    relative_to_workspace,
    resolve_in_workspace,
)
from ...app.types import Tool, ToolFailure, ToolOutput

log = logging.getLogger(__name__)

# A terminal was created for the session's call of tool `name` running `command`: show it there.
ShowTerminal = Callable[[str, str, str, str], None]
_TIMED_OUT_EXIT = 124


class Editor:
    """What the connected editor offers the tools, as its initialize request said."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.client: Client | None = None
        self.reads = self.writes = self.terminals = False
        self.show_terminal: ShowTerminal = lambda session_id, name, command, terminal_id: None
        self._cleanups: set[asyncio.Task[None]] = set()

    def connect(self, client: Client, capabilities: ClientCapabilities | None) -> None:
        fs = capabilities.fs if capabilities is not None else None
        self.client = client
        self.reads = self.enabled and fs is not None and bool(fs.read_text_file)
        self.writes = self.enabled and fs is not None and bool(fs.write_text_file)
        self.terminals = self.enabled and capabilities is not None and bool(capabilities.terminal)

    def release_later(self, session_id: str, terminal_id: str, *, kill: bool) -> None:
        """Kill (if still running) and release a terminal, in a task of its own: the call that made it
        may be cancelled, and must not wait for the editor to go on."""
        task = asyncio.create_task(self._release(session_id, terminal_id, kill))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _release(self, session_id: str, terminal_id: str, kill: bool) -> None:
        assert self.client is not None
        try:
            if kill:
                await self.client.kill_terminal(session_id=session_id, terminal_id=terminal_id)
            await self.client.release_terminal(session_id=session_id, terminal_id=terminal_id)
        except (RequestError, ConnectionError) as exc:
            log.info("terminal %s was not released: %s", terminal_id, exc)


Remote = Callable[[Editor, Client, str, Any, ToolContext], Awaitable[ToolOutput | None]]


def routed(local: Tool, remote: Remote, offered: Callable[[Editor], bool], editor: Editor) -> Tool:
    """`local` with its run going to the editor when it offers what `remote` needs (a remote that
    returns None leaves the call to `local`: a base64 read, say)."""

    async def run(args: BaseModel, ctx: ToolContext) -> ToolOutput | str:
        client = editor.client
        if client is not None and ctx.session_id is not None and offered(editor):
            try:
                result = await remote(editor, client, ctx.session_id, args, ctx)
            except RequestError as exc:
                raise ToolFailure(f"the editor refused {local.name}: {exc} {exc.data or ''}".strip()) from exc
            except ConnectionError as exc:
                raise ToolFailure(f"the editor is gone: {exc}") from exc
            if result is not None:
                result.metadata["via"] = "editor"
                return result
        return await local.run(args, ctx)

    return replace(local, run=run)


EDITOR_ANSWER_S = 60.0
"""How long a file or terminal request waits for the editor before the tool call fails."""
_T = TypeVar("_T")


async def _asked(what: str, request: Awaitable[_T]) -> _T:
    """The editor's answer to `request`; a tool failure naming `what` if none comes in time."""
    try:
        return await asyncio.wait_for(request, EDITOR_ANSWER_S)
    except TimeoutError:
        raise ToolFailure(f"the editor did not answer {what} within {EDITOR_ANSWER_S:.0f} s") from None


async def read_file(
    editor: Editor, client: Client, session_id: str, args: ReadFileArgs, ctx: ToolContext
) -> ToolOutput | None:
    if args.encoding == "base64":
        return None
    path = resolve_in_workspace(ctx.workspace, args.path)
    if _is_image(path):  # the editor has text only: read_file shows the image from the disk
        return None
    text = (
        await _asked("fs/read_text_file", client.read_text_file(session_id=session_id, path=str(path)))
    ).content
    data = text.encode("utf-8")
    # The same numbered lines and footer as from the disk (and the same refusals: binary, not ascii).
    return read_text(io.BytesIO(data), args.path, args, len(data), ctx.max_output_bytes)


async def write_file(
    editor: Editor, client: Client, session_id: str, args: WriteFileArgs, ctx: ToolContext
) -> ToolOutput | None:
    if args.encoding != "utf-8":
        return None
    size = len(args.content.encode("utf-8"))
    if size > MAX_WRITE_BYTES:
        raise ToolFailure(f"content is {size} bytes; write_file writes at most {MAX_WRITE_BYTES} bytes")
    path = resolve_in_workspace(ctx.workspace, args.path)
    existed = path.exists()
    if existed and not path.is_file():
        raise ToolFailure(f"{args.path} is not a regular file")
    if existed and not args.overwrite:
        raise ToolFailure(
            f"{args.path} already exists; pass overwrite=true to replace it, or use edit_file to change part of it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)  # as write_file does (the path is inside the workspace)
    await _asked(
        "fs/write_text_file",
        client.write_text_file(session_id=session_id, path=str(path), content=args.content),
    )
    shown = relative_to_workspace(ctx.workspace, path)
    return ToolOutput(
        output=f"{'Overwrote' if existed else 'Created'} {shown} ({size} bytes)",
        metadata={"path": shown, "bytes": size, "created": not existed},
    )


async def edit_file(
    editor: Editor, client: Client, session_id: str, args: EditFileArgs, ctx: ToolContext
) -> ToolOutput | None:
    check_edit(args)
    path = resolve_in_workspace(ctx.workspace, args.path)
    before = (
        await _asked("fs/read_text_file", client.read_text_file(session_id=session_id, path=str(path)))
    ).content
    after, count = apply_edit(before, args, args.path)
    await _asked(
        "fs/write_text_file", client.write_text_file(session_id=session_id, path=str(path), content=after)
    )
    return edit_output(relative_to_workspace(ctx.workspace, path), before, args, count)


async def bash(
    editor: Editor, client: Client, session_id: str, args: BashArgs, ctx: ToolContext
) -> ToolOutput | None:
    """`bash -c` in a terminal of the editor, shown in the tool call while it runs; the same
    timeout, output cap and result as the local bash."""
    cwd = resolve_in_workspace(ctx.workspace, args.cwd, field="cwd")
    if not cwd.is_dir():
        raise ToolFailure(f"cwd {args.cwd!r} is not a directory in the workspace")
    created = await _asked(
        "terminal/create",
        client.create_terminal(
            session_id=session_id,
            command="bash",
            args=["-c", args.command],
            env=[EnvVariable(name=name, value=value) for name, value in ctx.env.items()],
            cwd=str(cwd),
            output_byte_limit=output_cap(ctx),
        ),
    )
    terminal = created.terminal_id
    editor.show_terminal(session_id, "bash", args.command, terminal)
    started = time.perf_counter()
    ended = False
    try:
        try:
            status: WaitForTerminalExitResponse | None = await asyncio.wait_for(
                client.wait_for_terminal_exit(session_id=session_id, terminal_id=terminal),
                args.timeout_ms / 1000,
            )
            ended = True
        except TimeoutError:
            status = None
        output = await _asked(
            "terminal/output", client.terminal_output(session_id=session_id, terminal_id=terminal)
        )
    finally:
        editor.release_later(session_id, terminal, kill=not ended)
    result = ProcessResult(
        exit_code=_exit_code(status),
        output=output.output,
        stdout=output.output,
        stderr="",
        timed_out=status is None,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        truncated=output.truncated,
    )
    return command_output(result, args.timeout_ms)


def _is_image(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return looks_like_image(handle.read(MAGIC_BYTES))
    except OSError:
        return False


def _exit_code(status: WaitForTerminalExitResponse | None) -> int:
    """As the local bash reports it: the code, minus the signal's number, 124 after a timeout."""
    if status is None:
        return _TIMED_OUT_EXIT
    if status.exit_code is not None:
        return status.exit_code
    name = (status.signal or "").upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    return -signal.Signals[name].value if name in signal.Signals.__members__ else -1
