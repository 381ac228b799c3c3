"""Which tools the face offers: the server's enabled built-in tools (the app layer's list for no
session, so Initialize's enabled/disabled tools apply), narrowed by the operator's names
(--mcp-tools), and `agent_task`. Listing and calling ask the same question at the time of the call."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ...app import Application
from ...app.types import Tool

AGENT_TASK = "agent_task"
LEFT_OUT = frozenset({"todo", "ask_user", "task"})
"""Built-in tools an MCP client's calls could not use: todo keeps its list in a session, ask_user
hands its question to the host of a run (an external task), and task starts a subagent of a run.
The calls run in none, the calling agent asks its own user and agent_task runs the agent itself.
Inside agent_task's session the model has all three."""

log = logging.getLogger(__name__)


class Offer:
    """The tools one MCP server offers. `allowed` empty: every tool the server has, and agent_task."""

    def __init__(self, app: Application, allowed: Iterable[str] = ()) -> None:
        self._app = app
        self._allowed = frozenset(allowed)
        unknown = self._allowed - {tool.name for tool in self._offerable()} - {AGENT_TASK}
        if unknown:
            log.warning(
                "--mcp-tools names tools the MCP server does not offer (now): %s", ", ".join(sorted(unknown))
            )

    def _allows(self, name: str) -> bool:
        return not self._allowed or name in self._allowed

    def _offerable(self) -> list[Tool]:
        """The server's own tools as it has them now but LEFT_OUT: not the tools of the MCP servers
        it uses itself (they are theirs to offer), nor a client's (its registrant runs them)."""
        return [
            tool
            for tool in self._app.tools.available(None)
            if not tool.external and tool.family != "mcp" and tool.name not in LEFT_OUT
        ]

    def builtins(self) -> list[Tool]:
        """The server's own tools the caller may run: the offerable ones `allowed` names."""
        return [tool for tool in self._offerable() if self._allows(tool.name)]

    def builtin(self, name: str) -> Tool | None:
        """The offered tool `name`; None when the server has no such tool or the face hides it."""
        return next((tool for tool in self.builtins() if tool.name == name), None)

    @property
    def agent_task(self) -> bool:
        return self._allows(AGENT_TASK)
