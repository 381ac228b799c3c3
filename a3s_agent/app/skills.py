"""Skills: load into and unload from a session, list them, show one's definition, load a directory's,
list Claude Code's, and search and install from the operator's skill sources."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.errors import FailedPrecondition, InvalidArgument
from ..core.skills.catalog import Listed
from ..core.skills.from_dir import claude_code_places, directory_skills, resolve_directory
from ..core.skills.installing import Installed, SkillSources
from ..runtime import Runtime

if TYPE_CHECKING:
    from ..core.skills.skill import Skill

__all__ = ["FromDirectory", "Installed", "SearchResult", "SkillDetail", "Skills"]


@dataclass(frozen=True)
class SkillDetail:
    """A skill's whole definition, as A3S Code's Skill and the TypeScript SDK's ClaudeCodeSkill give it."""

    name: str
    description: str
    allowed_tools: str | None
    disable_model_invocation: bool
    content: str  # the markdown instructions
    metadata: dict[str, str]
    kind: str  # instruction, tool or agent (the frontmatter's `kind`, else instruction)


@dataclass(frozen=True)
class FromDirectory:
    loaded: list[str]
    errors: list[str]


@dataclass(frozen=True)
class SearchResult:
    name: str
    description: str
    url: str  # the source's location, and the skill's directory in it
    install_source: str  # what InstallSkill takes


class Skills:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._sources = SkillSources(runtime.settings.skill_sources, runtime.settings.secret_env_names)

    async def load(self, session_id: str, name: str, content: str | None) -> list[str]:
        """Load a skill by name, or from `content` (SKILL.md text); the names of its tools."""
        await self._rt.sessions.refresh(session_id)
        return await self._rt.skills.load(session_id, name, content)

    async def unload(self, session_id: str, name: str) -> list[str]:
        """The names of the tools removed with the skill (its MCP servers stop unless still used)."""
        await self._rt.sessions.refresh(session_id)
        removed = await self._rt.skills.unload(session_id, name)
        await self._mcp_changed(session_id)
        return removed

    async def _mcp_changed(self, session_id: str) -> None:
        if session_id:
            await self._rt.mcp.session_changed(self._rt.sessions.get(session_id))
        else:
            await self._rt.mcp.server_changed()

    async def listing(self, session_id: str | None) -> list[Listed]:
        """The skills on disk (scanned afresh) merged with the session's loaded ones."""
        await self._rt.sessions.refresh(session_id or "")
        session = self._rt.sessions.get(session_id) if session_id else None
        await self._rt.skills.rescan()
        return self._rt.skills.listing(session)

    async def details(self, name: str | None) -> list[SkillDetail]:
        """Every available skill's definition (ListSkills' entries), or those named `name` (none
        when there is no such skill)."""
        listing = await self.listing(None)
        return [_detail(e.skill, e.metadata) for e in listing if name is None or e.skill.name == name]

    async def claude_code(self, name: str | None) -> list[SkillDetail]:
        """The skills in Claude Code's places: `.claude/skills` of the workspace, then the user's
        `~/.claude/skills`; those named `name` when given."""
        from ..core.skills.skill import scan_skill_dirs

        found: list[SkillDetail] = []
        for place, origin in claude_code_places(self._rt.workspace, Path.home()):
            skills = await asyncio.to_thread(scan_skill_dirs, [place], self._rt.settings.secret_env_names)
            found += [
                _detail(skill, {"source": skill.source, "origin": origin})
                for skill in skills.values()
                if name is None or skill.name == name
            ]
        return found

    async def load_from_dir(self, session_id: str, directory: str, recursive: bool) -> FromDirectory:
        """Load every skill of `directory` (beneath the session's workspace or an operator skill
        directory) into the session (server-wide for an empty id); the loaded names and a line
        for each skill that did not load."""
        await self._rt.sessions.refresh(session_id)
        workspace = self._workspace_of(session_id)
        root, origin = resolve_directory(directory, workspace, self._rt.skills.operator_dirs())
        found = await asyncio.to_thread(
            directory_skills, root, origin, recursive, self._rt.settings.secret_env_names
        )
        loaded: list[str] = []
        errors = list(found.problems)
        for skill in found.skills:
            try:
                await self._rt.skills.activate(session_id, skill, found.origin)
            except (InvalidArgument, FailedPrecondition) as exc:
                errors.append(f"{skill.source}: {exc}")
            else:
                loaded.append(skill.name)
        if loaded:
            await self._mcp_changed(session_id)
        return FromDirectory(loaded, errors)

    async def search(self, query: str, limit: int) -> tuple[list[SearchResult], int]:
        """The skills of the operator's sources matching `query`, best first, and how many matched."""
        hits, total = await self._sources.search(query, limit)
        return [
            SearchResult(
                name=hit.skill.name,
                description=hit.skill.description,
                url=f"{hit.source.location}#{hit.path}",
                install_source=hit.install_source,
            )
            for hit in hits
        ], total

    async def install(self, source: str, in_operator_dir: bool, session_id: str | None) -> Installed:
        """Install a skill of the operator's sources into the workspace's `.a3s/skills` (the
        session's workspace when given), or with `in_operator_dir` the operator's first skills
        directory (--skills-dir)."""
        if in_operator_dir:
            if not self._rt.settings.skill_dirs:
                raise FailedPrecondition(
                    "global: the operator has no skills directory to install into: --skills-dir (A3S_SKILL_DIRS)"
                )
            target = within = self._rt.settings.skill_dirs[0]
        else:
            await self._rt.sessions.refresh(session_id or "")
            within = self._workspace_of(session_id or "")
            target = within / ".a3s" / "skills"
        return await self._sources.install(source, target, within)

    def _workspace_of(self, session_id: str) -> Path:
        if not session_id:
            return self._rt.workspace
        return Path(self._rt.sessions.get(session_id).config.workspace)


def _detail(skill: Skill, metadata: dict[str, str]) -> SkillDetail:
    disable = skill.metadata.get("disable-model-invocation", False)
    kind = skill.metadata.get("kind")
    return SkillDetail(
        name=skill.name,
        description=skill.description,
        allowed_tools=", ".join(skill.allowed_tools) or None,
        disable_model_invocation=disable is True or str(disable).lower() == "true",
        content=skill.instructions,
        metadata=metadata,
        kind=kind if isinstance(kind, str) and kind else "instruction",
    )
