"""A session's permission policy: get, set, add a rule, and check a call against it."""

from __future__ import annotations

from dataclasses import replace

from ..base.errors import InvalidArgument
from ..base.jsontext import parse_json
from ..core.permissions import Evaluation, PermissionPolicy, add_rule, evaluated
from ..runtime import Runtime


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
        """The decision for a call of `tool_name` with `arguments` (JSON object text; empty: {})."""
        policy = await self.get(session_id)
        parsed = parse_json(arguments or "{}", "arguments")
        if not isinstance(parsed, dict):
            raise InvalidArgument("arguments must be a JSON object")
        workspace = self._rt.sessions.get(session_id).config.workspace
        return await evaluated(policy, tool_name, parsed, workspace)
