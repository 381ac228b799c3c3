"""Health, capabilities, Initialize and Shutdown."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..base.models import LLMConfig, SessionState
from ..runtime import AgentInfo, Runtime
from ..tools.registry import Tool


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


class Lifecycle:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @property
    def info(self) -> AgentInfo:
        return self._rt.info

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
        )

    def capabilities(self) -> Capabilities:
        rt = self._rt
        return Capabilities(
            info=rt.info,
            tools=rt.registry.enabled(),
            models=rt.configured_models(),
            limits=Limits(
                max_context_tokens=rt.settings.max_context_tokens,
                max_concurrent_sessions=rt.settings.max_sessions,
                max_tools_per_request=rt.settings.max_tools_per_request,
            ),
            store=rt.store.backend,
        )

    async def initialize(
        self,
        *,
        workspace: str,
        llm: LLMConfig | None,
        enabled_tools: list[str],
        disabled_tools: list[str],
        tool_config: dict[str, str],
        log_level: str | None,
        env: dict[str, str],
    ) -> Path:
        """Apply and store an Initialize (see Runtime.initialize); the server's workspace after it."""
        await self._rt.initialize(
            workspace=workspace,
            llm=llm,
            enabled_tools=enabled_tools,
            disabled_tools=disabled_tools,
            tool_config=tool_config,
            log_level=log_level,
            env=env,
        )
        return self._rt.workspace

    def request_shutdown(self) -> None:
        """The server's main loop stops serving and exits."""
        self._rt.shutdown_requested.set()
