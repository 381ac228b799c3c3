"""LoadSkill, UnloadSkill and ListSkills through the real server, with the example skills the package ships."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from a3s_agent.core.skills.catalog import EXAMPLE_SKILLS_DIR
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call

from .conftest import LiveServer, agent_settings, initialize, new_session, running, user

SHIPPED = EXAMPLE_SKILLS_DIR
CLIENT_SKILL = """---
name: release-notes
description: Write release notes.
allowed-tools: Bash(git log:*)
---
Write release notes from `git log`, grouped by feature.
"""


@pytest.fixture
async def skilled(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[LiveServer]:
    settings = agent_settings(workspace, tmp_path / "data")
    settings.skill_dirs = [SHIPPED]
    async with running(settings) as server:
        await initialize(server, fake)
        yield server


async def test_list_skills_shows_the_available_ones(skilled: LiveServer) -> None:
    (skilled.workspace / ".a3s" / "skills").mkdir(parents=True)
    (skilled.workspace / ".a3s" / "skills" / "local.md").write_text(
        "---\nname: local\ndescription: mine\n---\nbody\n"
    )
    skills = {s.name: s for s in (await skilled.stub.ListSkills(pb.ListSkillsRequest())).skills}
    assert {"python-testing", "word-count", "local"} <= set(skills)
    assert skills["word-count"].tools == ["count_lines"]
    assert skills["word-count"].metadata["loaded"] == "false"
    assert skills["word-count"].metadata["source"].endswith("word-count/SKILL.md")
    assert "Bash(pytest:*)" in skills["python-testing"].metadata["allowed-tools"]


async def test_a_loaded_skill_adds_instructions_and_a_tool_the_model_uses(
    skilled: LiveServer, fake: FakeLLM
) -> None:
    session_id = await new_session(skilled)
    reply = await skilled.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="word-count"))
    assert reply.success and list(reply.tool_names) == ["count_lines"]
    tools = [t.name for t in (await skilled.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools]
    assert "count_lines" in tools
    (skilled.workspace / "poem.txt").write_text("roses are red\nviolets are blue\n")
    fake.script(tool_call("count_lines", {"path": "poem.txt"}), text("2 lines"))
    result = await skilled.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("count")]))
    assert result.tool_calls[0].result.success
    assert "2 lines" in result.tool_calls[0].result.output
    first = fake.requests[0]
    assert "## Skill: word-count" in first.messages[0]["content"]
    assert first.tools is not None and "count_lines" in {t["function"]["name"] for t in first.tools}
    listed = {
        s.name: s for s in (await skilled.stub.ListSkills(pb.ListSkillsRequest(session_id=session_id))).skills
    }
    assert listed["word-count"].metadata["loaded"] == "true"


async def test_load_from_content_unload_and_allow_rules(skilled: LiveServer) -> None:
    session_id = await new_session(skilled)
    reply = await skilled.stub.LoadSkill(
        pb.LoadSkillRequest(session_id=session_id, skill_name="release-notes", skill_content=CLIENT_SKILL)
    )
    assert reply.success and list(reply.tool_names) == []
    policy = (
        await skilled.stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id=session_id))
    ).policy
    assert [r.rule for r in policy.allow] == ["Bash(git log:*)"]
    removed = await skilled.stub.UnloadSkill(
        pb.UnloadSkillRequest(session_id=session_id, skill_name="release-notes")
    )
    assert removed.success and list(removed.removed_tools) == []
    policy = (
        await skilled.stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id=session_id))
    ).policy
    assert list(policy.allow) == []
    await skilled.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="word-count"))
    removed = await skilled.stub.UnloadSkill(
        pb.UnloadSkillRequest(session_id=session_id, skill_name="word-count")
    )
    assert list(removed.removed_tools) == ["count_lines"]
    tools = [t.name for t in (await skilled.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools]
    assert "count_lines" not in tools


@pytest.mark.parametrize(
    ("name", "content", "code", "words"),
    [
        ("nope", None, grpc.StatusCode.NOT_FOUND, "no skill named 'nope'"),
        ("other", CLIENT_SKILL, grpc.StatusCode.INVALID_ARGUMENT, "does not match"),
        ("bad", "---\nname: bad\ntools: [\n---\nbody", grpc.StatusCode.INVALID_ARGUMENT, "line"),
        ("x", "no frontmatter at all", grpc.StatusCode.INVALID_ARGUMENT, "frontmatter"),
        (
            "clash",
            "---\nname: clash\ntools:\n  - name: bash\n    description: d\n    binary: [echo]\n---\nb",
            grpc.StatusCode.INVALID_ARGUMENT,
            "already exist",
        ),
    ],
)
async def test_load_skill_errors(
    skilled: LiveServer, name: str, content: str | None, code: grpc.StatusCode, words: str
) -> None:
    session_id = await new_session(skilled)
    request = pb.LoadSkillRequest(session_id=session_id, skill_name=name)
    if content is not None:
        request.skill_content = content
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await skilled.stub.LoadSkill(request)
    assert err.value.code() == code and words in err.value.details()


async def test_unloading_a_skill_that_is_not_loaded_is_not_found(skilled: LiveServer) -> None:
    session_id = await new_session(skilled)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await skilled.stub.UnloadSkill(pb.UnloadSkillRequest(session_id=session_id, skill_name="word-count"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_server_wide_skills_reach_every_session(skilled: LiveServer) -> None:
    await skilled.stub.LoadSkill(pb.LoadSkillRequest(skill_name="word-count"))
    session_id = await new_session(skilled)
    tools = [t.name for t in (await skilled.stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools]
    assert "count_lines" in tools


async def test_loaded_skills_survive_a_restart(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    settings = agent_settings(workspace, tmp_path / "data")
    settings.skill_dirs = [SHIPPED]
    async with running(settings) as first:
        session_id = await new_session(first)
        await first.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="word-count"))
        await first.stub.LoadSkill(
            pb.LoadSkillRequest(session_id=session_id, skill_name="release-notes", skill_content=CLIENT_SKILL)
        )
    settings.skill_dirs = []  # the skill files are not needed any more: the text is stored
    async with running(settings) as second:
        listed = await second.stub.ListSkills(pb.ListSkillsRequest(session_id=session_id))
        loaded = sorted(s.name for s in listed.skills if s.metadata["loaded"] == "true")
        tools = await second.stub.ListTools(pb.ListToolsRequest(session_id=session_id))
    assert loaded == ["release-notes", "word-count"]
    assert "count_lines" in [t.name for t in tools.tools]
    assert json.loads(next(t for t in tools.tools if t.name == "count_lines").parameters_schema)[
        "required"
    ] == ["path"]
