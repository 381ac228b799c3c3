"""Which tools the face offers: the server's enabled built-in tools (the app layer's list for no
session, so Initialize's enabled/disabled tools apply), narrowed by the operator's names
(--mcp-tools), and `agent_task`. Listing and calling ask the same question at the time of the call."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ...app import Application
from ...tools.registry import Tool

AGENT_TASK = "agent_task"
SESSION_BOUND = frozenset({"todo"})
"""Tools that keep state in a session: an MCP client's calls run in none, so they are not offered
(inside agent_task's session the model has them)."""

log = logging.getLogger(__name__)


class Offer:
    """The tools one MCP server offers. `allowed` empty: every tool the server has, and agent_task."""

    def __init__(self, app: Application, allowed: Iterable[str] = ()) -> None:
        self._app = app
        self._allowed = frozenset(allowed)
        unknown = self._allowed - {tool.name for tool in app.tools.available(None)} - {AGENT_TASK}
        if unknown:
            log.warning(
                "--mcp-tools names tools the server does not offer (now): %s", ", ".join(sorted(unknown))
            )

    def _allows(self, name: str) -> bool:
        return not self._allowed or name in self._allowed

    def builtins(self) -> list[Tool]:
        """The server's own tools the caller may run, as the server has them now: not the tools of
        the MCP servers it uses itself (they are theirs to offer), nor a client's, nor those bound
        to a session."""
        return [
            tool
            for tool in self._app.tools.available(None)
            if not tool.external
            and tool.family != "mcp"
            and tool.name not in SESSION_BOUND
            and self._allows(tool.name)
        ]

    def builtin(self, name: str) -> Tool | None:
        """The offered tool `name`; None when the server has no such tool or the face hides it."""
        return next((tool for tool in self.builtins() if tool.name == name), None)

    @property
    def agent_task(self) -> bool:
        return self._allows(AGENT_TASK)
