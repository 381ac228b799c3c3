"""Permission: what a session made over ACP may do unasked, and the editor's answer when it must
ask (`session/request_permission`) mapped onto our confirmation flow.

A session made over ACP reads, searches, plans and starts subagents (`task`: each call of the
subagent is asked about as the session's own would be) unasked; every other call asks (its permission
policy's default decision is "ask", with the read-only tools allowed), and confirmation is on so
that the ask waits for the editor's answer. Allow once approves the call; allow always also adds
an allow rule to the session's policy (stored with it, so it holds after a restart); reject rejects
it. A session made elsewhere keeps its own policies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from acp.interfaces import Client
from acp.schema import AllowedOutcome, PermissionOption, ToolCallUpdate

from ...app import Application
from ...app.permissions import always_rule
from ...app.types import ConfirmationPolicy, Lane, PermissionPolicy, Tool
from ...base.errors import AgentError, NotFound
from .plan import PLAN_TOOL

log = logging.getLogger(__name__)

ALLOW_ONCE, ALLOW_ALWAYS, REJECT = "allow-once", "allow-always", "reject-once"
TASK_TOOL = "task"
READ_ONLY_FAMILIES = frozenset({"file", "code", "git"})
CONFIRMATION_TIMEOUT_MS = 30 * 60_000
"""How long a call waits for the editor's answer before it is rejected."""


def editor_policy(tools: Iterable[Tool]) -> PermissionPolicy:
    """Ask for everything but the local read-only tools (query lane: read, list, search, git
    status/diff/log), the plan and `task` (the subagent's calls ask under the same policy)."""
    allowed = [t.name for t in tools if t.lane == "query" and t.family in READ_ONLY_FAMILIES]
    return PermissionPolicy(allow=[*allowed, PLAN_TOOL, TASK_TOOL], default_decision="ask")


def editor_confirmation() -> ConfirmationPolicy:
    """Confirmation on, asked only where the permission policy says ask (every lane is a "yolo"
    lane for the confirmation policy's own list, which would otherwise ask for every call)."""
    return ConfirmationPolicy(
        enabled=True, default_timeout_ms=CONFIRMATION_TIMEOUT_MS, yolo_lanes=[int(lane) for lane in Lane]
    )


def options(rule: str | None) -> list[PermissionOption]:
    choices = [PermissionOption(option_id=ALLOW_ONCE, name="Allow once", kind="allow_once")]
    if rule is not None:
        choices.append(
            PermissionOption(option_id=ALLOW_ALWAYS, name=f"Always allow {rule}", kind="allow_always")
        )
    choices.append(PermissionOption(option_id=REJECT, name="Reject", kind="reject_once"))
    return choices


class Asker:
    """Asks the editor about one call and gives its answer to the waiting tool call (a
    subagent's: in its session; allow always is a rule of the editor's session all the same)."""

    def __init__(self, app: Application, client: Client) -> None:
        self._app = app
        self._client = client

    async def ask(
        self,
        session_id: str,
        call: ToolCallUpdate,
        tool_name: str,
        arguments: dict[str, Any],
        tool_id: str,
        child_session_id: str = "",
    ) -> None:
        """Ask about `call` of the session (`tool_id` of its subagent `child_session_id`, if one)."""
        rule = always_rule(tool_name, arguments)
        offered = options(rule)
        waiting = child_session_id or session_id
        try:
            response = await self._client.request_permission(
                session_id=session_id, tool_call=call, options=offered
            )
        except Exception as exc:  # no answer, or not one of ACP's: the call is not approved
            self._decide(waiting, tool_id, False, f"the editor did not answer: {exc}")
            return
        outcome = response.outcome
        chosen = outcome.option_id if isinstance(outcome, AllowedOutcome) else None
        if chosen not in {option.option_id for option in offered}:
            self._decide(waiting, tool_id, False, f"{chosen or 'cancelled'} in the editor")
            return
        if chosen == ALLOW_ALWAYS and rule is not None:  # the session's: its children copy it
            try:
                await self._app.permissions.add_rule(session_id, "allow", rule)
            except AgentError as exc:
                log.warning("could not keep the rule %s for session %s: %s", rule, session_id, exc)
        self._decide(waiting, tool_id, chosen != REJECT, f"{chosen} in the editor")

    def _decide(self, session_id: str, tool_id: str, approved: bool, reason: str) -> None:
        try:
            self._app.control.confirm_own(session_id, tool_id, approved, reason)
        except NotFound:
            log.info("tool call %s no longer waits for confirmation (%s)", tool_id, reason)
