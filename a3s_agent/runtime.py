"""The Runtime: one object holding the store, sessions, tools and settings, passed to every face."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import DESCRIPTION, HOMEPAGE, LICENSE, NAME, __version__
from .config import Settings
from .core.agent import Agent
from .core.client_tools import ClientTools
from .core.context import ContextManager
from .core.control import ControlPlane
from .core.events import EventBus
from .core.models import LLMConfig, Session
from .core.prompts import system_prompt
from .core.sessions import SessionManager, existing_directory
from .core.skill_catalog import SkillCatalog
from .core.sqlite_store import SqliteStore
from .core.store import Store
from .core.tool_runner import ToolRunner
from .llm.factory import ProviderCache
from .llm.messages import tool_schema
from .llm.modes import speaks_text_protocol
from .tools import containment
from .tools.registry import Tool, ToolContext, ToolRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentInfo:
    name: str = NAME
    version: str = __version__
    description: str = DESCRIPTION
    author: str = "a3s-agent developers"
    license: str = LICENSE
    homepage: str = HOMEPAGE


@dataclass
class Initialization:
    """What the last Initialize call set (empty until one is made)."""

    llm: LLMConfig | None = None
    env: dict[str, str] = field(default_factory=dict)
    enabled_tools: list[str] = field(default_factory=list)
    disabled_tools: list[str] = field(default_factory=list)
    tool_config: dict[str, str] = field(default_factory=dict)


class Runtime:
    def __init__(self, settings: Settings, store: Store | None = None, registry: ToolRegistry | None = None):
        self.settings = settings
        self.info = AgentInfo()
        self.workspace: Path = settings.workspace.resolve()
        self.store: Store = store or SqliteStore(settings.resolved_data_dir / "sessions.db")
        self.registry = registry or ToolRegistry()
        self.events = EventBus()
        self.sessions = SessionManager(
            self.store,
            default_workspace=lambda: self.workspace,
            workspace_root=settings.resolved_workspace_root,
            max_sessions=settings.max_sessions,
            max_context_tokens=settings.max_context_tokens,
            events=self.events,
        )
        self.control = ControlPlane(self.sessions, self.events)
        self.client_tools = ClientTools(self.sessions, self.registry)
        self.skills = SkillCatalog(
            self.sessions, settings, lambda: self.workspace, lambda: set(self.registry.names())
        )
        self.tools = ToolRunner(
            self.registry,
            self.sessions,
            self.tool_context,
            settings.max_tools_per_request,
            max_calls=settings.max_tool_calls,
        )
        self.providers = ProviderCache(
            timeout_s=settings.llm_timeout_s,
            max_retries=settings.llm_retries,
            tool_mode=settings.llm_tool_mode,
            relay_dir=settings.relay_dir,
        )
        self.context = ContextManager(
            self.sessions,
            self.events,
            llm_for=self.effective_llm,
            provider_for=self.providers.get,
            tool_schemas_for=lambda session: [tool_schema(t) for t in self.session_tools(session)],
            prompt_for=self.system_prompt,
        )
        self.agent = Agent(
            self.sessions,
            llm_for=self.effective_llm,
            provider_for=self.providers.get,
            context_for=self.tool_context,
            tools_for=self.session_tools,
            prompt_for=self.system_prompt,
            control=self.control,
            events=self.events,
            context=self.context,
            max_generations=settings.max_generations,
        )
        self.init = Initialization()
        self.started_at = time.monotonic()
        # Set when a client asks for Shutdown; the server's main loop waits on it.
        self.shutdown_requested = asyncio.Event()
        self.shutting_down = False
        self.containment: containment.Containment | None = None  # set by start

    async def start(self) -> None:
        # First: kill what a crashed previous server on this data dir left running.
        self.containment = containment.activate(self.settings.resolved_data_dir)
        await self.store.open()
        await self.sessions.load()
        await self.skills.rescan()
        log.info(
            "runtime ready: workspace=%s data=%s sessions=%d",
            self.workspace,
            self.settings.resolved_data_dir,
            len(self.sessions),
        )

    async def close(self) -> None:
        if self.containment is not None:  # every tool process still running ends with the server
            containment.deactivate(self.containment)
        self.events.close()
        await self.providers.close()
        await self.store.close()

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at

    def initialize(
        self,
        *,
        workspace: str,
        llm: LLMConfig | None,
        enabled_tools: list[str],
        disabled_tools: list[str],
        tool_config: dict[str, str],
        log_level: str | None,
        env: dict[str, str],
    ) -> None:
        """Apply an Initialize call. Everything is validated before anything changes."""
        new_workspace = self.workspace
        if workspace:
            new_workspace = existing_directory(workspace, "workspace")
        self.registry.configure(enabled_tools, disabled_tools)
        self.workspace = new_workspace
        self.init = Initialization(
            llm=llm if llm is not None and not llm.is_empty() else None,
            env=dict(env),
            enabled_tools=list(enabled_tools),
            disabled_tools=list(disabled_tools),
            tool_config=dict(tool_config),
        )
        if log_level:
            logging.getLogger("a3s_agent").setLevel(log_level)

    def effective_llm(self, session: Session | None = None) -> LLMConfig:
        """session config.llm > Initialize config.llm > server settings, field by field."""
        merged = self.settings.llm
        if self.init.llm is not None:
            merged = self.init.llm.merged_over(merged)
        if session is not None and session.config.llm is not None:
            merged = session.config.llm.merged_over(merged)
        return merged

    def configured_models(self) -> list[LLMConfig]:
        """The distinct models configured at server and Initialize level."""
        models = []
        for llm in (self.settings.llm, self.effective_llm()):
            if llm.model and all((m.provider, m.model) != (llm.provider, llm.model) for m in models):
                models.append(llm)
        return models

    def session_tools(self, session: Session | None) -> list[Tool]:
        """What a session's model may call: the enabled built-in tools, skill tools, client tools,
        and edit_lines (EDIT_FILE) for a model speaking the text protocol."""
        return [
            *self.registry.list(),
            *self.skills.tools_for(session),
            *self.client_tools.for_session(session),
            *self._text_protocol_tools(session),
        ]

    def _text_protocol_tools(self, session: Session | None) -> list[Tool]:
        """edit_lines, for a model speaking the CodingAgent text protocol (its EDIT_FILE)."""
        if not speaks_text_protocol(self.effective_llm(session).provider, self.settings.llm_tool_mode):
            return []
        from .llm.text_tools import EDIT_LINES_TOOL

        return [EDIT_LINES_TOOL]

    def system_prompt(self, session: Session) -> str:
        workspace = session.config.workspace or str(self.workspace)
        return system_prompt(session.config.system_prompt, workspace, self.skills.instructions_for(session))

    def tool_context(self, session: Session | None) -> ToolContext:
        workspace = Path(session.config.workspace) if session is not None else self.workspace
        return ToolContext(
            workspace=workspace,
            env=dict(self.init.env),
            session_id=session.id if session is not None else None,
        )
