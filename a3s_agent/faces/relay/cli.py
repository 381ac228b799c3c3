"""`a3s-agent relay new` and `relay resume`: run a session whose LLM is a person with a chat window.

The agent runs in this process (the application layer over a runtime of its own) with a session
store kept in `<relay_dir>/data`. Each model turn is an outbox file to paste into any chat LLM; the
answer, saved as a `.txt` file in `<relay_dir>/inbox/`, is carried out and the next outbox follows,
until the LLM sends DONE.
`resume` picks a session up again (waiting again for an outbox left unanswered).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TextIO

from ...app.relay import CONTINUATION_PROMPT, RelayTiming, load_sessions, relay_application, relay_llm
from ...app.types import AgentEvent, DoneEvent, GenerateOptions, ToolResultEvent
from ...base.errors import AgentError
from ...base.models import Message, SessionConfig


def _shown_arguments(arguments: str) -> str:
    """The path, or the command's first line (the relay's calls have JSON object arguments)."""
    parsed = json.loads(arguments)
    return str(parsed.get("path") or parsed.get("command") or "").split("\n")[0]


def _report(event: AgentEvent, out: TextIO) -> None:
    if isinstance(event, ToolResultEvent):
        status = "OK    " if event.result.success else "FAILED"
        detail = "" if event.result.success else f": {event.result.error}"
        print(f"  {status} {event.call.name} {_shown_arguments(event.call.arguments)}{detail}", file=out)
    elif isinstance(event, DoneEvent):
        print(f"\n{event.generation.message.content}", file=out)


async def _drive(
    relay_dir: Path, workspace: Path, session_id: str | None, prompt: str, timing: RelayTiming, out: TextIO
) -> int:
    """Run one generation of a relay session (a new one when `session_id` is None); 0 once it ends."""

    def waiting(outbox: Path) -> None:
        print(f"Outbox: {outbox}", file=out)
        print(
            f"Paste it into your LLM chat and save the answer as a .txt file in {relay_dir / 'inbox'}",
            file=out,
            flush=True,
        )

    async with relay_application(relay_dir, workspace, timing, waiting) as app:
        try:
            if session_id is None:
                config = SessionConfig(name=prompt[:80], workspace=str(workspace), llm=relay_llm(relay_dir))
                session_id = (await app.sessions.create(None, config, [], {})).session.id
            messages = [Message(role="user", content=prompt)]
            async for event in app.generation.stream(session_id, messages, GenerateOptions()):
                _report(event, out)
        except AgentError as exc:
            print(f"error: {exc}", file=out)
            return 1
    return 0


def _run(drive: Coroutine[Any, Any, int], out: TextIO) -> int:
    try:
        return asyncio.run(drive)
    except KeyboardInterrupt:
        print("\nStopped; `a3s-agent relay resume` goes on from here.", file=out)
        return 130


def relay_new(
    task: str,
    *,
    workspace: Path,
    relay_dir: Path,
    timing: RelayTiming | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """`a3s-agent relay new TASK --workspace DIR --relay-dir DIR`: start a session on `task`."""
    workspace = workspace.resolve()
    if not workspace.is_dir():
        print(f"error: workspace {workspace} is not a directory", file=out)
        return 2
    return _run(_drive(relay_dir.resolve(), workspace, None, task, timing or RelayTiming(), out), out)


def relay_resume(
    *,
    relay_dir: Path,
    handle: str | None = None,
    timing: RelayTiming | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """`a3s-agent relay resume [--handle H] --relay-dir DIR`: go on with a session, by default the
    one active last."""
    relay_dir = relay_dir.resolve()
    try:
        sessions = load_sessions(relay_dir)
    except AgentError as exc:
        print(f"error: {exc}", file=out)
        return 1
    if handle is not None and handle not in sessions:
        print(f"error: no relay session {handle!r} in {relay_dir}", file=out)
        return 2
    if not sessions:
        print(f"error: no relay session in {relay_dir}; start one with `a3s-agent relay new`", file=out)
        return 2
    session = sessions[handle] if handle is not None else max(sessions.values(), key=lambda s: s.updated_at)
    if session.complete and not session.pending:
        print(f"Session {session.handle} is complete: {session.task}", file=out)
        return 0
    print(f"Resuming session {session.handle}: {session.task}", file=out)
    drive = _drive(
        relay_dir,
        Path(session.workspace),
        session.session_id,
        CONTINUATION_PROMPT,
        timing or RelayTiming(),
        out,
    )
    return _run(drive, out)
