"""A session's permission policy: get, set, add a rule, and check a call against it."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from typing import Any

from ..base.errors import InvalidArgument
from ..base.jsontext import parse_json
from ..core.policy.permissions import Evaluation, PermissionPolicy, add_rule, evaluated
from ..core.policy.rules import canonical_tool_name
from ..core.policy.shell_grants import file_writes, parsed_line
from ..core.store.session import Session
from ..runtime import Runtime
from ..tools.registry import RuleSubject

_COMMAND_WORD = re.compile(r"[A-Za-z0-9_./+-]+")


class Permissions:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def get(self, session_id: str) -> PermissionPolicy:
        await self._rt.sessions.refresh(session_id)
        return self._rt.sessions.get(session_id).settings.permission_policy

    async def set(self, session_id: str, policy: PermissionPolicy) -> PermissionPolicy:
        await self._rt.sessions.refresh(session_id)
        await self._rt.sessions.update_settings(session_id, lambda s: replace(s, permissions=policy))
        return policy

    async def add_rule(self, session_id: str, rule_type: str, rule: str) -> None:
        """Append `rule` to the `rule_type` list (allow, deny or ask) of the session's policy."""
        await self._rt.sessions.refresh(session_id)
        await self._rt.sessions.update_settings(
            session_id,
            lambda s: replace(s, permissions=add_rule(s.permission_policy, rule_type, rule)),
        )

    async def check(self, session_id: str, tool_name: str, arguments: str) -> Evaluation:
        """The decision for a call of `tool_name` with `arguments` (JSON object text; empty: {}),
        matched as the tool of that name declares (its rule subject)."""
        policy = await self.get(session_id)
        parsed = parse_json(arguments or "{}", "arguments")
        if not isinstance(parsed, dict):
            raise InvalidArgument("arguments must be a JSON object")
        session = self._rt.sessions.get(session_id)
        subject = self._subject(session, tool_name)
        return await evaluated(policy, tool_name, parsed, session.config.workspace, subject=subject)

    def _subject(self, session: Session, tool_name: str) -> RuleSubject | None:
        """The rule subject of the tool `tool_name` names (as rules name tools: any case, aliases
        too): a registered one, enabled or not, or one the session may call; None for no tool."""
        wanted = canonical_tool_name(tool_name)
        tools = (*self._rt.registry.registered(), *self._rt.tools_for(session))
        return next((tool.rule_subject for tool in tools if canonical_tool_name(tool.name) == wanted), None)


def always_rule(tool_name: str, arguments: dict[str, Any]) -> str | None:
    """The allow rule "allow always" adds: the command's first word for bash (`bash(pytest:*)`),
    the whole tool otherwise. None when such a rule would not allow the command again: it has no
    plain first word, the parser cannot read it, or it writes a file through a redirection or
    `tee` (a rule for the program does not cover that write)."""
    if tool_name != "bash":
        return tool_name
    command = arguments.get("command")
    try:
        words = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        return None
    if not words or "=" in words[0] or not _COMMAND_WORD.fullmatch(words[0]):
        return None
    line = parsed_line(str(command))
    if line is None or file_writes(line):
        return None
    return f"bash({words[0]}:*)"
