"""Which skills exist and which are loaded where.

Available skills come from the skill directories (scanned at start and on ListSkills) or are sent
by a client (LoadSkill with content). Loading a skill for a session adds its instructions to the
system prompt, its tools to the session's tools and its `allowed-tools` to the session's allow
rules; session loads are stored with the session (as the skill's text) and survive a restart.
Server-wide loads (empty session id) last until the server stops.

The repository being worked on is not trusted, the operator is. Skills from the operator's
directories (--skills-dir, A3S_SKILL_DIRS, /a3s/skills, and last the example skills packaged with
a3s-agent) win over the workspace's own (`<workspace>/.a3s/skills`): a workspace skill with an
operator skill's name is listed as shadowed and never loaded in its place. A workspace skill's `allowed-tools` become allow rules only when
the server runs with --trust-workspace-skills; otherwise they are ignored, with a warning. A
network of their own (a skill's `sandbox-network`, its MCP servers' `sandbox_network`) only the
operator's skills get: a workspace skill's is ignored, with a warning, a client's refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from ...base.errors import FailedPrecondition, InvalidArgument, NotFound
from ...config import BOX_SKILLS_DIR
from ...tools.mcp.config import ServerSpec, StdioServer, refuse_commands, refuse_networks
from ...tools.registry import Tool
from ..policy.rules import parse_rule
from ..sessions.manager import SessionManager
from ..store.session import Session, SessionSettings, StoredSkill

if TYPE_CHECKING:
    from ...config import Settings
    from .skill import Skill

log = logging.getLogger(__name__)

# The examples shipped in the package: found without flags, after (and beneath) the operator's own.
EXAMPLE_SKILLS_DIR = Path(__file__).resolve().parents[2] / "example_skills"

Origin = Literal["operator", "workspace", "client"]

# The skill format (YAML, HTTP backends) is imported only once there is a skill to read: most
# servers have none, and its imports are a good part of the start-up time.


def _built(skill: Skill, origin: Origin) -> LoadedSkill:
    """The skill loaded, its tools built: with its own network only when it is the operator's."""
    return LoadedSkill(
        skill, skill.build_tools(skill.sandbox_network if origin == "operator" else ""), origin
    )


def parse_skill(text: str, *, source: str, secret_names: frozenset[str]) -> Skill:
    from .skill import parse_skill as parse

    return parse(text, source=source, secret_names=secret_names)


@dataclass
class LoadedSkill:
    skill: Skill
    tools: list[Tool]
    origin: Origin


@dataclass(frozen=True)
class Found:
    skill: Skill
    origin: Origin


@dataclass(frozen=True)
class Listed:
    """A ListSkills entry: the skill and its metadata strings."""

    skill: Skill
    metadata: dict[str, str]


def _stored_origin(entry: StoredSkill) -> Origin:
    """Where a session's stored skill came from; sessions stored before origins were kept count
    a file's skill as the workspace's (the cautious choice: its allowed-tools need trust)."""
    if entry.origin:
        return cast(Origin, entry.origin)
    return "client" if entry.source == "client" else "workspace"


class SkillCatalog:
    def __init__(
        self,
        sessions: SessionManager,
        settings: Settings,
        workspace: Callable[[], Path],
        builtin_names: Callable[[], set[str]],
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._workspace = workspace
        self._builtin_names = builtin_names
        self._available: dict[str, Found] = {}
        self._shadowed: dict[str, Found] = {}  # workspace skills an operator skill of the name hides
        self._server_wide: dict[str, LoadedSkill] = {}
        self._parsed: dict[tuple[Origin, str], LoadedSkill | None] = {}  # sessions share parsed skills

    def operator_dirs(self) -> list[Path]:
        """The operator's skill directories that exist, in order of precedence."""
        return [d for d in [*self._settings.skill_dirs, BOX_SKILLS_DIR, EXAMPLE_SKILLS_DIR] if d.is_dir()]

    def _workspace_dir(self, operator_dirs: list[Path]) -> Path | None:
        path = self._workspace() / ".a3s" / "skills"
        if not path.is_dir() or path.resolve() in {d.resolve() for d in operator_dirs}:
            return None  # (one the operator names is the operator's)
        return path

    def trusted(self, origin: Origin) -> bool:
        """Whether a skill's allowed-tools become allow rules."""
        return origin != "workspace" or self._settings.trust_workspace_skills

    async def rescan(self) -> None:
        operator_dirs = self.operator_dirs()
        workspace_dir = self._workspace_dir(operator_dirs)
        if not operator_dirs and workspace_dir is None:  # (the skill format's imports are paid only then)
            self._available, self._shadowed = {}, {}
            return
        from .skill import scan_skill_dirs

        secrets = self._settings.secret_env_names
        operators = await asyncio.to_thread(scan_skill_dirs, operator_dirs, secrets)
        workspaces = await asyncio.to_thread(
            scan_skill_dirs, [workspace_dir] if workspace_dir else [], secrets
        )
        self._available = {
            **{name: Found(skill, "workspace") for name, skill in workspaces.items()},
            **{name: Found(skill, "operator") for name, skill in operators.items()},
        }
        self._shadowed = {
            name: Found(skill, "workspace") for name, skill in workspaces.items() if name in operators
        }

    def _loaded(self, entry: StoredSkill) -> LoadedSkill | None:
        """A session's stored skill, parsed once; None (with a warning) when it no longer parses."""
        origin = _stored_origin(entry)
        key = (origin, entry.text)
        if key not in self._parsed:
            try:
                skill = parse_skill(
                    entry.text, source=entry.source, secret_names=self._settings.secret_env_names
                )
            except InvalidArgument as exc:
                log.warning("leaving out a stored skill that no longer loads: %s", exc)
                self._parsed[key] = None
            else:
                self._parsed[key] = _built(skill, origin)
        return self._parsed[key]

    def loaded_for(self, session: Session | None) -> list[LoadedSkill]:
        return self._loaded_with(session.settings if session is not None else None)

    def _loaded_with(self, settings: SessionSettings | None) -> list[LoadedSkill]:
        """The server-wide skills and those `settings` (a session's) hold."""
        loaded = list(self._server_wide.values())
        if settings is not None:
            stored = [self._loaded(entry) for entry in settings.skills.values()]
            loaded += [item for item in stored if item is not None]
        return loaded

    def tools_for(self, session: Session | None) -> list[Tool]:
        return [tool for loaded in self.loaded_for(session) for tool in loaded.tools]

    def mcp_servers_for(self, session: Session | None) -> list[tuple[bool, dict[str, ServerSpec], bool]]:
        """(loaded into the session rather than server-wide, its servers, whether it is the
        operator's) for each loaded skill that brings MCP servers and may: a repository's skill
        only when workspace skills are trusted."""
        server_wide = [(False, item) for item in self._server_wide.values()]
        stored = session.settings.skills.values() if session is not None else ()
        own = [(True, item) for entry in stored if (item := self._loaded(entry)) is not None]
        return [
            (in_session, item.skill.mcp_servers, item.origin == "operator")
            for in_session, item in [*server_wide, *own]
            if item.skill.mcp_servers and self.trusted(item.origin)
        ]

    def instructions_for(self, session: Session | None) -> list[tuple[str, str]]:
        return [(item.skill.name, item.skill.instructions) for item in self.loaded_for(session)]

    def listing(self, session: Session | None) -> list[Listed]:
        """Every available and loaded skill, by name; a shadowed workspace skill comes just before
        the skill of its name that hides it (so a client keeping the last entry per name keeps that)."""
        loaded = {item.skill.name: Found(item.skill, item.origin) for item in self.loaded_for(session)}
        entries = [(name, 0, found, False) for name, found in self._shadowed.items()]
        entries += [(name, 1, found, name in loaded) for name, found in (self._available | loaded).items()]
        return [
            Listed(
                found.skill,
                {
                    "source": found.skill.source,
                    "origin": found.origin,
                    "loaded": str(is_loaded).lower(),
                    "shadowed": str(rank == 0).lower(),
                    "allowed-tools": ", ".join(found.skill.allowed_tools),
                    "trusted": str(self.trusted(found.origin)).lower(),
                },
            )
            for name, rank, found, is_loaded in sorted(entries, key=lambda entry: entry[:2])
        ]

    async def load(self, session_id: str, name: str, content: str | None) -> list[str]:
        """Activate a skill; returns the names of the tools it added."""
        if not name and not content:
            raise InvalidArgument("skill_name (or skill_content) is required")
        if content:
            skill = parse_skill(content, source="client", secret_names=self._settings.secret_env_names)
            origin: Origin = "client"
            if name and skill.name != name:
                raise InvalidArgument(f"skill_name {name!r} does not match the skill's name {skill.name!r}")
        else:
            await self.rescan()
            if name not in self._available:
                raise NotFound(f"no skill named {name!r} (ListSkills shows the available ones)")
            skill, origin = self._available[name].skill, self._available[name].origin
        return await self.activate(session_id, skill, origin)

    async def activate(self, session_id: str, skill: Skill, origin: Origin) -> list[str]:
        """Load `skill` (from `origin`) into the session, or server-wide for an empty id; the names
        of the tools it added."""
        session = self._sessions.get(session_id) if session_id else None
        self._check_tool_names(skill, session)
        loaded = _built(skill, origin)
        self._parsed[(origin, skill.text)] = loaded
        self._check_mcp_servers(skill, origin)
        self._check_network(skill, origin)
        if skill.allowed_tools and not self.trusted(origin):
            log.warning(
                "skill %r from the workspace (%s) lists allowed-tools %s: ignored, since a repository's "
                "skills grant no permissions unless the server runs with --trust-workspace-skills",
                skill.name,
                skill.source,
                ", ".join(skill.allowed_tools),
            )
        if session is None:
            self._server_wide[skill.name] = loaded
        else:
            stored = StoredSkill(skill.text, skill.source, origin)
            await self._sessions.update_settings(
                session_id,
                lambda s: self._with_allow_rules(replace(s, skills={**s.skills, skill.name: stored})),
            )
        return skill.tool_names

    async def unload(self, session_id: str, name: str) -> list[str]:
        if not session_id:
            loaded = self._server_wide.pop(name, None)
            if loaded is None:
                raise NotFound(f"skill {name!r} is not loaded server-wide")
            return loaded.skill.tool_names
        removed: list[StoredSkill] = []

        def without(settings: SessionSettings) -> SessionSettings:
            skills = dict(settings.skills)
            entry = skills.pop(name, None)
            if entry is None:
                raise NotFound(f"skill {name!r} is not loaded in session {session_id!r}")
            removed.append(entry)
            return self._with_allow_rules(replace(settings, skills=skills))

        await self._sessions.update_settings(session_id, without)
        loaded = self._loaded(removed[0])
        return loaded.skill.tool_names if loaded is not None else []

    def _check_network(self, skill: Skill, origin: Origin) -> None:
        """A network of its own (the skill's, its servers'): refused from a client, left out (with a
        warning) from the workspace; only the operator's skills get one."""
        servers = [
            n
            for n, spec in skill.mcp_servers.items()
            if isinstance(spec, StdioServer) and spec.sandbox_network
        ]
        if origin == "client" and skill.sandbox_network:
            raise FailedPrecondition(
                f"skill {skill.name!r} names a sandbox-network; only the operator's skills (its skill"
                " directories) give their processes a network of their own"
            )
        if origin == "client":
            refuse_networks(skill.mcp_servers, f"skill {skill.name!r} mcp-servers")
        elif origin == "workspace" and (skill.sandbox_network or servers):
            log.warning(
                "skill %r from the workspace (%s) names a sandbox network (%s): ignored, since only the"
                " operator's skills get a network of their own",
                skill.name,
                skill.source,
                ", ".join(
                    ([f"sandbox-network {skill.sandbox_network}"] if skill.sandbox_network else []) + servers
                ),
            )

    def _check_mcp_servers(self, skill: Skill, origin: Origin) -> None:
        """A skill sent over the API brings commands only where the API may; a repository's skill
        brings no servers unless trusted (they are ignored, with a warning)."""
        if not skill.mcp_servers:
            return
        if origin == "client":
            refuse_commands(
                skill.mcp_servers,
                f"skill {skill.name!r} mcp-servers",
                allowed=self._settings.allow_api_mcp_commands,
            )
        elif not self.trusted(origin):
            log.warning(
                "skill %r from the workspace (%s) brings MCP servers %s: ignored, since a repository's"
                " skills start no servers unless the server runs with --trust-workspace-skills",
                skill.name,
                skill.source,
                ", ".join(skill.mcp_servers),
            )

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

    def _with_allow_rules(self, settings: SessionSettings) -> SessionSettings:
        """`settings` with its allow rules made its own plus the allowed-tools of its loaded
        trusted skills."""
        policy = replace(settings.permission_policy)
        own = [rule for rule in policy.allow if rule not in settings.skill_rules]
        from_skills: list[str] = []
        for item in self._loaded_with(settings):
            if not self.trusted(item.origin):
                continue
            for rule in item.skill.allowed_tools:
                try:
                    parse_rule(rule)
                except InvalidArgument:
                    continue  # a skill's note that is not a rule does not break the policy
                if rule not in own and rule not in from_skills:
                    from_skills.append(rule)
        policy.allow = [*own, *from_skills]
        return replace(settings, permissions=policy, skill_rules=from_skills)
