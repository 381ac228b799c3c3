"""The later dialect's skill additions (a3s-string-dialect.md 4.2): each RPC a conversion around one
call of `app.skills`. GetSkill and GetClaudeCodeSkills answer an empty list for a name no skill has,
as A3S does. Errors are statuses (a path outside INVALID_ARGUMENT naming `directory`, an unknown
source or skill NOT_FOUND, no sources configured FAILED_PRECONDITION saying how to configure them),
except what the replies carry: a skill that does not load is a line of LoadSkillsFromDir's
`errors`, one that cannot be installed InstallSkill's `success = false` with the reason."""

from __future__ import annotations

from typing import Any

from ...app import Application
from ...app.skills import SkillDetail
from ...proto import code_agent_later_pb2 as later
from .errors import rpc


class LaterSkillsService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def GetClaudeCodeSkills(
        self, request: later.GetClaudeCodeSkillsRequest, context: Any
    ) -> later.GetClaudeCodeSkillsResponse:
        found = await self.app.skills.claude_code(request.name if request.HasField("name") else None)
        return later.GetClaudeCodeSkillsResponse(
            skills=[
                later.ClaudeCodeSkill(
                    name=d.name,
                    description=d.description,
                    allowed_tools=d.allowed_tools,
                    disable_model_invocation=d.disable_model_invocation,
                    content=d.content,
                )
                for d in found
            ]
        )

    @rpc
    async def GetSkill(self, request: later.GetSkillRequest, context: Any) -> later.GetSkillResponse:
        found = await self.app.skills.details(request.name if request.HasField("name") else None)
        return later.GetSkillResponse(skills=[_skill_to_pb(d) for d in found])

    @rpc
    async def SearchSkills(
        self, request: later.SearchSkillsRequest, context: Any
    ) -> later.SearchSkillsResponse:
        found, total = await self.app.skills.search(request.query, request.limit)
        return later.SearchSkillsResponse(
            results=[
                later.SkillSearchResult(
                    name=r.name, description=r.description, url=r.url, install_source=r.install_source
                )
                for r in found
            ],
            total_count=total,
        )

    @rpc
    async def InstallSkill(
        self, request: later.InstallSkillRequest, context: Any
    ) -> later.InstallSkillResponse:
        session_id = request.session_id if request.HasField("session_id") else None
        done = await self.app.skills.install(request.source, bool(getattr(request, "global")), session_id)
        return later.InstallSkillResponse(
            success=done.success, message=done.message, installed_path=done.path, skill_name=done.skill_name
        )

    @rpc
    async def LoadSkillsFromDir(
        self, request: later.LoadSkillsFromDirRequest, context: Any
    ) -> later.LoadSkillsFromDirResponse:
        done = await self.app.skills.load_from_dir(request.session_id, request.directory, request.recursive)
        return later.LoadSkillsFromDirResponse(
            success=not done.errors, loaded_skills=done.loaded, errors=done.errors
        )


def _skill_to_pb(found: SkillDetail) -> later.CodeSkill:
    return later.CodeSkill(
        name=found.name,
        description=found.description,
        allowed_tools=found.allowed_tools,
        disable_model_invocation=found.disable_model_invocation,
        content=found.content,
        metadata=found.metadata,
        kind=found.kind,
    )
