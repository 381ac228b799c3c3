"""Session settings (policies, lanes, skills, client tools, compaction) survive the upgrade: a store
written by the previous version, whose `extras` column held one JSON key per setting, loads with
every setting in force; and what this version writes reads back the same after a restart."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from pathlib import Path

from a3s_agent.app import Application
from a3s_agent.base.models import Todo
from a3s_agent.config import Settings
from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import LiveServer, new_session, running
from .test_skills_rpc import CLIENT_SKILL

# Exactly what the previous version stored for a session with every setting made; the skill has no
# "origin" (stored before origins were kept), so it counts as a client skill by its source.
OLD_EXTRAS = {
    "permissions": {
        "enabled": True,
        "default_decision": "ask",
        "deny": ["Bash(rm:*)"],
        "allow": ["read_file", "Bash(git log:*)"],
        "ask": [],
    },
    "skill_rules": ["Bash(git log:*)"],
    "confirmation": {
        "enabled": True,
        "auto_approve_tools": ["read_file"],
        "require_confirm_tools": [],
        "default_timeout_ms": 12000,
        "auto_approve_on_timeout": False,
        "yolo_lanes": [2],
    },
    "lanes": {"3": {"mode": 2, "timeout_ms": 7000}},
    "skills": {"release-notes": {"text": CLIENT_SKILL, "source": "client"}},
    "client_tools": {
        "host_lookup": {
            "name": "host_lookup",
            "description": "looks things up on the host",
            "parameters": {"type": "object", "properties": {}},
            "tags": ["host"],
        }
    },
    "compaction": {"threshold": 0.7, "target": 0.3},
}


def settings_for(workspace: Path, tmp_path: Path) -> Settings:
    return Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data")


async def test_a_session_stored_by_the_previous_version_keeps_every_setting(
    live: LiveServer, workspace: Path, tmp_path: Path
) -> None:
    session_id = await new_session(live)
    await live.server.stop(0)
    await live.runtime.close()
    with closing(sqlite3.connect(tmp_path / "data" / "sessions.db")) as db, db:
        db.execute("UPDATE sessions SET extras = ? WHERE id = ?", (json.dumps(OLD_EXTRAS), session_id))

    async with running(settings_for(workspace, tmp_path)) as again:
        stub = again.stub
        policy = (await stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id=session_id))).policy
        confirmation = (
            await stub.GetConfirmationPolicy(pb.GetConfirmationPolicyRequest(session_id=session_id))
        ).policy
        lane = (
            await stub.GetLaneHandler(
                pb.GetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_EXECUTE)
            )
        ).config
        tools = (await stub.ListTools(pb.ListToolsRequest(session_id=session_id))).tools
        skills = (await stub.ListSkills(pb.ListSkillsRequest(session_id=session_id))).skills
        call = stub.GetSession(pb.GetSessionRequest(session_id=session_id))
        await call
        trailing = dict(await call.trailing_metadata())
        # Unloading the skill drops its rule but keeps the client's own, in the stored policy too.
        await stub.UnloadSkill(pb.UnloadSkillRequest(session_id=session_id, skill_name="release-notes"))
    with closing(sqlite3.connect(tmp_path / "data" / "sessions.db")) as db:
        (stored,) = db.execute("SELECT extras FROM sessions WHERE id = ?", (session_id,)).fetchone()

    assert [r.rule for r in policy.allow] == ["read_file", "Bash(git log:*)"]
    assert [r.rule for r in policy.deny] == ["Bash(rm:*)"]
    assert confirmation.enabled and confirmation.default_timeout_ms == 12000
    assert list(confirmation.yolo_lanes) == [pb.SESSION_LANE_QUERY]
    assert lane.mode == pb.TASK_HANDLER_MODE_EXTERNAL and lane.timeout_ms == 7000
    assert "host_lookup" in {t.name for t in tools}
    loaded = {s.name: s.metadata for s in skills if s.metadata["loaded"] == "true"}
    assert loaded["release-notes"]["origin"] == "client"
    assert float(trailing["a3s-compact-threshold"]) == 0.7
    assert float(trailing["a3s-compact-target"]) == 0.3
    rewritten = json.loads(stored)
    assert rewritten["permissions"]["allow"] == ["read_file"]
    assert "skills" not in rewritten and "skill_rules" not in rewritten
    assert (
        rewritten["lanes"] == OLD_EXTRAS["lanes"] and rewritten["client_tools"] == OLD_EXTRAS["client_tools"]
    )
    assert rewritten["confirmation"] == OLD_EXTRAS["confirmation"]


async def test_concurrent_changes_of_one_session_all_stay(live: LiveServer) -> None:
    """Every settings change is computed from what the one before it left: rules added, a policy,
    lane handlers and a todo list all at once, none undoing another (memory and store)."""
    session_id = await new_session(live)
    rules = [f"Bash(echo {i}:*)" for i in range(12)]
    lanes = [pb.SessionLane.SESSION_LANE_QUERY, pb.SessionLane.SESSION_LANE_EXECUTE]
    external = pb.LaneHandlerConfig(mode=pb.TaskHandlerMode.TASK_HANDLER_MODE_EXTERNAL, timeout_ms=5000)
    await asyncio.gather(
        *[
            live.stub.AddPermissionRule(
                pb.AddPermissionRuleRequest(session_id=session_id, rule_type="deny", rule=rule)
            )
            for rule in rules
        ],
        *[
            live.stub.SetLaneHandler(
                pb.SetLaneHandlerRequest(session_id=session_id, lane=lane, config=external)
            )
            for lane in lanes
        ],
        live.stub.SetConfirmationPolicy(
            pb.SetConfirmationPolicyRequest(
                session_id=session_id, policy=pb.ConfirmationPolicy(enabled=True, default_timeout_ms=7000)
            )
        ),
        Application(live.runtime).todos.set(session_id, [Todo("1", "write the test", "in_progress", "high")]),
    )
    policy = (
        await live.stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id=session_id))
    ).policy
    assert sorted(r.rule for r in policy.deny) == sorted(rules)
    for lane in lanes:
        handler = await live.stub.GetLaneHandler(pb.GetLaneHandlerRequest(session_id=session_id, lane=lane))
        assert handler.config.mode == pb.TaskHandlerMode.TASK_HANDLER_MODE_EXTERNAL
    confirmation = await live.stub.GetConfirmationPolicy(
        pb.GetConfirmationPolicyRequest(session_id=session_id)
    )
    assert confirmation.policy.enabled
    assert [t.id for t in await Application(live.runtime).todos.get(session_id)] == ["1"]
    stored = await live.runtime.store.load_session(session_id)
    assert stored is not None and sorted(stored.settings.permission_policy.deny) == sorted(rules)
