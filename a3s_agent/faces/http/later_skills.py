"""The later dialect's skill additions over HTTP, as faces/grpc/later_skills.py serves them over
gRPC: app/skills.py's types have the proto's field names, so a reply is their fields."""

from __future__ import annotations

from dataclasses import asdict

from ...app import Application
from .convert import Given, Plain
from .rpc_table import Handlers

HANDLERS = Handlers()


@HANDLERS.rpc("GetClaudeCodeSkills")
async def _claude_code(app: Application, request: Given) -> Plain:
    return {"skills": [asdict(d) for d in await app.skills.claude_code(request["name"])]}


@HANDLERS.rpc("GetSkill")
async def _get(app: Application, request: Given) -> Plain:
    return {"skills": [asdict(d) for d in await app.skills.details(request["name"])]}


@HANDLERS.rpc("SearchSkills")
async def _search(app: Application, request: Given) -> Plain:
    found, total = await app.skills.search(request["query"], request["limit"])
    return {"results": [asdict(r) for r in found], "total_count": total}


@HANDLERS.rpc("InstallSkill")
async def _install(app: Application, request: Given) -> Plain:
    done = await app.skills.install(request["source"], request["global"], request["session_id"])
    return {
        "success": done.success,
        "message": done.message,
        "installed_path": done.path,
        "skill_name": done.skill_name,
    }


@HANDLERS.rpc("LoadSkillsFromDir")
async def _load_from_dir(app: Application, request: Given) -> Plain:
    done = await app.skills.load_from_dir(request["session_id"], request["directory"], request["recursive"])
    return {"success": not done.errors, "loaded_skills": done.loaded, "errors": done.errors}
