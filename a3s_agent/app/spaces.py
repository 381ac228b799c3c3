"""Agent Spaces: spaces (a workspace under a policy) and their runs of operations messages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ..base.errors import InvalidArgument, NotFound
from ..base.jsontext import parse_json
from ..runtime import Runtime
from ..spaces.policies import DEFAULT_PRESET, PolicySpec
from ..spaces.service import RunResult, Space
from ..spaces.validation import MessageInvalid


class Spaces:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def create_space(
        self,
        space_id: str | None = None,
        *,
        session_id: str | None = None,
        workspace: str | None = None,
        policy: PolicySpec = DEFAULT_PRESET,
    ) -> Space:
        """A new space in the workspace of session `session_id`, else in `workspace`, else in a
        directory of its own under the data dir; NotFound for an unknown session."""
        if session_id:
            directory: Path | None = Path(self._rt.sessions.get(session_id).config.workspace)
        else:
            directory = Path(workspace) if workspace else None
        return await self._rt.spaces.create_space(space_id, directory, policy)

    async def get_space(self, space_id: str) -> Space:
        return await self._rt.spaces.get_space(space_id)

    async def delete_space(self, space_id: str) -> None:
        """Delete the space, its runs and the directory it made for itself (see spaces/service.py)."""
        await self._rt.spaces.delete_space(space_id)

    async def start_run(self, space_id: str, operations_message: Any) -> RunResult:
        """Run an operations message (decoded JSON); its events message (completed,
        awaiting_approval...). MessageInvalid when the message as a whole is malformed."""
        async with self._checkpointed(space_id):
            return await self._rt.spaces.start_run(space_id, operations_message)

    async def get_run(self, space_id: str, run_id: str) -> RunResult:
        """The run with every event so far; status "running" while it executes."""
        return await self._rt.spaces.get_run(space_id, run_id)

    async def resume_run(self, space_id: str, run_id: str, approval: Any) -> RunResult:
        """Answer the pending approval ({"operationId", "decision", "reason"?} or a userMessage)
        and go on; the events of this resumption."""
        async with self._checkpointed(space_id):
            return await self._rt.spaces.resume_run(space_id, run_id, approval)

    @asynccontextmanager
    async def _checkpointed(self, space_id: str) -> AsyncIterator[None]:
        """A run's operations may write the space's workspace: a checkpoint (kind `space`) of each
        session working there first, and what the run left noted after."""
        workspace = (await self._rt.spaces.get_space(space_id)).workspace.resolve()
        await self._rt.sessions.refresh_all()
        sessions, _ = self._rt.sessions.page(None, len(self._rt.sessions))
        there = [s.id for s in sessions if Path(s.config.workspace) == workspace]
        for session_id in there:
            await self._rt.checkpoints.before_tool(session_id, "space")
        try:
            yield
        finally:
            for session_id in there:
                await self._rt.checkpoints.after_tool(session_id)

    async def cancel_run(self, space_id: str, run_id: str) -> RunResult:
        return await self._rt.spaces.cancel_run(space_id, run_id)

    async def run_file(self, path: Path, workspace: Path, policy: PolicySpec = DEFAULT_PRESET) -> RunResult:
        """Run the operations message in the JSON file `path` in a new space over `workspace`."""
        message = _read_message(path)
        space = await self._rt.spaces.create_space(None, workspace, policy)
        return await self._rt.spaces.start_run(space.id, message)


def _read_message(path: Path) -> Any:
    try:
        return parse_json(path.read_text(encoding="utf-8"), f"operations file {str(path)!r}")
    except FileNotFoundError as exc:
        raise NotFound(f"operations file {str(path)!r} does not exist") from exc
    except UnicodeDecodeError as exc:
        raise MessageInvalid(f"operations file {str(path)!r} is not UTF-8 text: {exc}") from exc
    except InvalidArgument as exc:
        raise MessageInvalid(str(exc)) from exc
