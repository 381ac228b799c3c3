"""The agent side of ACP: each request of the editor as calls of the application.

Sessions made here are ordinary stored sessions (gRPC and HTTP see them; they survive restarts).
Their ids are ours. A session the editor loads, resumes or prompts keeps its workspace unless the
editor names another `cwd` (which must lie in the workspace root, as for any session)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AgentPlanUpdate,
    ClientCapabilities,
    CloseSessionResponse,
    ForkSessionResponse,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionForkCapabilities,
    SessionInfo,
    SessionInfoUpdate,
    SessionListCapabilities,
    SessionResumeCapabilities,
)

from ... import NAME, __version__
from ...app import Application
from ...app.sessions import PageKey, ServersGiven
from ...app.types import Session
from ...base.errors import InvalidArgument, NotFound
from ...base.jsontext import parse_json
from ...base.models import Message, SessionConfig
from ..agent_service import check_message_size
from .content import PromptBlock, user_message
from .describe import review_of
from .editor import Editor
from .errors import answering
from .mcp_servers import McpServer, servers_given
from .outbox import Outbox
from .permissions import Asker, editor_confirmation, editor_policy
from .plan import todo_plan
from .replay import replay
from .turn import Turn

log = logging.getLogger(__name__)

PAGE_SIZE = 100
TITLE_CHARS = 80


class EditorAgent:
    """One connection's agent: what the editor's requests ask of the application."""

    def __init__(self, app: Application, editor: Editor) -> None:
        self._app = app
        self._editor = editor
        self._client: Client | None = None
        self._outbox: Outbox | None = None
        self._asker: Asker | None = None
        self._workspaces: dict[str, Path] = {}  # the sessions this connection set up
        self._untitled: set[str] = set()  # of those, the ones without a name yet
        self._turns: dict[str, set[Turn]] = {}
        self._ended = False  # the editor sends nothing more (stdin ended)
        editor.show_terminal = self._show_terminal

    def on_connect(self, conn: Client) -> None:
        self._client = conn
        self._outbox = Outbox(conn)
        self._asker = Asker(self._app, conn)

    def end(self) -> None:
        """The editor sends nothing more: the requests it sent are still answered, but a turn, now
        watched by no one, stops (its prompt answers `cancelled`), and so does one yet to start."""
        self._ended = True
        for turns in self._turns.values():
            for turn in turns:
                turn.cancel()

    async def close(self) -> None:
        for turns in self._turns.values():
            for turn in turns:
                turn.cancel()
        if self._outbox is not None:
            await self._outbox.close()

    # --- set-up ----------------------------------------------------------------------------

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        with answering("initialize", meta=kwargs):
            assert self._client is not None
            self._editor.connect(self._client, client_capabilities)
            log.info(
                "editor %s: protocol %d; through the editor: reads %s, writes %s, terminals %s",
                client_info.name if client_info is not None else "(unnamed)",
                protocol_version,
                self._editor.reads,
                self._editor.writes,
                self._editor.terminals,
            )
            capabilities = AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=True, audio=False, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True, sse=False),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(),
                    resume=SessionResumeCapabilities(),
                    close=SessionCloseCapabilities(),
                    fork=SessionForkCapabilities(),
                ),
            )
            return InitializeResponse(
                protocol_version=PROTOCOL_VERSION,
                agent_capabilities=capabilities,
                auth_methods=[],
                agent_info=Implementation(name=NAME, title=NAME, version=__version__),
            )

    # --- sessions --------------------------------------------------------------------------

    async def new_session(
        self, cwd: str, mcp_servers: Sequence[McpServer] | None = None, **kwargs: Any
    ) -> NewSessionResponse:
        with answering("session/new", meta=kwargs):
            servers = servers_given(mcp_servers, "session/new")
            view = await self._app.sessions.create(
                None, SessionConfig(workspace=cwd), [], {}, mcp_servers=servers
            )
            session_id = view.session.id
            await self._app.permissions.set(session_id, editor_policy(self._app.tools.available(session_id)))
            await self._app.control.set_confirmation_policy(session_id, editor_confirmation())
            self._workspaces[session_id] = Path(view.session.config.workspace)
            self._untitled.add(session_id)
            return NewSessionResponse(session_id=session_id)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Sequence[McpServer] | None = None, **kwargs: Any
    ) -> LoadSessionResponse:
        with answering("session/load", session_id, kwargs):
            workspace = await self._set_up(session_id, cwd, servers_given(mcp_servers, "session/load"))
            history = await self._app.sessions.history(session_id)
            tools = {t.name: t for t in self._app.tools.available(session_id)}
            outbox = self._require_outbox()
            shown: AgentPlanUpdate | None = None
            for update in replay(history, workspace, tools):
                outbox.send(session_id, update)
                shown = update if isinstance(update, AgentPlanUpdate) else shown
            todos = await self._app.todos.get(session_id)
            if todos and todo_plan(todos) != shown:  # the list as it is now, if it moved on since
                outbox.send(session_id, todo_plan(todos))
            await outbox.drain()  # the whole conversation is out before the answer
            return LoadSessionResponse()

    async def resume_session(
        self, session_id: str, cwd: str, mcp_servers: Sequence[McpServer] | None = None, **kwargs: Any
    ) -> ResumeSessionResponse:
        with answering("session/resume", session_id, kwargs):
            await self._set_up(session_id, cwd, servers_given(mcp_servers, "session/resume"))
            return ResumeSessionResponse()

    async def fork_session(
        self, session_id: str, cwd: str, mcp_servers: Sequence[McpServer] | None = None, **kwargs: Any
    ) -> ForkSessionResponse:
        """A new session with the session's history and settings (unstable in ACP). Ours too:
        `_meta: {"a3s": {"checkpoint": N}}` forks at a checkpoint (the history before that turn),
        and `"copyWorkspace": true` works in a copy of the files of that moment, at `cwd` when it
        is not the session's workspace (docs/agent/checkpoints.md)."""
        with answering("session/fork", session_id):
            checkpoint, copy_workspace = _fork_options(kwargs.get("a3s"))
            servers = servers_given(mcp_servers, "session/fork")
            source = (await self._app.sessions.get(session_id)).session
            moved = bool(cwd) and not same_directory(cwd, Path(source.config.workspace))
            view = await self._app.checkpoints.fork(
                session_id,
                checkpoint,
                copy_workspace=copy_workspace,
                workspace=cwd if copy_workspace and moved else "",
            )
            forked = view.session.id
            await self._set_up(forked, "" if copy_workspace else cwd, servers)
            return ForkSessionResponse(session_id=forked)

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        """Stop what runs on the session, its MCP servers too, and forget it here; it stays stored
        (load it again). Closing a session that does not exist succeeds, as ACP asks."""
        with answering("session/close", session_id, kwargs):
            for turn in self._turns.get(session_id, set()):
                turn.cancel()
            self._workspaces.pop(session_id, None)
            self._untitled.discard(session_id)
            with contextlib.suppress(NotFound):
                await self._app.sessions.release(session_id)
            return CloseSessionResponse()

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        with answering("session/list", meta=kwargs):
            return await session_page(self._app, cwd, cursor)

    async def _set_up(self, session_id: str, cwd: str, servers: ServersGiven | None = None) -> Path:
        """The session's workspace, made `cwd` when the editor moved it, and `servers` (when given)
        made its own MCP servers; NotFound for no session."""
        session = (await self._app.sessions.get(session_id)).session
        workspace = Path(session.config.workspace)
        moved = bool(cwd) and not same_directory(cwd, workspace)
        if moved or servers is not None:
            config = SessionConfig(workspace=cwd if moved else "")
            view = await self._app.sessions.configure(
                session_id, config, replace_all=False, compaction={}, mcp_servers=servers
            )
            workspace = Path(view.session.config.workspace)
        self._workspaces[session_id] = workspace
        if not session.config.name:
            self._untitled.add(session_id)
        return workspace

    # --- prompts ---------------------------------------------------------------------------

    async def prompt(self, prompt: Sequence[PromptBlock], session_id: str, **kwargs: Any) -> PromptResponse:
        with answering("session/prompt", session_id, kwargs):
            message = user_message(prompt)
            check_message_size([message], "prompt")
            workspace = self._workspaces.get(session_id) or await self._set_up(session_id, "")
            assert self._asker is not None
            turn = Turn(self._app, self._require_outbox(), self._asker, session_id, workspace)
            turns = self._turns.setdefault(session_id, set())
            turns.add(turn)
            if self._ended:
                turn.cancel()
            try:
                await self._title(session_id, message)
                before = await self._newest_checkpoint(session_id)
                stop = await turn.run(message)
                await self._require_outbox().drain()  # every update of the turn before its answer
            finally:
                turns.discard(turn)
            taken = await self._newest_checkpoint(session_id)
            if taken <= before:
                return PromptResponse(stop_reason=stop)
            changed = await self._app.checkpoints.run_texts(session_id, taken)
            if changed:  # the turn's changes for the editor's review, before the answer
                outbox = self._require_outbox()
                outbox.send(session_id, review_of(taken, changed, workspace))
                await outbox.drain()
            return PromptResponse(stop_reason=stop, field_meta={"a3s": {"checkpoint": taken}})

    async def _newest_checkpoint(self, session_id: str) -> int:
        """The seq of the session's newest checkpoint (0: none): the one a turn took, when it grew,
        which the prompt's answer names (`_meta.a3s.checkpoint`) for a fork at that turn."""
        records = await self._app.checkpoints.of_session(session_id)
        return records[-1].seq if records else 0

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        for turn in self._turns.get(session_id, set()):
            turn.cancel()

    async def _title(self, session_id: str, message: Message) -> None:
        """A session without a name is named after its first prompt's first line."""
        title = next((line.strip() for line in message.content.splitlines() if line.strip()), "")
        if session_id not in self._untitled or not title:
            return
        self._untitled.discard(session_id)
        title = title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1] + "…"
        await self._app.sessions.configure(
            session_id, SessionConfig(name=title), replace_all=False, compaction={}
        )
        self._require_outbox().send(
            session_id, SessionInfoUpdate(session_update="session_info_update", title=title)
        )

    def _show_terminal(self, session_id: str, tool_name: str, command: str, terminal_id: str) -> None:
        for turn in self._turns.get(session_id, set()):
            if turn.calls.attach_terminal(tool_name, command, terminal_id):
                return

    def _require_outbox(self) -> Outbox:
        if self._outbox is None:
            raise RequestError.internal_error({"details": "not connected"})
        return self._outbox


def same_directory(path: str, directory: Path) -> bool:
    return Path(path).resolve() == directory


async def session_page(app: Application, cwd: str | None, cursor: str | None) -> ListSessionsResponse:
    """A page of the stored sessions (in `cwd`, when given) after `cursor` (one this agent gave)."""
    page = await app.sessions.page(_page_key(cursor) if cursor else None, PAGE_SIZE, workspace=cwd)
    return ListSessionsResponse(
        sessions=[_info(s) for s in page.sessions],
        next_cursor=_cursor(page.next_after) if page.next_after is not None else None,
    )


def _info(session: Session) -> SessionInfo:
    updated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session.updated_at / 1000))
    return SessionInfo(
        session_id=session.id,
        cwd=session.config.workspace,
        title=session.config.name or None,
        updated_at=updated,
    )


def _cursor(key: PageKey) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode("ascii")


def _page_key(cursor: str) -> PageKey:
    try:
        text = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("utf-8")
        created_at, session_id = parse_json(text, "cursor")
    except (ValueError, TypeError, binascii.Error, InvalidArgument) as exc:
        raise InvalidArgument(f"cursor {cursor[:100]!r} is not one this agent gave") from exc
    if not isinstance(created_at, int) or not isinstance(session_id, str):
        raise InvalidArgument(f"cursor {cursor[:100]!r} is not one this agent gave")
    return created_at, session_id


def _fork_options(given: Any) -> tuple[int | None, bool]:
    """session/fork's `_meta.a3s`: the checkpoint to fork at (None: now) and whether to copy."""
    if given is None:
        return None, False
    if not isinstance(given, dict) or set(given) - {"checkpoint", "copyWorkspace"}:
        raise InvalidArgument('_meta.a3s takes only "checkpoint" (a number) and "copyWorkspace" (true/false)')
    checkpoint, copy_workspace = given.get("checkpoint"), given.get("copyWorkspace", False)
    if checkpoint is not None and (type(checkpoint) is not int or checkpoint < 1):
        raise InvalidArgument(f"_meta.a3s.checkpoint must be a checkpoint's number, not {checkpoint!r:.50}")
    if type(copy_workspace) is not bool:
        raise InvalidArgument("_meta.a3s.copyWorkspace must be true or false")
    return checkpoint, copy_workspace
