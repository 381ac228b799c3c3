"""The Runtime: the server's parts, built from Settings and owned for its lifetime; the agent
loop's AgentHost (core/loop/host.py). Only the application layer (app/) is given it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import DESCRIPTION, HOMEPAGE, LICENSE, NAME, __version__
from ..base.errors import FailedPrecondition, InvalidArgument, NotFound
from ..base.memories import MAX_CONTENT_CHARS, MemoryQuery, MemorySettings
from ..base.models import LLMConfig, Message
from ..config import BOX_SKILLS_DIR, Settings
from ..core.agents.task_tool import TASK
from ..core.loop.agent import Agent
from ..core.loop.budget import effective_budget
from ..core.loop.context import ContextManager
from ..core.loop.tool_runner import ToolRunner
from ..core.prompt.system import SystemPrompts
from ..core.sessions.checkpoints import CheckpointOptions, Checkpoints
from ..core.sessions.client_tools import ClientTools
from ..core.sessions.control import ControlPlane
from ..core.sessions.manager import SessionManager, existing_directory
from ..core.sessions.memories import MemoryBank, memory_note
from ..core.sessions.todos import TodoLists
from ..core.skills.catalog import SkillCatalog
from ..core.store.events import EventBus
from ..core.store.memories import Bounds
from ..core.store.protocol import LogEntry, Store
from ..core.store.session import Session
from ..core.store.sqlite_store import SqliteStore
from ..datadir import DataDirLock, make_data_dir
from ..llm.endpoints import credentials_clash
from ..llm.modes import speaks_text_protocol
from ..llm.provider import Provider
from ..llm.vision import WithoutImages, takes_images, vision_models
from ..spaces.service import Spaces
from ..tools import containment, sandbox
from ..tools import memory as memory_tools
from ..tools.lsp.catalog import Catalog
from ..tools.lsp.servers import LanguageServers
from ..tools.registry import Tool, ToolContext, ToolRegistry
from .cron.clock import Clock, WallClock
from .cron.firing import Firings
from .cron.scheduler import Scheduler
from .initialization import (
    SANDBOX_NETWORK_KEY,
    Initialization,
    InitializeRequest,
    token_budget,
    withheld_names,
)
from .mcp import McpServers, initialize_servers
from .provider_settings import ProviderSettings
from .providers import ProviderCache, ProviderFactory
from .replicas import Replicas
from .runs import Runs
from .subagents import Subagents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentInfo:
    name: str = NAME
    version: str = __version__
    description: str = DESCRIPTION
    author: str = "a3s-agent developers"
    license: str = LICENSE
    homepage: str = HOMEPAGE


class Runtime:
    """Holds the server's parts; it is the agent loop's AgentHost (core/loop/host.py)."""

    def __init__(
        self,
        settings: Settings,
        store: Store | None = None,
        registry: ToolRegistry | None = None,
        connect: ProviderFactory | None = None,
        relay: ProviderFactory | None = None,
        clock: Clock | None = None,
    ):
        """`connect` and `relay` replace the model providers (see ProviderCache), `clock` the wall
        clock the cron scheduler reads."""
        self.settings = settings
        self.info = AgentInfo()
        self.workspace: Path = settings.workspace.resolve()
        self.store: Store = store or _store(settings)
        self.registry = registry or ToolRegistry()
        self.registry.reserved.add(TASK)  # made per session (runtime/subagents.py); Initialize may name it
        self.events = EventBus(self.store, fence_for=lambda session_id: self.replicas.fence_for(session_id))
        self.sessions = SessionManager(
            self.store,
            default_workspace=lambda: self.workspace,
            workspace_root=settings.resolved_workspace_root,
            max_sessions=settings.max_sessions,
            max_context_tokens=settings.max_context_tokens,
            events=self.events,
            pin_llm=lambda llm: self.provider_settings.pinned(llm),
        )
        self.control = ControlPlane(self.sessions, self.events)
        self.client_tools = ClientTools(self.sessions, self.registry)
        self.todos = TodoLists(self.sessions)
        self.checkpoints = Checkpoints(
            self.sessions,
            self.store,
            self.events,
            _checkpoint_options(settings),
            own_run=self.replicas_own_run,
            workspace_root=settings.resolved_workspace_root,
        )
        self.memories = MemoryBank(self.sessions, self.store, self.events, Bounds(settings.max_memories))
        self.prompts = SystemPrompts(settings.resolved_workspace_root, settings.project_instructions)
        self.skills = SkillCatalog(
            self.sessions,
            settings,
            lambda: self.workspace,
            lambda: {*self.registry.names(), *self.registry.reserved},
        )
        self.tools = ToolRunner(
            self.registry,
            self.sessions,
            self.tool_context,
            settings.max_tools_per_request,
            max_calls=settings.max_tool_calls,
            tools_for=self.tools_for,
        )
        self.providers = ProviderCache(
            timeout_s=settings.llm_timeout_s,
            max_retries=settings.llm_retries,
            tool_mode=settings.llm_tool_mode,
            relay_dir=settings.relay_dir,
            connect=connect,  # None: the OpenAI-compatible HTTP provider; tests plug in a scripted one
            relay=relay,  # None: the relay the session's base_url names; the relay CLI brings its own
        )
        self.context = ContextManager(
            self.sessions,
            self.events,
            host=self,
            threshold=settings.compact_threshold,
            target=settings.compact_target,
        )
        self.agent = Agent(
            self.sessions,
            host=self,
            control=self.control,
            events=self.events,
            context=self.context,
            max_generations=settings.max_generations,
        )
        self.replicas = Replicas(
            self.store,
            self.events,
            self.sessions,
            replica_id=settings.replica_id,
            lease_ttl_s=settings.lease_ttl_s,
            retention_hours=settings.event_retention_hours,
            retention_count=settings.event_retention_count,
        )
        self.events.on_fenced = self.replicas.on_lost = self._stop_fenced_run
        self._serve_control()
        self.runs = Runs(self.agent, self.events, self.sessions)
        self.subagents = Subagents(
            settings,
            self.sessions,
            self.control,
            self.events,
            self.runs,
            self.tools_for,
            self.llm_for,
            lambda session_id: self.mcp.session_ended(session_id),
            lambda: self.workspace,
        )
        self.cron = Scheduler(
            self.store.cron,
            Firings(self.registry, self.sessions, self.tool_context, self.runs, self.control),
            settings.cron,
            replica_id=settings.replica_id,
            lease_ttl_s=settings.lease_ttl_s,
            clock=clock or WallClock(),
        )
        self.on_close: list[Callable[[], Awaitable[None]]] = []
        """Awaited by `close` once the runs have stopped, before the store closes (the A3S harness's
        follow-up work, app/harness.py)."""
        self.init = Initialization()
        self.provider_settings = ProviderSettings(
            self.store.providers, settings.provider_keys, lambda: self.replicas.broadcast("providers")
        )
        self.mcp = McpServers(settings, self.skills, lambda: self.init.mcp_servers, self.tool_context)
        self.lsp = LanguageServers(
            Catalog.with_configured(settings.lsp_servers),
            env=lambda: self.init.env,
            idle_s=settings.lsp_idle_s,
        )
        self.spaces = Spaces(
            settings.resolved_data_dir,
            self.registry,
            env=lambda: self.init.env,
            max_runs=settings.max_space_runs,
            max_spaces=settings.max_spaces,
            durability=settings.durability,
            store_url=settings.store,
            replica_id=settings.replica_id,
            lease_s=settings.lease_ttl_s,
        )
        self._initializing = asyncio.Lock()  # one Initialize at a time: its rollback restores the last
        self.started_at = time.monotonic()
        # Set when a client asks for Shutdown; the server's main loop waits on it.
        self.shutdown_requested = asyncio.Event()
        self.shutting_down = False
        self.containment: containment.Containment | None = None  # set by start
        self.sandbox = sandbox.Sandbox(
            settings.sandbox,
            data_dir=settings.resolved_data_dir,
            secret_files=[
                *(f for f in (settings.auth_token_file, settings.tls_key, settings.mcp_config) if f),
                _checkpoint_options(settings).directory,  # the shadow repositories: not the model's
            ],
            also_read=[*settings.skill_dirs, BOX_SKILLS_DIR],
            workspaces=self.sessions.workspaces,
            narrowing=lambda: self.init.sandbox_network,
        )
        self._data_dir_lock = DataDirLock(settings.resolved_data_dir)

    async def start(self) -> None:
        make_data_dir(self.settings.resolved_data_dir)  # with a .gitignore, when it is new
        sandbox.activate(self.sandbox)  # the mechanism chosen (and logged) before any process starts
        # First: kill what a crashed previous server on this data dir left running.
        self.containment = containment.activate(self.settings.resolved_data_dir)
        lock = self._data_dir_lock
        alone = not self.store.shared and lock.take_alone()
        if not alone and not self.store.shared:
            log.warning(
                "another process uses this data dir (%s is locked): runs a crash left here end only"
                " when their leases expire",
                lock.path,
            )
        await self.store.open()
        await self.spaces.open()
        await self._restore_initialization()
        await self.provider_settings.load()
        await self.sessions.load()
        await self.checkpoints.replay_all()  # restores a crash interrupted: finished first
        # With the sessions loaded: ending a run left by a crash answers its open tool calls.
        await self.replicas.start(alone=alone)
        if not await lock.share():
            log.warning("could not lock %s: a server starting later may end this one's runs", lock.path)
        await self.skills.rescan()
        self.cron.start()  # when the operator turned scheduling on
        log.info(
            "runtime ready: workspace=%s data=%s sessions=%d",
            self.workspace,
            self.settings.resolved_data_dir,
            len(self.sessions),
        )

    async def close(self) -> None:
        await self.cron.close()  # its firings are recorded as cancelled
        await self.runs.stop()  # each run still going ends its stream in the log
        for hook in self.on_close:
            await hook()
        await self.spaces.close()  # its running runs are cancelled, their commands killed
        await self.mcp.close()  # MCP servers are asked to stop (their stdin closed) before the kill
        await self.lsp.close()  # language servers too (shutdown, exit)
        if self.containment is not None:  # every tool process still running ends with the server
            containment.deactivate(self.containment)
        sandbox.deactivate(self.sandbox)
        await self.sandbox.stop()  # the network proxy's port and connections
        await self.events.close()
        await self.replicas.close()
        await self.providers.close()
        await self.store.close()
        self._data_dir_lock.release()

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at

    async def initialize(self, request: InitializeRequest) -> None:
        """Apply an Initialize call, and store it (one transaction; secrets left out, see
        initialization.py) so that a restart restores it. Everything is validated and stored
        before anything changes in memory."""
        async with self._initializing:
            workspace, llm = request.workspace, request.llm
            clash = credentials_clash(llm) if llm is not None else None
            if clash is not None:
                raise InvalidArgument(f"config.llm: {clash}")
            new_workspace = existing_directory(workspace, "workspace") if workspace else self.workspace
            init = Initialization(
                workspace=str(new_workspace) if workspace else self.init.workspace,
                llm=self.provider_settings.pinned(llm) if llm is not None and not llm.is_empty() else None,
                env=dict(request.env),
                enabled_tools=list(request.enabled_tools),
                disabled_tools=list(request.disabled_tools),
                tool_config=dict(request.tool_config),
                log_level=request.log_level or self.init.log_level,
                token_budget=token_budget(request.custom),
                vision_models=vision_models(request.custom),
                mcp_servers=self.mcp.from_api(initialize_servers(request.custom)),
                sandbox_network=self._sandbox_network(request.custom.get(SANDBOX_NETWORK_KEY, "")),
            )
            self.registry.configure(init.enabled_tools, init.disabled_tools)  # raises on unknown names
            try:
                await self.store.save_initialization(init.to_storable(self.settings.secret_env_names))
            except BaseException:
                self.registry.configure(self.init.enabled_tools, self.init.disabled_tools)
                raise
            self.workspace = new_workspace
            self.init = init
            await self.mcp.server_changed()
            await self.replicas.broadcast("initialized")
        if request.log_level:
            logging.getLogger("a3s_agent").setLevel(request.log_level)

    def _sandbox_network(self, wanted: str) -> str:
        """An Initialize's network for commands: InvalidArgument unless within the operator's."""
        if not wanted.strip():
            return ""
        try:
            return self.sandbox.narrowed(wanted)
        except ValueError as exc:
            raise InvalidArgument(f"config.custom.{SANDBOX_NETWORK_KEY}: {exc}") from None

    async def _restore_initialization(self) -> None:
        """Apply the stored Initialize (if any) as the last one left it, but for what was withheld
        and what no longer fits this server: a workspace gone, tools no longer built in."""
        data = await self.store.load_initialization()
        if data is None:
            return
        init = Initialization.from_storable(data)
        self._restore_workspace(init)
        self._restore_tools(init)
        self._restore_sandbox_network(init)
        if init.log_level:
            logging.getLogger("a3s_agent").setLevel(init.log_level)
        self.init = init
        missing = withheld_names(data)
        log.info(
            "restored the last Initialize: workspace=%s model=%s tools=%d%s",
            self.workspace,
            init.llm.model if init.llm is not None and init.llm.model else "(server's)",
            len(self.registry.enabled()),
            f"; not stored, send Initialize again to set: {', '.join(missing)}" if missing else "",
        )

    async def _initialized_elsewhere(self) -> None:
        """Another replica applied an Initialize: take it from the store (secrets are never stored:
        replicas take their keys from the environment)."""
        async with self._initializing:
            await self._restore_initialization()
            await self.mcp.server_changed()

    def _restore_workspace(self, init: Initialization) -> None:
        if init.workspace and not Path(init.workspace).is_dir():
            log.warning("stored Initialize workspace %s is gone; using %s", init.workspace, self.workspace)
            init.workspace = ""
        if init.workspace:
            self.workspace = Path(init.workspace)

    def _restore_sandbox_network(self, init: Initialization) -> None:
        try:
            init.sandbox_network = self._sandbox_network(init.sandbox_network)
        except InvalidArgument:
            log.warning(
                "stored Initialize's sandbox network %r is wider than --sandbox-network %s; using that",
                init.sandbox_network,
                self.settings.sandbox.network_text,
            )
            init.sandbox_network = ""

    def _restore_tools(self, init: Initialization) -> None:
        """The stored tool lists, without names this server no longer has. An enabled list left
        empty by that would mean every tool: enable none instead."""
        known = {*self.registry.names(), *self.registry.reserved}
        gone = sorted((set(init.enabled_tools) | set(init.disabled_tools)) - known)
        if gone:
            log.warning("stored Initialize names tools this server does not have: %s", ", ".join(gone))
        enabled = [name for name in init.enabled_tools if name in known]
        disabled = [name for name in init.disabled_tools if name in known]
        if init.enabled_tools and not enabled:
            disabled = sorted(known)
        self.registry.configure(enabled, disabled)
        init.enabled_tools, init.disabled_tools = enabled, disabled

    def llm_for(self, session: Session | None = None) -> LLMConfig:
        """session config.llm > Initialize config.llm > the default model (SetDefaultModel) > server
        settings, field by field; a layer naming a stored provider entry is completed from it first
        (runtime/provider_settings.py). The server's own layer is taken as the operator wrote it."""
        merged = self.settings.llm
        own = session.config.llm if session is not None else None
        for layer in (self.provider_settings.default_llm(), self.init.llm, own):
            if layer is not None:
                merged = self.provider_settings.expand(layer).merged_over(merged)
        return merged

    def configured_models(self) -> list[LLMConfig]:
        """The distinct models configured at server and Initialize level."""
        models: list[LLMConfig] = []
        for llm in (self.settings.llm, self.llm_for()):
            if llm.model and all((m.provider, m.model) != (llm.provider, llm.model) for m in models):
                models.append(llm)
        return models

    def provider_for(self, llm: LLMConfig) -> Provider:
        """The endpoint's provider, as the model uses it: without tool results' images when it
        does not take images (llm/vision.py)."""
        provider = self.providers.get(llm)
        return provider if takes_images(llm.model, self.init.vision_models) else WithoutImages(provider)

    def tools_for(self, session: Session | None) -> list[Tool]:
        """What a session's model may call: the built-in tools the registry offers its model, skill
        tools, client tools, the tools of its MCP servers (as last listed: see prepare_tools) and
        `task` (runtime/subagents.py); those that may change files wait for the checkpoint their
        turn is taking."""
        provider = self.llm_for(session).provider
        tools = [
            *self.registry.offered(text_protocol=speaks_text_protocol(provider, self.settings.llm_tool_mode)),
            *self.skills.tools_for(session),
            *self.client_tools.for_session(session),
            *self.mcp.tools_for(session),
            *(memory_tools.TOOLS if self.memory_settings_for(session).tools else ()),
            *(self.subagents.tools_for(session) if self.registry.lets(TASK) else ()),
        ]
        return tools if session is None else self.checkpoints.guarded(session.id, tools)

    def memory_settings_for(self, session: Session | None) -> MemorySettings:
        """What the session's model gets of memories: its own setting, else the operator's."""
        own = session.settings.memory if session is not None else None
        return own if own is not None else self.settings.memory

    async def recalled_memories(self, session: Session, messages: list[Message]) -> str:
        """The memories most relevant to `messages` (their user text), for the system prompt, when
        the session's memory settings offer some ("" otherwise); counted as used."""
        count = self.memory_settings_for(session).prompt
        if not count:
            return ""
        asked = " ".join(m.content for m in messages if m.role == "user")[-MAX_CONTENT_CHARS:]
        found, _ = await self.memories.search(session.id, MemoryQuery(text=asked, limit=count), used=True)
        return memory_note(found)

    async def prepare_tools(self, session: Session | None) -> None:
        """Connect the session's MCP servers whose tools are not known yet (runtime/mcp.py), and
        bring the workspace facts and project instructions prompt_for uses up to date.
        FailedPrecondition when the session's workspace is not on this machine: replicas share
        workspaces on one volume at one path, they do not route sessions to the replica holding them."""
        if session is not None:
            self._check_workspace(session)
            await self.prompts.refresh(self._workspace_of(session))
        await self.mcp.prepare(session)

    def _check_workspace(self, session: Session) -> None:
        if not Path(session.config.workspace).is_dir():
            raise FailedPrecondition(
                f"the workspace {session.config.workspace} of session {session.id!r} is not on this replica"
                f" ({self.settings.replica_id}): replicas must mount the workspaces on a shared volume"
                " at the same path"
            )

    def prompt_for(self, session: Session) -> str:
        return self.prompts.prompt(
            session.config.system_prompt, self._workspace_of(session), self.skills.instructions_for(session)
        )

    def _workspace_of(self, session: Session) -> Path:
        return Path(session.config.workspace) if session.config.workspace else self.workspace

    def replicas_own_run(self, session_id: str, run_id: str) -> AbstractAsyncContextManager[list[LogEntry]]:
        return self.replicas.own(session_id, run_id)

    @asynccontextmanager
    async def own_run(self, session_id: str, run_id: str) -> AsyncIterator[list[LogEntry]]:
        """The run's lease; when the run took a checkpoint, what its tools left is noted at its end."""
        async with self.replicas.own(session_id, run_id) as closing:
            try:
                yield closing
            finally:
                await self.checkpoints.turn_ended(session_id)

    async def turn_starting(
        self, session: Session, messages: list[Message], message_count: int, tools: list[Tool]
    ) -> None:
        if any(tool.lane != "query" for tool in tools):  # only a generation that may change files
            await self.checkpoints.turn_starting(session, messages, message_count)

    def _stop_fenced_run(self, session_id: str) -> None:
        """Another replica took this run over (its lease expired here): stop the run here."""
        try:
            task = self.control.of(session_id).run_task
        except NotFound:
            return
        if task is not None and not task.done():
            log.error("stopping the generation of session %s: its lease is another replica's now", session_id)
            task.cancel()

    def _serve_control(self) -> None:
        """What other replicas may ask this one to do to the runs it owns (app/control.py)."""
        control = self.control
        actions: dict[str, Callable[[str, dict[str, Any]], Any]] = {
            "cancel": lambda sid, a: control.cancel(sid, a.get("operation_id") or None),
            "inject": lambda sid, a: control.inject(sid, [Message.from_json(**m) for m in a["messages"]]),
            "steer": lambda sid, a: control.steer(sid, Message.from_json(**a["message"])),
            "confirm": lambda sid, a: control.confirm(sid, a["tool_id"], a["approved"], a["reason"]),
            "complete_external": lambda sid, a: control.complete_external(
                sid, a["task_id"], a["success"], a["result"], a["error"]
            ),
            "pending_external": lambda sid, a: [
                {**asdict(task), "lane": int(task.lane)} for task in control.pending_external(sid)
            ],
            "lane_stats": lambda sid, a: control.lane_stats(sid),
        }
        for name, action in actions.items():
            self.replicas.handle(name, _as_async(action))
        self.replicas.handle("pause", lambda sid, a: control.pause(sid))
        self.replicas.handle("initialized", lambda sid, a: self._initialized_elsewhere())
        self.replicas.handle("providers", lambda sid, a: self.provider_settings.load())
        self.replicas.handle("resume", lambda sid, a: control.resume(sid))

    def token_budget_for(self, session: Session) -> int:
        return effective_budget(session, self.init.token_budget)

    def tool_context(self, session: Session | None) -> ToolContext:
        workspace = Path(session.config.workspace) if session is not None else self.workspace
        return ToolContext(
            workspace=workspace,
            env=dict(self.init.env),
            session_id=session.id if session is not None else None,
            todos=self.todos,
            lsp=self.lsp,
            memories=self.memories,
        )


def _as_async(action: Callable[[str, dict[str, Any]], Any]) -> Callable[[str, dict[str, Any]], Any]:
    async def run(session_id: str, args: dict[str, Any]) -> Any:
        return action(session_id, args)

    return run


def _checkpoint_options(settings: Settings) -> CheckpointOptions:
    given = settings.checkpoints
    return CheckpointOptions(
        directory=given.directory or settings.resolved_data_dir / "checkpoints",
        keep=given.keep,
        max_age_hours=given.max_age_hours,
        max_file_bytes=given.max_file_bytes,
        enabled=given.enabled,
    )


def _store(settings: Settings) -> Store:
    """The SQLite file in the data directory, or PostgreSQL when --store names it."""
    if settings.store:
        from ..core.store.postgres_store import PostgresStore  # psycopg only when asked for

        return PostgresStore(settings.store, settings.replica_id)
    return SqliteStore(settings.resolved_data_dir / "sessions.db", settings.durability)
