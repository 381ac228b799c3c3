"""Checkpoints, rewind, restore, diff and fork through a real `a3s-agent serve` process, its HTTP
routes and real git: a model (the fake OpenAI-compatible server) edits files with the built-in
tools, turn by turn, and the client goes back."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from a3s_agent.testing.fake_llm import FakeLLM, call, text, tool_calls
from a3s_agent.testing.fake_llm import tool_call as fake_call

from .conftest import LiveServer, ServerProcess, eventually, user
from .scripted_model import ScriptedProvider

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}
BINARY = bytes(range(256)) * 4


def git(workspace: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args],
        cwd=workspace,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def files(workspace: Path) -> dict[str, bytes]:
    """Every file of the workspace but the user's .git, by path, with its bytes."""
    found = {}
    for path in sorted(workspace.rglob("*")):
        rel = path.relative_to(workspace).as_posix()
        if rel == ".git" or rel.startswith(".git/") or not path.is_file():
            continue
        found[rel] = path.read_bytes()
    return found


def user_git_state(workspace: Path) -> dict[str, Any]:
    """What the user's own repository holds: branches, HEAD, the index's bytes, the stash, the hooks."""
    dot_git = workspace / ".git"
    return {
        "refs": git(workspace, "for-each-ref", "--format=%(refname) %(objectname)"),
        "head": (dot_git / "HEAD").read_text(),
        "index": hashlib.sha256((dot_git / "index").read_bytes()).hexdigest(),
        "stash": git(workspace, "stash", "list"),
        "hooks": sorted(p.name for p in (dot_git / "hooks").iterdir()),
        "objects": sorted(p.name for p in (dot_git / "objects").iterdir()),
    }


def user_repository(workspace: Path) -> None:
    """A repository with a commit, a second branch, a stash and a hook, its index staged."""
    (workspace / "a.txt").write_text("alpha\n")
    (workspace / "b.bin").write_bytes(BINARY)
    (workspace / "c.txt").write_text("to be deleted\n")
    (workspace / ".gitignore").write_text("ignored/\n")
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-qm", "first")
    git(workspace, "branch", "feature")
    (workspace / "a.txt").write_text("stashed change\n")
    git(workspace, "stash", "-q")
    (workspace / ".git" / "hooks").mkdir(exist_ok=True)
    hook = workspace / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 1\n")
    hook.chmod(0o755)
    (workspace / "staged.txt").write_text("staged\n")
    git(workspace, "add", "staged.txt")


@dataclass
class Lab:
    http: aiohttp.ClientSession
    fake: FakeLLM
    server: ServerProcess

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    async def call(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        async with self.http.request(method, self.base + path, json=body) as reply:
            found = await reply.json()
            assert reply.status == status, found
            return found

    async def session(self, workspace: Path | None = None) -> str:
        config = {"workspace": str(workspace)} if workspace is not None else {}
        reply = await self.call("POST", "/sessions", {"config": config}, 201)
        session_id: str = reply["session_id"]
        return session_id

    async def turn(self, session_id: str, content: str) -> None:
        body = {"messages": [{"role": "ROLE_USER", "content": content}]}
        await self.call("POST", f"/sessions/{session_id}/generate", body)

    async def checkpoints(self, session_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (await self.call("GET", f"/sessions/{session_id}/checkpoints"))[
            "checkpoints"
        ]
        return found


@pytest.fixture
async def lab(tmp_path: Path, fake: FakeLLM) -> AsyncIterator[Lab]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    server = ServerProcess(workspace, tmp_path / "data", env={"A3S_CHECKPOINT_MAX_FILE_BYTES": "100000"})
    async with aiohttp.ClientSession() as http:
        found = Lab(http, fake, server)
        yield found
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


async def start(lab: Lab) -> None:
    lab.server.start()
    llm = {"provider": "openai", "model": "fake-model", "base_url": lab.fake.base_url}
    await lab.call("POST", "/rpc/Initialize", {"config": {"llm": llm}})


def three_turns(fake: FakeLLM) -> None:
    """Turn 1 changes a.txt; turn 2 adds new.txt and deletes c.txt; turn 3 changes a.txt again."""
    fake.script(
        tool_calls([call("write_file", {"path": "a.txt", "content": "turn one\n"})]),
        text("done one"),
        tool_calls(
            [
                call("write_file", {"path": "new.txt", "content": "new\n"}),
                call("delete_file", {"path": "c.txt"}),
            ]
        ),
        text("done two"),
        tool_calls([call("write_file", {"path": "a.txt", "content": "turn three\n"})]),
        text("done three"),
    )


async def after_three_turns(lab: Lab) -> str:
    """A session of a started server that has had `three_turns` in the user's repository."""
    user_repository(lab.server.workspace)
    await start(lab)
    session = await lab.session()
    three_turns(lab.fake)
    for content in ("one", "two", "three"):
        await lab.turn(session, content)
    return session


async def test_a_rewind_restores_the_files_of_before_the_turn_and_cuts_the_conversation(lab: Lab) -> None:
    workspace = lab.server.workspace
    user_repository(workspace)
    before = user_git_state(workspace)
    await start(lab)
    session = await lab.session()
    three_turns(lab.fake)
    await lab.turn(session, "one")
    after_one = files(workspace)
    await lab.turn(session, "two")
    await lab.turn(session, "three")
    assert "new.txt" in files(workspace) and "c.txt" not in files(workspace)

    turns = [c for c in await lab.checkpoints(session) if c["kind"] == "turn"]
    assert [c["user_message"] for c in turns] == ["one", "two", "three"]
    assert {f["path"]: f["status"] for f in turns[1]["files_changed"]} == {"a.txt": "modified"}
    assert {f["path"]: f["status"] for f in turns[2]["files_changed"]} == {
        "new.txt": "added",
        "c.txt": "deleted",
    }

    rewound = await lab.call("POST", f"/sessions/{session}/rewind", {"checkpoint": turns[1]["checkpoint"]})
    assert files(workspace) == after_one  # new.txt gone, c.txt back, a.txt as turn 1 left it: byte for byte
    assert {f["path"] for f in rewound["files"]} == {"a.txt", "new.txt", "c.txt"}
    assert rewound["messages"] == 4  # turn 1: the user's message, the call, its result, the answer

    lab.fake.script(text("after the rewind"))
    await lab.turn(session, "four")
    sent = [m.get("content") for m in lab.fake.requests[-1].messages if m["role"] == "user"]
    assert sent == ["one", "four"]
    assert user_git_state(workspace) == before  # branches, HEAD, index, stash, hooks, objects untouched
    logged = await events(lab, session)
    assert logged.count("checkpoint_created") >= 4 and "session_rewound" in logged

    # The rewind is undone by going back to the checkpoint taken just before it.
    undo = rewound["undo_checkpoint"]
    await lab.call("POST", f"/sessions/{session}/rewind", {"checkpoint": undo, "force": True})
    assert (workspace / "a.txt").read_text() == "turn three\n" and "c.txt" not in files(workspace)


async def test_a_file_changed_by_hand_stops_the_rewind_unless_forced(lab: Lab) -> None:
    workspace = lab.server.workspace
    session = await after_three_turns(lab)
    (workspace / "new.txt").write_text("edited by hand\n")
    kept = files(workspace)
    turns = [c for c in await lab.checkpoints(session) if c["kind"] == "turn"]

    refused = await lab.call(
        "POST", f"/sessions/{session}/rewind", {"checkpoint": turns[1]["checkpoint"]}, 409
    )
    assert refused["error"]["code"] == "FAILED_PRECONDITION"
    assert "new.txt" in refused["error"]["message"] and "force" in refused["error"]["message"]
    assert files(workspace) == kept  # nothing was restored

    forced = await lab.call(
        "POST", f"/sessions/{session}/rewind", {"checkpoint": turns[1]["checkpoint"], "force": True}
    )
    assert forced["overwritten"] == ["new.txt"]
    assert "new.txt" not in files(workspace) and (workspace / "c.txt").is_file()


async def test_diffs_between_checkpoints_and_against_the_workspace_now(lab: Lab) -> None:
    session = await after_three_turns(lab)
    first, second, third = (c["checkpoint"] for c in await lab.checkpoints(session) if c["kind"] == "turn")

    found = await lab.call("GET", f"/sessions/{session}/diff?from={first}&to={third}")
    assert {f["path"]: (f["status"], f["added"], f["removed"]) for f in found["files"]} == {
        "a.txt": ("modified", 1, 1),
        "new.txt": ("added", 1, 0),
        "c.txt": ("deleted", 0, 1),
    }
    assert "-alpha\n+turn one\n" in found["diff"] and "+++ b/new.txt" in found["diff"]

    now = await lab.call("GET", f"/sessions/{session}/diff?from={second}&path=a.txt")
    assert now["to"] is None
    assert [(f["path"], f["status"]) for f in now["files"]] == [("a.txt", "modified")]
    assert "-turn one\n+turn three\n" in now["diff"] and "new.txt" not in now["diff"]

    bad = await lab.call("GET", f"/sessions/{session}/diff?from=x", status=400)
    assert "from" in bad["error"]["message"]
    unknown = await lab.call("GET", f"/sessions/{session}/diff?from=999999", status=404)
    assert "999999" in unknown["error"]["message"]
    missing = await lab.call("POST", f"/sessions/{session}/rewind", {"checkpoint": "2"}, 400)
    assert "checkpoint" in missing["error"]["message"]
    extra = await lab.call("POST", f"/sessions/{session}/fork", {"checkpoint": first, "copy": True}, 400)
    assert "copy" in extra["error"]["message"]
    ghost = await lab.call("GET", "/sessions/ghost/checkpoints", status=404)
    assert "ghost" in ghost["error"]["message"]
    outside = await lab.call(
        "POST",
        f"/sessions/{session}/fork",
        {"checkpoint": first, "copy_workspace": True, "workspace": "/etc/x"},
        400,
    )
    assert "workspace" in outside["error"]["message"]


async def test_a_workspace_without_git_and_a_large_binary_skipped_and_reported(lab: Lab) -> None:
    workspace = lab.server.workspace
    (workspace / "a.txt").write_text("alpha\n")
    large = os.urandom(300_000)
    (workspace / "large.bin").write_bytes(large)
    (workspace / "big\na.txt").write_bytes(large)  # as two exclude lines, it would leave a.txt out
    await start(lab)
    session = await lab.session()
    lab.fake.script(
        tool_calls([call("write_file", {"path": "a.txt", "content": "changed\n"})]),
        text("done"),
        text("nothing to do"),
    )
    await lab.turn(session, "one")
    (workspace / "large.bin").write_bytes(large[::-1])  # changed, but never part of a checkpoint
    await lab.turn(session, "two")

    first, second = await lab.checkpoints(session)
    skipped = [{"path": "big\na.txt", "size": 300_000}, {"path": "large.bin", "size": 300_000}]
    assert first["files_skipped"] == second["files_skipped"] == skipped
    assert [f["path"] for f in second["files_changed"]] == ["a.txt"]
    assert not (workspace / ".git").exists()
    await lab.call("POST", f"/sessions/{session}/restore", {"checkpoint": first["checkpoint"]})
    assert (workspace / "a.txt").read_text() == "alpha\n"
    assert (workspace / "large.bin").read_bytes() == large[::-1]  # skipped: left as it is


async def test_a_rewind_while_a_run_is_going_is_refused(lab: Lab) -> None:
    from a3s_agent.testing.fake_llm import hang

    await start(lab)
    session = await lab.session()
    lab.fake.script(text("first"), hang())
    await lab.turn(session, "one")
    (first,) = await lab.checkpoints(session)
    body = {"messages": [{"role": "ROLE_USER", "content": "two"}]}
    running = asyncio.create_task(lab.http.post(f"{lab.base}/sessions/{session}/generate", json=body))
    await eventually(lambda: len(lab.fake.requests) == 2, "the second run's model call")
    for path in ("rewind", "restore"):
        refused = await lab.call(
            "POST", f"/sessions/{session}/{path}", {"checkpoint": first["checkpoint"]}, 409
        )
        assert refused["error"]["code"] == "FAILED_PRECONDITION"
        assert "cancel it first" in refused["error"]["message"]
    await lab.call("POST", f"/sessions/{session}/cancel", {})
    (await running).close()
    await lab.call("POST", f"/sessions/{session}/rewind", {"checkpoint": first["checkpoint"]})  # now it may


async def test_a_restore_writes_nothing_through_a_symlink_out_of_the_workspace(
    lab: Lab, tmp_path: Path
) -> None:
    workspace = lab.server.workspace
    (workspace / "dir").mkdir()
    (workspace / "dir" / "x.txt").write_text("original\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("not the workspace's\n")
    await start(lab)
    session = await lab.session()
    lab.fake.script(
        tool_calls([call("write_file", {"path": "dir/x.txt", "content": "changed\n"})]), text("done")
    )
    await lab.turn(session, "one")
    (first,) = await lab.checkpoints(session)
    (workspace / "dir" / "x.txt").unlink()
    (workspace / "dir").rmdir()
    (workspace / "dir").symlink_to(outside)

    await lab.call("POST", f"/sessions/{session}/restore", {"checkpoint": first["checkpoint"], "force": True})
    assert (outside / "x.txt").read_text() == "not the workspace's\n"
    assert not (workspace / "dir").is_symlink() and (workspace / "dir" / "x.txt").read_text() == "original\n"


async def events(lab: Lab, session_id: str) -> list[str]:
    """The messages of the session's logged events (an INFO event's message names its kind)."""
    page = await lab.call("GET", f"/sessions/{session_id}/events?limit=1000")
    return [entry["message"] for entry in page["events"] if entry["kind"] == "event"]


async def test_a_fork_into_a_copied_workspace_goes_on_beside_its_session(lab: Lab, tmp_path: Path) -> None:
    lab.server.env["A3S_WORKSPACE_ROOT"] = str(tmp_path)
    workspace = lab.server.workspace
    (workspace / "a.txt").write_text("alpha\n")
    await start(lab)
    session = await lab.session()
    lab.fake.script(
        tool_calls([call("write_file", {"path": "a.txt", "content": "one\n"})]),
        text("done one"),
        tool_calls([call("write_file", {"path": "a.txt", "content": "two\n"})]),
        text("done two"),
    )
    await lab.turn(session, "one")
    await lab.turn(session, "two")
    second = (await lab.checkpoints(session))[1]["checkpoint"]

    forked = await lab.call(
        "POST", f"/sessions/{session}/fork", {"checkpoint": second, "copy_workspace": True}, 201
    )
    copy = Path(forked["workspace"])
    assert copy != workspace and copy.is_relative_to(tmp_path)
    assert files(copy) == {"a.txt": b"one\n"} and forked["messages"] == 4
    lab.fake.script(
        tool_calls([call("write_file", {"path": "a.txt", "content": "fork\n"})]),
        text("fork done"),
        tool_calls([call("write_file", {"path": "a.txt", "content": "main\n"})]),
        text("main done"),
    )
    await lab.turn(forked["session_id"], "on the fork")
    asked = [m.get("content") for m in lab.fake.requests[-2].messages if m["role"] == "user"]
    assert asked == ["one", "on the fork"]
    await lab.turn(session, "on the main line")
    assert (copy / "a.txt").read_text() == "fork\n" and (workspace / "a.txt").read_text() == "main\n"
    assert "session_forked" in await events(lab, session)
    assert "session_forked" in await events(lab, forked["session_id"])
    assert "checkpoint_created" in await events(lab, forked["session_id"])

    same = await lab.call("POST", f"/sessions/{session}/fork", {"checkpoint": second}, 201)
    assert same["workspace"] == str(workspace) and same["messages"] == 4
    now = await lab.call("POST", f"/sessions/{session}/fork", {}, 201)  # the whole history, as it is
    whole = (await lab.call("GET", f"/sessions/{session}"))["session"]["context_usage"]["message_count"]
    assert now["messages"] == whole == 12 and (await lab.checkpoints(session))[-1]["kind"] == "fork"


async def test_a_server_killed_during_a_restore_leaves_the_old_or_the_new_files(lab: Lab) -> None:
    workspace = lab.server.workspace
    count = 2000
    for i in range(count):
        (workspace / f"f{i:04}.txt").write_text(f"original {i}\n")
    original = files(workspace)
    await start(lab)
    session = await lab.session()
    change_all = "for f in f*.txt; do echo changed > $f; done"
    lab.fake.script(tool_calls([call("bash", {"command": change_all})]), text("changed them all"))
    await lab.turn(session, "change them")
    assert set(files(workspace).values()) == {b"changed\n"}
    (first,) = await lab.checkpoints(session)

    journals = lab.server.data_dir / "checkpoints"
    restoring = asyncio.create_task(
        lab.http.post(f"{lab.base}/sessions/{session}/restore", json={"checkpoint": first["checkpoint"]})
    )
    seen = await asyncio.to_thread(wait_for_file, journals, "restore.journal")
    assert lab.server.proc is not None
    lab.server.proc.kill()  # SIGKILL, while the journal says a restore is under way
    lab.server.proc.wait()
    assert seen
    with pytest.raises(aiohttp.ClientError):
        await restoring

    lab.server.start()  # the restore is carried out again before anything is served
    assert files(workspace) == original
    assert not list(journals.glob("*/restore.journal"))


def wait_for_file(directory: Path, name: str, within_s: float = 30.0) -> bool:
    """Spin until `directory/*/name` exists (a restore's journal lives for a fraction of a second)."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for root in directory.glob("*"):
            if (root / name).exists():
                return True
    return False


async def test_two_replicas_on_postgresql_list_and_rewind_each_others_checkpoints(
    tmp_path: Path, fake: FakeLLM, postgres_url: str
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    user_repository(workspace)
    env = {
        "A3S_STORE": postgres_url,
        "A3S_CHECKPOINT_DIR": str(tmp_path / "shared-checkpoints"),  # on the volume both replicas share
        "A3S_LLM_PROVIDER": "openai",
        "A3S_LLM_MODEL": "fake-model",
        "A3S_LLM_BASE_URL": fake.base_url,
    }
    a = ServerProcess(workspace, tmp_path / "data-a", {**env, "A3S_REPLICA_ID": "a"})
    b = ServerProcess(workspace, tmp_path / "data-b", {**env, "A3S_REPLICA_ID": "b"})
    try:
        async with aiohttp.ClientSession() as http:
            on_a, on_b = Lab(http, fake, a.start()), Lab(http, fake, b.start())
            session = await on_a.session()
            three_turns(fake)
            await on_a.turn(session, "one")
            after_one = files(workspace)
            await on_a.turn(session, "two")
            await on_a.turn(session, "three")

            listed = await on_b.checkpoints(session)
            assert listed == await on_a.checkpoints(session)
            second = [c for c in listed if c["kind"] == "turn"][1]["checkpoint"]
            found = await on_b.call("GET", f"/sessions/{session}/diff?from={second}")
            assert {f["path"] for f in found["files"]} == {"a.txt", "new.txt", "c.txt"}
            await on_b.call("POST", f"/sessions/{session}/rewind", {"checkpoint": second})
            assert files(workspace) == after_one

            fake.script(text("after the rewind"))
            await on_a.turn(session, "four")
            asked = [m.get("content") for m in fake.requests[-1].messages if m["role"] == "user"]
            assert asked == ["one", "four"]
    finally:
        for server in (a, b):
            if server.proc is not None and server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait()


async def test_a_direct_tool_call_that_writes_is_checkpointed_first(lab: Lab) -> None:
    workspace = lab.server.workspace
    (workspace / "a.txt").write_text("alpha\n")
    await start(lab)
    session = await lab.session()
    await lab.call("POST", f"/sessions/{session}/tools/read_file", {"path": "a.txt"})
    assert await lab.checkpoints(session) == []  # a read-only tool changes nothing
    await lab.call("POST", f"/sessions/{session}/tools/write_file", {"path": "a.txt", "content": "beta\n"})
    (before,) = await lab.checkpoints(session)
    assert before["kind"] == "tool"
    await lab.call("POST", f"/sessions/{session}/restore", {"checkpoint": before["checkpoint"]})
    assert (workspace / "a.txt").read_text() == "alpha\n"


async def test_an_unreadable_record_beside_a_shadow_index_fails_no_write(lab: Lab) -> None:
    """What a server keeps beside each shadow index is rebuilt, not trusted: one emptied or
    garbled on disk costs a checkpoint nothing and never fails the client's write."""
    workspace = lab.server.workspace
    (workspace / "a.txt").write_text("alpha\n")
    await start(lab)
    session = await lab.session()
    await lab.call("POST", f"/sessions/{session}/tools/write_file", {"path": "a.txt", "content": "beta\n"})
    kept = list((lab.server.data_dir / "checkpoints").glob("*/index/*.json"))
    assert kept
    for index, junk in zip(kept, cycle(["", "{not json", '{"a": 1}']), strict=False):
        index.write_text(junk)
    await lab.call("POST", f"/sessions/{session}/tools/write_file", {"path": "a.txt", "content": "gamma\n"})
    other = await lab.session()
    await lab.call("POST", f"/sessions/{other}/tools/write_file", {"path": "b.txt", "content": "b\n"})
    assert [c["kind"] for c in await lab.checkpoints(session)] == ["tool", "tool"]
    assert len(await lab.checkpoints(other)) == 1
    assert (workspace / "a.txt").read_text() == "gamma\n"


async def test_capabilities_say_whether_workspaces_are_checkpointed(lab: Lab) -> None:
    await start(lab)
    features = (await lab.call("POST", "/rpc/GetCapabilities", {}))["features"]
    assert "checkpoints" in features
    lab.server.stop()
    lab.server.env["A3S_CHECKPOINTS"] = "off"
    lab.server.start()
    async with aiohttp.ClientSession() as http:  # not the pool's connections to the stopped server
        off = Lab(http, lab.fake, lab.server)
        assert "checkpoints" not in (await off.call("POST", "/rpc/GetCapabilities", {}))["features"]
        session = await off.session()
        await off.call("POST", f"/sessions/{session}/tools/write_file", {"path": "a.txt", "content": "a\n"})
        assert await off.checkpoints(session) == []


async def test_a_grpc_client_rewinds_through_clear_context_and_forks_through_create_session(lab: Lab) -> None:
    from a3s_agent.proto import code_agent_pb2 as pb
    from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

    workspace = lab.server.workspace
    session = await after_three_turns(lab)
    second = [c for c in await lab.checkpoints(session) if c["kind"] == "turn"][1]["checkpoint"]
    async with grpc.aio.insecure_channel(lab.server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.ClearContext(
                pb.ClearContextRequest(session_id=session), metadata=(("a3s-rewind-to", "two"),)
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "a3s-rewind-to" in str(
            bad.value.details()
        )

        forked = await stub.CreateSession(
            pb.CreateSessionRequest(), metadata=(("a3s-fork-from", f"{session}:{second}"),)
        )
        assert forked.session.context_usage.message_count == 4
        assert forked.session.config.workspace == str(workspace)

        cleared = stub.ClearContext(
            pb.ClearContextRequest(session_id=session), metadata=(("a3s-rewind-to", str(second)),)
        )
        assert (await cleared).success
        trailing = dict(await cleared.trailing_metadata())
        assert int(trailing["a3s-files-restored"]) == 3 and int(trailing["a3s-undo-checkpoint"]) > second
    assert "new.txt" not in files(workspace) and (workspace / "c.txt").is_file()
    assert "turn one" in (workspace / "a.txt").read_text()


async def test_old_checkpoints_are_pruned_to_the_setting_and_go_with_their_session(lab: Lab) -> None:
    lab.server.env["A3S_CHECKPOINT_KEEP"] = "2"
    session = await after_three_turns(lab)
    kept = await lab.checkpoints(session)
    assert [c["user_message"] for c in kept] == ["two", "three"]
    shadow = lab.server.data_dir / "checkpoints"
    assert len(list(shadow.glob("*/git/refs/a3s/trees/*"))) == 2  # the pruned checkpoint's tree goes

    await lab.call("DELETE", f"/sessions/{session}")
    assert not list(shadow.glob("*/git/refs/a3s/trees/*"))
    assert not list(shadow.glob("*/index/*"))  # its index and what was kept beside it


async def test_a_rewind_finds_the_conversation_that_clearing_archived(lab: Lab) -> None:
    session = await after_three_turns(lab)
    second = [c for c in await lab.checkpoints(session) if c["kind"] == "turn"][1]["checkpoint"]
    kept = files(lab.server.workspace)
    await lab.call("POST", "/rpc/ClearContext", {"session_id": session})  # archives the whole history

    rewound = await lab.call(
        "POST", f"/sessions/{session}/rewind", {"checkpoint": second, "conversation_only": True}
    )
    assert rewound["messages"] == 4 and rewound["files"] == []
    assert files(lab.server.workspace) == kept
    lab.fake.script(text("after the rewind"))
    await lab.turn(session, "four")
    assert [m.get("content") for m in lab.fake.requests[-1].messages if m["role"] == "user"] == [
        "one",
        "four",
    ]


async def test_an_agent_spaces_run_in_a_sessions_workspace_is_checkpointed_first(lab: Lab) -> None:
    workspace = lab.server.workspace
    (workspace / "a.txt").write_text("alpha\n")
    await start(lab)
    session = await lab.session()
    space = await lab.call("POST", "/v1/spaces", {"sessionId": session}, 201)
    operations = {
        "protocolVersion": "1.0",
        "operations": [{"type": "createFile", "id": "c", "path": "made.txt", "content": "by a space\n"}],
    }
    await lab.call("POST", f"/v1/spaces/{space['spaceId']}/runs", operations)
    assert (workspace / "made.txt").is_file()
    (before,) = await lab.checkpoints(session)
    assert before["kind"] == "space"
    await lab.call("POST", f"/sessions/{session}/restore", {"checkpoint": before["checkpoint"]})
    assert files(workspace) == {"a.txt": b"alpha\n"}


async def test_the_model_cannot_reach_the_shadow_repository_even_inside_its_workspace(lab: Lab) -> None:
    workspace = lab.server.workspace
    lab.server.env["A3S_CHECKPOINT_DIR"] = str(workspace / ".shadow")
    (workspace / "a.txt").write_text("alpha\n")
    await start(lab)
    session = await lab.session()
    look = "ls -A .shadow 2>/dev/null | wc -l; rm -rf .shadow/* 2>/dev/null; echo tried"
    lab.fake.script(tool_calls([call("bash", {"command": look})]), text("done"))
    await lab.turn(session, "look")
    result = lab.fake.requests[-1].messages[-1]
    assert result["role"] == "tool" and result["content"].split() == ["0", "tried"]  # hidden: empty
    (first,) = await lab.checkpoints(session)
    assert any((workspace / ".shadow").glob("*/git/HEAD"))  # still there
    found = await lab.call("GET", f"/sessions/{session}/diff?from={first['checkpoint']}")
    assert found["files"] == []  # the shadow repository is not part of its own checkpoints


async def test_a_restore_that_would_lose_an_ignored_file_changes_nothing(lab: Lab) -> None:
    workspace = lab.server.workspace
    (workspace / ".gitignore").write_text("*.log\n")
    (workspace / "d").write_text("a file\n")
    await start(lab)
    session = await lab.session()
    into_a_directory = "rm d && mkdir d && echo kept > d/run.log && echo new > d/x.txt"
    lab.fake.script(tool_calls([call("bash", {"command": into_a_directory})]), text("done"))
    await lab.turn(session, "make d a directory")
    (first,) = await lab.checkpoints(session)
    now = files(workspace)

    refused = await lab.call("POST", f"/sessions/{session}/restore", {"checkpoint": first["checkpoint"]}, 409)
    assert "nothing was restored" in refused["error"]["message"]
    assert refused["error"]["message"].endswith(": d")
    assert files(workspace) == now and (workspace / "d" / "run.log").read_text() == "kept\n"


async def test_a_rewind_to_a_turn_that_compacted_as_it_started_gets_the_conversation_it_found(
    scripted_agent: LiveServer, scripted: ScriptedProvider
) -> None:
    from a3s_agent.proto import code_agent_pb2 as pb

    from .test_compaction import summaries

    found = [
        pb.Message(
            role=pb.Message.ROLE_USER if i % 2 == 0 else pb.Message.ROLE_ASSISTANT, content=f"m{i} " * 600
        )
        for i in range(40)
    ]  # far past the 32,000-token window's threshold: the next turn compacts before its model call
    created = await scripted_agent.stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(auto_compact=True, max_context_length=32_000), initial_context=found
        )
    )
    session = created.session_id
    turns = iter([fake_call("write_file", {"path": "a.txt", "content": "x\n"}), text("done")])
    scripted.fallback = summaries(text("a summary"), lambda _: next(turns))
    await scripted_agent.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("go")]))
    assert len(await scripted_agent.runtime.sessions.archived(session)) == 41  # compacted as it started

    (turn,) = await scripted_agent.runtime.checkpoints.of_session(session)
    rewind = (("a3s-rewind-to", str(turn.seq)), ("a3s-rewind-files", "keep"))
    await scripted_agent.stub.ClearContext(pb.ClearContextRequest(session_id=session), metadata=rewind)
    history = await scripted_agent.runtime.sessions.history(session)
    assert [m.content for m in history] == [m.content for m in found]


async def test_the_workspaces_git_configuration_and_attributes_run_nothing(lab: Lab) -> None:
    workspace = lab.server.workspace
    user_repository(workspace)
    marker = workspace / "pwned"
    payload = f"sh -c 'echo ran >> {marker}; cat'"
    git(workspace, "config", "filter.evil.clean", payload)
    git(workspace, "config", "filter.evil.smudge", payload)
    git(workspace, "config", "core.fsmonitor", f"echo ran >> {marker}")
    (workspace / ".gitattributes").write_text("* filter=evil\n")
    os.utime(workspace / "a.txt", (946684800, 946684800))  # git looks at its content, through the filter
    subprocess.run(["git", "add", "-A"], cwd=workspace, env={**os.environ, **GIT_ENV}, check=False)
    subprocess.run(["git", "reset", "-q"], cwd=workspace, env={**os.environ, **GIT_ENV}, check=False)
    assert marker.exists()  # the attack is real: plain git runs it
    marker.unlink()

    await start(lab)
    session = await lab.session()
    three_turns(lab.fake)
    await lab.turn(session, "one")
    await lab.turn(session, "two")
    first = (await lab.checkpoints(session))[0]["checkpoint"]
    await lab.call("GET", f"/sessions/{session}/diff?from={first}")
    await lab.call("POST", f"/sessions/{session}/rewind", {"checkpoint": first})
    assert (workspace / "a.txt").read_text() == "alpha\n"
    assert not marker.exists()


async def test_an_editor_forks_a_session_at_a_prompt_into_a_copy_over_acp(tmp_path: Path) -> None:
    """ACP's session/fork, with the checkpoint each prompt's answer names: the fork has the
    conversation and the files of before that prompt, in a copy, and goes on apart from its session."""
    from acp import RequestError, text_block

    from .test_acp import Editor, acp_agent

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    notes = workspace / "notes.txt"
    notes.write_text("v0\n")
    write = "write_file"
    async with FakeLLM(
        fake_call(write, {"path": "notes.txt", "content": "v1\n"}, id="w1"),
        text("one"),
        fake_call(write, {"path": "notes.txt", "content": "v2\n"}, id="w2"),
        text("two"),
        fake_call(write, {"path": "notes.txt", "content": "fork\n"}, id="w3"),
        text("three"),
    ) as fake:
        editor = Editor(answers=["allow-once"] * 3)
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            first = await conn.prompt(session_id=session, prompt=[text_block("first change")])
            second = await conn.prompt(session_id=session, prompt=[text_block("second change")])
            assert first.field_meta is not None and second.field_meta is not None
            before_second = second.field_meta["a3s"]["checkpoint"]
            assert before_second > first.field_meta["a3s"]["checkpoint"]

            for bad in ({"checkpoint": "2"}, {"checkpoint": 0}, {"copyWorkspace": "yes"}, {"other": 1}, [1]):
                with pytest.raises(RequestError) as refused:
                    await conn.fork_session(session_id=session, cwd=str(workspace), a3s=bad)
                assert refused.value.code == -32602 and "_meta.a3s" in str(refused.value)
            with pytest.raises(RequestError) as unknown:
                await conn.fork_session(session_id="no-such-session", cwd=str(workspace))
            assert unknown.value.code == -32002

            forked = await conn.fork_session(
                session_id=session,
                cwd=str(workspace),
                a3s={"checkpoint": before_second, "copyWorkspace": True},
            )
            listed = {s.session_id: s.cwd for s in (await conn.list_sessions()).sessions}
            copy = Path(listed[forked.session_id])
            assert copy != workspace and (copy / "notes.txt").read_text() == "v1\n"
            await conn.prompt(session_id=forked.session_id, prompt=[text_block("change the fork")])

    assert (copy / "notes.txt").read_text() == "fork\n" and notes.read_text() == "v2\n"
    seen = [m.get("content") for m in fake.requests[-1].messages]
    assert any("first change" in str(c) for c in seen) and not any("second change" in str(c) for c in seen)


async def test_an_editor_reviews_what_a_prompt_changed_whatever_tool_changed_it(tmp_path: Path) -> None:
    """ACP: after a turn that changed files, the editor gets the turn's changes as diffs (old and
    new text from the turn's checkpoint and the tree it left), a `bash` command's too."""
    from acp import text_block
    from acp.schema import FileEditToolCallContent

    from .test_acp import Editor, acp_agent

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("v0\n")
    (workspace / "gone.txt").write_text("bye\n")
    (workspace / "blob.bin").write_bytes(b"\x00\x01")
    command = "printf 'new\\n' > made.txt; printf 'v1\\n' > notes.txt; rm gone.txt; printf '\\000\\002' > blob.bin; ln -s /etc/hostname link.txt"
    async with FakeLLM(
        fake_call("bash", {"command": command}, id="b1"), text("done"), text("nothing")
    ) as fake:
        editor = Editor(answers=["allow-once"])
        async with acp_agent(editor, workspace, fake, tmp_path / "data") as conn:
            session = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            reply = await conn.prompt(session_id=session, prompt=[text_block("tidy up")])
            quiet = await conn.prompt(session_id=session, prompt=[text_block("and now?")])

    assert reply.field_meta is not None
    checkpoint = reply.field_meta["a3s"]["checkpoint"]
    [review] = editor.call_updates(f"a3s-changes-{checkpoint}")
    assert review.kind == "edit" and review.status == "completed"
    diffs = {
        Path(c.path).name: (c.old_text, c.new_text)
        for c in review.content or []
        if isinstance(c, FileEditToolCallContent)
    }
    # A symlink is not followed (to a file outside the workspace here), nor is a binary file shown.
    assert diffs == {"made.txt": (None, "new\n"), "notes.txt": ("v0\n", "v1\n"), "gone.txt": ("bye\n", "")}
    assert quiet.field_meta is not None  # a checkpoint, but the turn changed nothing: no review
    assert len([u for u in editor.updates if getattr(u, "tool_call_id", "").startswith("a3s-changes-")]) == 1
