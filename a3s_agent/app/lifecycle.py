"""Health, capabilities, Initialize and Shutdown."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..base.models import LLMConfig, SessionState
from ..config import Settings
from ..runtime import AgentInfo, Runtime
from ..runtime.initialization import InitializeRequest
from ..runtime.providers import credentials_problem
from ..tools.registry import Tool

__all__ = ["AgentInfo", "Capabilities", "Health", "InitializeRequest", "Initialized", "Lifecycle", "Limits"]


@dataclass(frozen=True)
class Health:
    shutting_down: bool
    version: str
    uptime_s: float
    sessions: int
    active_sessions: int
    histories_in_memory: int
    workspace: Path
    store: str
    durability: str
    sandbox: dict[str, str]
    """The OS sandbox of tool processes: mechanism, network, the operator's extra paths (tools/sandbox/)."""


@dataclass(frozen=True)
class Limits:
    max_context_tokens: int
    max_concurrent_sessions: int
    max_tools_per_request: int


@dataclass(frozen=True)
class Capabilities:
    info: AgentInfo
    tools: list[Tool]
    models: list[LLMConfig]
    limits: Limits
    store: str
    sandbox: dict[str, str]
    cron: bool = False
    """Whether the scheduled-jobs group is served (--enable-cron)."""
    checkpoints: bool = False
    """Whether sessions' workspaces are checkpointed (A3S_CHECKPOINTS)."""


@dataclass(frozen=True)
class Initialized:
    workspace: Path
    """The server's workspace after the Initialize."""
    warning: str = ""
    """What the first Generate would fail with under the model it set ("": nothing known)."""

    @property
    def message(self) -> str:
        """The reply's message: what was done, and the warning if any."""
        return f"initialized; workspace {self.workspace}" + (f"; {self.warning}" if self.warning else "")


class Lifecycle:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @property
    def info(self) -> AgentInfo:
        return self._rt.info

    @property
    def workspace(self) -> Path:
        """The server's workspace (an Initialize may change it)."""
        return self._rt.workspace

    @property
    def data_dir(self) -> Path:
        return self._rt.settings.resolved_data_dir

    @property
    def settings(self) -> Settings:
        """The server's settings (listeners, token, TLS, limits), for the faces that serve them."""
        return self._rt.settings

    @property
    def stopping(self) -> bool:
        return self._rt.shutting_down

    def begin_stop(self) -> None:
        """The server stops: HealthCheck says so and the faces refuse new work from now on."""
        self._rt.shutting_down = True

    def add_tool_env(self, values: Mapping[str, str]) -> None:
        """Variables every tool gets in its environment from now on, as if an Initialize had given
        them, but not stored: a restart forgets them (e.g. the coven gateway's secrets)."""
        self._rt.init.env.update(values)

    def health(self) -> Health:
        rt = self._rt
        return Health(
            shutting_down=rt.shutting_down,
            version=rt.info.version,
            uptime_s=rt.uptime_s,
            sessions=len(rt.sessions),
            active_sessions=rt.sessions.count(SessionState.ACTIVE),
            histories_in_memory=rt.sessions.histories_in_memory,
            workspace=rt.workspace,
            store=rt.store.backend,
            durability=rt.store.durability,
            sandbox=rt.sandbox.describe(),
        )

    def capabilities(self) -> Capabilities:
        rt = self._rt
        return Capabilities(
            info=rt.info,
            tools=[*rt.registry.enabled(), *rt.mcp.tools_for(None)],
            models=rt.configured_models(),
            limits=Limits(
                max_context_tokens=rt.settings.max_context_tokens,
                max_concurrent_sessions=rt.settings.max_sessions,
                max_tools_per_request=rt.settings.max_tools_per_request,
            ),
            store=rt.store.backend,
            sandbox=rt.sandbox.describe(),
            cron=rt.cron.enabled,
            checkpoints=rt.checkpoints.enabled,
        )

    async def initialize(self, request: InitializeRequest) -> Initialized:
        """Apply and store an Initialize (see Runtime.initialize). It succeeds even when the model
        it leaves configured has no key for its public API (sessions may bring one), but says so."""
        await self._rt.initialize(request)
        llm = self._rt.llm_for()
        problem = credentials_problem(llm) if llm.model else None
        return Initialized(self._rt.workspace, problem or "")

    def request_shutdown(self) -> None:
        """The server's main loop stops serving and exits."""
        self._rt.shutdown_requested.set()

    async def shutdown_requested(self) -> None:
        """Return once a shutdown is requested (a Shutdown call, a signal)."""
        await self._rt.shutdown_requested.wait()
