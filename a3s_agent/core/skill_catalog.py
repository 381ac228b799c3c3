"""Which skills exist and which are loaded where.

Available skills come from the skill directories (scanned at start and on ListSkills) or are sent
by a client (LoadSkill with content). Loading a skill for a session adds its instructions to the
system prompt, its tools to the session's tools and its `allowed-tools` to the session's allow
rules; session loads are stored with the session (as the skill's text) and survive a restart.
Server-wide loads (empty session id) last until the server stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..tools.registry import Tool
from .errors import InvalidArgument, NotFound
from .models import Session
from .permissions import PermissionPolicy, parse_rule
from .sessions import SessionManager

if TYPE_CHECKING:
    from .skills import Skill

# The skill format (YAML, HTTP backends) is imported only once there is a skill to read: most
# servers have none, and its imports are a good part of the start-up time.


def parse_skill(text: str, *, source: str) -> Skill:
    from .skills import parse_skill as parse

    return parse(text, source=source)


@dataclass
class LoadedSkill:
    skill: Skill
    tools: list[Tool]


class SkillCatalog:
    def __init__(
        self, sessions: SessionManager, dirs: Callable[[], list[Path]], builtin_names: Callable[[], set[str]]
    ) -> None:
        self._sessions = sessions
        self._dirs = dirs
        self._builtin_names = builtin_names
        self.available: dict[str, Skill] = {}
        self._server_wide: dict[str, LoadedSkill] = {}
        self._parsed: dict[str, LoadedSkill] = {}  # by skill text: sessions share parsed skills

    async def rescan(self) -> None:
        dirs = [d for d in self._dirs() if d.is_dir()]
        if not dirs:  # (the skill format's imports are paid only when there are skills)
            self.available = {}
            return
        from .skills import scan_skill_dirs

        self.available = await asyncio.to_thread(scan_skill_dirs, dirs)

    def _loaded(self, text: str, source: str) -> LoadedSkill:
        if text not in self._parsed:
            skill = parse_skill(text, source=source)
            self._parsed[text] = LoadedSkill(skill, skill.build_tools())
        return self._parsed[text]

    def loaded_for(self, session: Session | None) -> list[LoadedSkill]:
        loaded = list(self._server_wide.values())
        if session is not None:
            loaded += [
                self._loaded(e["text"], e["source"]) for e in session.extras.get("skills", {}).values()
            ]
        return loaded

    def tools_for(self, session: Session | None) -> list[Tool]:
        return [tool for loaded in self.loaded_for(session) for tool in loaded.tools]

    def instructions_for(self, session: Session | None) -> list[tuple[str, str]]:
        return [(item.skill.name, item.skill.instructions) for item in self.loaded_for(session)]

    async def load(self, session_id: str, name: str, content: str | None) -> list[str]:
        """Activate a skill; returns the names of the tools it added."""
        if not name and not content:
            raise InvalidArgument("skill_name (or skill_content) is required")
        if content:
            skill = parse_skill(content, source="client")
            if name and skill.name != name:
                raise InvalidArgument(f"skill_name {name!r} does not match the skill's name {skill.name!r}")
        else:
            await self.rescan()
            if name not in self.available:
                raise NotFound(f"no skill named {name!r} (ListSkills shows the available ones)")
            skill = self.available[name]
        session = self._sessions.get(session_id) if session_id else None
        self._check_tool_names(skill, session)
        loaded = LoadedSkill(skill, skill.build_tools())
        self._parsed[skill.text] = loaded
        if session is None:
            self._server_wide[skill.name] = loaded
        else:
            skills = {
                **session.extras.get("skills", {}),
                skill.name: {"text": skill.text, "source": skill.source},
            }
            await self._sessions.set_extra(session_id, "skills", skills)
            await self._update_allow_rules(session_id)
        return skill.tool_names

    async def unload(self, session_id: str, name: str) -> list[str]:
        if not session_id:
            loaded = self._server_wide.pop(name, None)
            if loaded is None:
                raise NotFound(f"skill {name!r} is not loaded server-wide")
            return loaded.skill.tool_names
        session = self._sessions.get(session_id)
        skills = dict(session.extras.get("skills", {}))
        entry = skills.pop(name, None)
        if entry is None:
            raise NotFound(f"skill {name!r} is not loaded in session {session_id!r}")
        await self._sessions.set_extra(session_id, "skills", skills)
        await self._update_allow_rules(session_id)
        return self._loaded(entry["text"], entry["source"]).skill.tool_names

    def _check_tool_names(self, skill: Skill, session: Session | None) -> None:
        taken = self._builtin_names() | {
            tool.name
            for item in self.loaded_for(session)
            if item.skill.name != skill.name
            for tool in item.tools
        }
        clashes = sorted(set(skill.tool_names) & taken)
        if clashes:
            raise InvalidArgument(
                f"skill {skill.name!r} defines tools that already exist: {', '.join(clashes)}"
            )

    async def _update_allow_rules(self, session_id: str) -> None:
        """The session's allow rules: its own, plus the allowed-tools of its loaded skills."""
        session = self._sessions.get(session_id)
        stored = session.extras.get("permissions") or {}
        policy = PermissionPolicy.from_dict(stored)
        own = [rule for rule in policy.allow if rule not in session.extras.get("skill_rules", [])]
        from_skills = []
        for item in self.loaded_for(session):
            for rule in item.skill.allowed_tools:
                try:
                    parse_rule(rule)
                except InvalidArgument:
                    continue  # a skill's note that is not a rule does not break the policy
                if rule not in own and rule not in from_skills:
                    from_skills.append(rule)
        policy.allow = [*own, *from_skills]
        await self._sessions.set_extra(session_id, "permissions", policy.to_dict())
        await self._sessions.set_extra(session_id, "skill_rules", from_skills)
