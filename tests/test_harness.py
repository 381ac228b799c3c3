"""The A3S headless harness protocol on the HTTP face, with a real aiohttp client against the
in-process server, the fake LLM over real HTTP and real git: the spec's worked examples byte for
byte, every error status, replays, paging through a long run, a cancel mid-run, and the run seen
over gRPC."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.app import Application
from a3s_agent.app.harness import our_session_id
from a3s_agent.config import ConfigError, settings_from
from a3s_agent.faces.readiness import Readiness
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, call, text, tool_call, tool_calls

from .conftest import agent_settings, eventually, initialize, running
from .test_http import Http, serving

RELEASE = "sha256:" + "1" * 64
OTHER_RELEASE = "sha256:" + "2" * 64
PROMPT = "Add a --verbose flag to cli.py and note it in NOTES.md."
ERROR_SCHEMA = "a3s.code.agent-error.v1"
CLI_BEFORE = 'import sys\n\ndef main():\n    print("hi")\n'
CLI_AFTER = 'import sys\n\ndef main():\n    verbose = "--verbose" in sys.argv\n    print("hi")\n'
# Section 10.3's change set, produced by the spec with git on the same two files.
BASE_TREE = "git-tree:cfd59e99aa0eeacf946caa10f0d699a9af092b80"
RESULT_TREE = "git-tree:dcd53c0072019562dc63db7cb56505b4cd9812f5"
PATCH_DIGEST = "sha256:da6c4828098fcf66c31e6b37459943c6a28f3f000371f0d7ccb4bcde8761d55c"
PATCH_BASE64 = (
    "ZGlmZiAtLWdpdCBhL05PVEVTLm1kIGIvTk9URVMubWQKbmV3IGZpbGUgbW9kZSAxMDA2NDQKaW5kZXggMDAwMDAwMDAwMDAw"
    "MDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMC4uZmM3MmE1YzEwOTRlMjAzZWVmY2QxYzcxMGYwNjA5NTdlYmJiYWFjNAot"
    "LS0gL2Rldi9udWxsCisrKyBiL05PVEVTLm1kCkBAIC0wLDAgKzEgQEAKKyMgZGVtbwpkaWZmIC0tZ2l0IGEvY2xpLnB5IGIv"
    "Y2xpLnB5CmluZGV4IDY2ZjkwYWZjMzgyMWFjZDhlYTlmMzcyM2NiNDZiMjY4YmVjMjUyMGQuLjRjMmYwYjI4M2ZjOTg5MmM2"
    "ZmI5OTVjOTE1ZmFiN2JmNDcwZDQwZTUgMTAwNjQ0Ci0tLSBhL2NsaS5weQorKysgYi9jbGkucHkKQEAgLTEsNCArMSw1IEBA"
    "CiBpbXBvcnQgc3lzCiAKIGRlZiBtYWluKCk6CisgICAgdmVyYm9zZSA9ICItLXZlcmJvc2UiIGluIHN5cy5hcmd2CiAgICAg"
    "cHJpbnQoImhpIikK"
)
EMPTY_DIGEST = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
START_DIGEST = "sha256:015d85409677b1f993e29dd46138aaa00dca5648bf0818b2c7b81b9fb267d926"
CANCEL_DIGEST = "sha256:90618d493e1b051bba2256beb394393eed46d0a5bec08eca5d6f1623d597c86b"
RECOVER_DIGEST = "sha256:24f7b975d5b84bffb4bcd0476f94f799d0961bf561a1c8e53c4e826c894cd4f6"
CANCEL_BODY = (
    '{"action":"cancel","request":{"schema":"a3s.code.agent-run-cancel.v1","request_id":"req-0002",'
    '"identity":{"schema":"a3s.code.agent-run-identity.v1","protocol":"a3s.code.agent.v1",'
    '"agent_release_identity":"sha256:1111111111111111111111111111111111111111111111111111111111111111",'
    '"session_id":"conv-42","run_id":"run-42-1"},"reason":"user pressed stop"}}'
)
RECOVER_BODY = (
    '{"action":"recover","request":{"schema":"a3s.code.agent-run-recover.v1","request_id":"req-0003",'
    '"identity":{"schema":"a3s.code.agent-run-identity.v1","protocol":"a3s.code.agent.v1",'
    '"agent_release_identity":"sha256:1111111111111111111111111111111111111111111111111111111111111111",'
    '"session_id":"conv-42","run_id":"run-42-2"},"checkpoint_run_id":"run-42-1"}}'
)


def identity(run_id: str = "run-42-1", session_id: str = "conv-42", release: str = RELEASE) -> dict[str, Any]:
    return {
        "schema": "a3s.code.agent-run-identity.v1",
        "protocol": "a3s.code.agent.v1",
        "agent_release_identity": release,
        "session_id": session_id,
        "run_id": run_id,
    }


def start(prompt: str = PROMPT, request_id: str = "req-0001", **who: str) -> dict[str, Any]:
    return {
        "action": "start",
        "request": {
            "schema": "a3s.code.agent-run-start.v1",
            "request_id": request_id,
            "identity": identity(**who),
            "prompt": prompt,
        },
    }


def cancel(reason: str = "user pressed stop", request_id: str = "req-0002", **who: str) -> dict[str, Any]:
    return {
        "action": "cancel",
        "request": {
            "schema": "a3s.code.agent-run-cancel.v1",
            "request_id": request_id,
            "identity": identity(**who),
            "reason": reason,
        },
    }


def recover(checkpoint: str, request_id: str = "req-0003", **who: str) -> dict[str, Any]:
    return {
        "action": "recover",
        "request": {
            "schema": "a3s.code.agent-run-recover.v1",
            "request_id": request_id,
            "identity": identity(**who),
            "checkpoint_run_id": checkpoint,
        },
    }


def page_request(after: int | None, limit: int, **who: str) -> dict[str, Any]:
    return {
        "schema": "a3s.code.agent-event-page-request.v1",
        "identity": identity(**who),
        "after_event_sequence": after,
        "limit": limit,
    }


def changes_request(**who: str) -> dict[str, Any]:
    return {"schema": "a3s.code.agent-change-set-request.v1", "identity": identity(**who)}


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"schema": ERROR_SCHEMA, "error": {"code": code, "message": message}}


INVALID_JSON = error_body(
    "a3s.code.agent_protocol.invalid_json", "request body is not a valid bounded Agent protocol document"
)
INVALID_FIELD = error_body("a3s.code.agent_protocol.invalid_field", "Agent protocol request is invalid")
UNSUPPORTED = error_body("a3s.code.agent_protocol.unsupported_schema", "Agent protocol request is invalid")


async def post(http: Http, path: str, body: Any, status: int = 200, **kwargs: Any) -> dict[str, Any]:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = kwargs.pop("headers", {"Content-Type": "application/json"})
    async with http.client.post(path, data=data, headers=headers, **kwargs) as reply:
        document = await reply.json()
        assert reply.status == status, document
        assert reply.content_type == "application/json"
        return document


async def command(http: Http, body: Any, status: int = 200) -> dict[str, Any]:
    return await post(http, "/v1/agent/commands", body, status)


async def page(http: Http, after: int | None, limit: int, status: int = 200, /, **who: str) -> dict[str, Any]:
    return await post(http, "/v1/agent/events:page", page_request(after, limit, **who), status)


async def finished(http: Http, **who: str) -> dict[str, Any]:
    async def terminal() -> dict[str, Any] | None:
        got = await page(http, None, 1, **who)
        return got if got["state"] in ("completed", "failed", "cancelled") else None

    return await eventually(terminal, "the run is terminal")


async def all_events(http: Http, limit: int = 64, **who: str) -> list[dict[str, Any]]:
    """Every event of a terminal run, page by page, checking the spec's page invariants."""
    events: list[dict[str, Any]] = []
    cursor: int | None = None
    while True:
        got = await page(http, cursor, limit, **who)
        batch = got["events"]
        assert len(batch) <= limit and got["retention_gap"] is False
        assert [e["sequence"] for e in batch] == list(range(len(events), len(events) + len(batch)))
        stamps = [e["occurred_at_ms"] for e in batch]
        assert stamps == sorted(stamps) and all(s <= got["observed_at_ms"] for s in stamps)
        for e in batch:
            meta = e["event"]["metadata"]
            assert meta == {
                "run_id": who.get("run_id", "run-42-1"),
                "session_id": who.get("session_id", "conv-42"),
                "sequence": e["sequence"],
                "timestamp_ms": e["occurred_at_ms"],
            }
            assert e["event"]["version"] == 1
        events += batch
        if batch:
            assert got["next_after_event_sequence"] == batch[-1]["sequence"]
            assert got["has_more"] == (batch[-1]["sequence"] + 1 < got["latest_sequence_exclusive"])
        if not got["has_more"]:
            assert len(events) == got["latest_sequence_exclusive"]
            return events
        cursor = got["next_after_event_sequence"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_repository(path: Path) -> None:
    git(path, "init", "-q", ".")
    (path / "cli.py").write_text(CLI_BEFORE)
    git(path, "add", "cli.py")
    git(path, "commit", "-qm", "init")


@pytest.fixture
async def harness(workspace: Path, tmp_path: Path, fake: FakeLLM) -> AsyncIterator[Http]:
    """The server with the fake LLM, release identity sha256:11…11, a git workspace."""
    make_repository(workspace)
    settings = replace(agent_settings(workspace, tmp_path / "data"), release_identity=RELEASE)
    async with running(settings) as server:
        await initialize(server, fake)
        async with serving(server) as http:
            yield http


def edit_turns() -> list[Any]:
    """The model's turns of section 10: write the two files, then answer."""
    return [
        tool_calls(
            [
                call("write_file", {"path": "cli.py", "content": CLI_AFTER}),
                call("write_file", {"path": "NOTES.md", "content": "# demo\n"}),
            ]
        ),
        text("Added --verbose and a note."),
    ]


async def test_the_worked_examples_of_section_10_byte_for_byte(harness: Http, fake: FakeLLM) -> None:
    fake.script(*edit_turns())
    refs_before = git(harness.server.workspace, "for-each-ref")
    receipt = await command(harness, start())
    assert receipt.pop("state") in ("created", "executing")
    assert receipt.pop("latest_event_sequence_exclusive") >= 0 and receipt.pop("observed_at_ms") > 0
    assert receipt == {
        "schema": "a3s.code.agent-command-receipt.v1",
        "action": "start",
        "request_id": "req-0001",
        "identity": identity(),
        "command_digest": START_DIGEST,
        "replayed": False,
    }
    done = await finished(harness)
    assert done["state"] == "completed"

    # The identical request again: a replay, the run's progress now.
    again = await command(harness, start())
    assert again["command_digest"] == START_DIGEST and again["replayed"] is True
    assert again["state"] == "completed"
    assert again["latest_event_sequence_exclusive"] == done["latest_sequence_exclusive"]
    # The same run id with another prompt, and another release.
    conflict = await command(harness, start(prompt="something else"), 500)
    assert conflict == error_body("RUN_IDENTITY_CONFLICT", "Agent Harness could not complete the request")
    mismatch = await command(harness, start(release=OTHER_RELEASE), 409)
    assert mismatch == error_body(
        "a3s.code.agent_protocol.release_mismatch",
        "Agent protocol identity or state conflicts with the request",
    )

    # 10.2: the first page of 3, then the rest, then caught up, then past the tail.
    first = await page(harness, None, 3)
    assert first["schema"] == "a3s.code.agent-event-page.v1" and first["identity"] == identity()
    assert first["after_event_sequence"] is None and first["first_available_sequence"] == 0
    assert first["next_after_event_sequence"] == 2 and first["has_more"] is True
    assert first["retention_gap"] is False and first["state"] == "completed"
    kinds = [e["event"]["type"] for e in first["events"]]
    assert kinds[0] == "agent_start" and first["events"][0]["event"]["payload"] == {"prompt": PROMPT}
    events = await all_events(harness)
    latest = len(events)
    kinds = [e["event"]["type"] for e in events]
    assert kinds.count("tool_execution_start") == 2 and kinds.count("tool_end") == 2
    assert kinds[-1] == "agent_end" and "turn_end" in kinds
    end = events[-1]["event"]["payload"]
    assert end["text"] == "Added --verbose and a note."
    assert set(end["usage"]) == {
        "prompt_tokens", "completion_tokens", "total_tokens", "cache_read_tokens", "cache_write_tokens"
    }  # fmt: skip
    assert end["verification_summary"]["status"] == "skipped"
    start_call = next(e for e in events if e["event"]["type"] == "tool_execution_start")["event"]["payload"]
    assert start_call["name"] == "write_file" and start_call["args"]["path"] == "cli.py"
    caught_up = await page(harness, latest - 1, 64)
    assert caught_up["events"] == [] and caught_up["has_more"] is False
    assert caught_up["next_after_event_sequence"] == latest - 1
    assert await page(harness, latest, 64, 400) == INVALID_FIELD

    # 10.3: the change set (425 until captured), the spec's trees, digest and patch exactly.
    changes = await eventually(lambda: _changes(harness), "the change set is captured")
    assert changes.pop("observed_at_ms") > 0
    assert changes == {
        "schema": "a3s.code.agent-change-set.v1",
        "identity": identity(),
        "state": "completed",
        "format": "git_unified_diff_v1",
        "encoding": "base64",
        "base_tree": BASE_TREE,
        "result_tree": RESULT_TREE,
        "patch_digest": PATCH_DIGEST,
        "patch_bytes": 444,
        "patch_base64": PATCH_BASE64,
    }
    # The patch applies where the run started. Nothing was written into the user's repository (not
    # even the spec's keep-alive ref): the trees are held in the shadow repository checkpoints use.
    repo = harness.server.workspace
    assert git(repo, "status", "--porcelain") == " M cli.py\n?? NOTES.md\n"  # the index untouched
    assert git(repo, "for-each-ref") == refs_before
    assert subprocess.run(["git", "-C", str(repo), "cat-file", "-e", RESULT_TREE[9:]]).returncode != 0
    held = list(
        (harness.server.runtime.settings.resolved_data_dir / "checkpoints").glob("*/git/refs/a3s/held/*")
    )
    assert sorted(p.read_text().strip() for p in held) == sorted([BASE_TREE[9:], RESULT_TREE[9:]])
    git(repo, "stash", "-u", "-q")
    patch = repo.parent / "patch"
    patch.write_bytes(base64.b64decode(PATCH_BASE64))
    git(repo, "apply", "--check", "--binary", str(patch))

    # 10.4 health, open and in the spec's shape.
    async with harness.client.get("/health/ready") as reply:
        assert reply.status == 200
        assert await reply.json() == {"schema": "a3s.code.agent-health.v1", "status": "ready"}
    async with harness.client.get("/health/live") as reply:
        assert await reply.json() == {"schema": "a3s.code.agent-health.v1", "status": "live"}


def collapsed(events: list[dict[str, Any]]) -> list[str]:
    """The events' types, a run of text deltas as one."""
    kinds = [e["event"]["type"] for e in events]
    return [k for i, k in enumerate(kinds) if not (k == "text_delta" and kinds[i - 1 : i] == [k])]


async def test_each_turn_opens_with_turn_start_and_closes_after_its_tools(
    harness: Http, fake: FakeLLM
) -> None:
    """Section 5's order: a host that closes a turn at its turn_end has the turn's tool results."""
    first = tool_calls(
        [call("write_file", {"path": "a.txt", "content": "a"}), call("list_files", {"path": "."})],
        content="Writing it.",
    )
    fake.script(first, text("Done."))
    await command(harness, start("write a"))
    await finished(harness)
    events = await all_events(harness)
    assert collapsed(events) == [
        "agent_start",
        "turn_start",
        "text_delta",
        "tool_execution_start",
        "tool_execution_start",
        "tool_end",
        "tool_end",
        "turn_end",
        "turn_start",
        "text_delta",
        "turn_end",
        "agent_end",
    ]
    turns = [
        (e["event"]["type"], e["event"]["payload"]["turn"])
        for e in events
        if e["event"]["type"] in ("turn_start", "turn_end")
    ]
    assert turns == [("turn_start", 1), ("turn_end", 1), ("turn_start", 2), ("turn_end", 2)]
    assert events[1]["event"]["payload"] == {"turn": 1}
    ended = [e["event"]["payload"] for e in events if e["event"]["type"] == "turn_end"]
    assert all(set(p) == {"turn", "usage"} and p["usage"]["total_tokens"] > 0 for p in ended)


async def test_the_run_is_an_ordinary_session_seen_over_grpc(harness: Http, fake: FakeLLM) -> None:
    fake.script(text("Hello from the harness."))
    await command(harness, start("say hello"))
    await finished(harness)
    stub = harness.server.stub
    session = (await stub.GetSession(pb.GetSessionRequest(session_id="conv-42"))).session
    assert session.session_id == "conv-42" and session.context_usage.message_count == 2
    # Its chunks are in the session's log, as any generation's (the REST page of the same log).
    async with harness.client.get("/sessions/conv-42/events", params={"limit": "1000"}) as reply:
        log = (await reply.json())["events"]
    chunks = [e["chunk"] for e in log if e["kind"] == "chunk"]
    assert "".join(c.get("content", "") for c in chunks if c["type"] == "CHUNK_TYPE_CONTENT") == (
        "Hello from the harness."
    )
    # A later start in the same session continues the conversation: the model sees the first turn.
    fake.script(text("Again."))
    await command(harness, start("and again", run_id="run-42-9"))
    await finished(harness, run_id="run-42-9")
    contents = [m["content"] for m in fake.requests[-1].messages]
    assert "say hello" in contents and "Hello from the harness." in contents
    # A session id that is not one of ours maps to a session of ours, named by its digest.
    fake.script(text("ok"))
    odd = "conversation #7 / ünïcode"
    await command(harness, start("hi", session_id=odd, run_id="r1"))
    await finished(harness, session_id=odd, run_id="r1")
    ours = our_session_id(odd)
    assert ours == "harness-" + hashlib.sha256(odd.encode()).hexdigest()[:40]
    assert (await stub.GetSession(pb.GetSessionRequest(session_id=ours))).session.session_id == ours


async def test_a_cancel_mid_run_and_its_replays(harness: Http, fake: FakeLLM) -> None:
    marker = harness.server.workspace / ".git" / "started"  # where a command may write, not the work tree
    fake.script(tool_call("bash", {"command": f"touch {marker}; sleep 30"}), text("never"))
    await command(harness, start())
    await eventually(marker.exists, "the tool runs")
    assert (await page(harness, None, 64))["state"] == "executing"
    # 425 while it runs.
    pending = await post(harness, "/v1/agent/changes", changes_request(), 425)
    assert pending == error_body(
        "a3s.code.agent_protocol.change_set_pending", "Agent run changes are still being captured"
    )
    # Starting another run in the busy session.
    busy = await command(harness, start("other", run_id="run-42-3"), 500)
    assert busy == error_body("SESSION_BUSY", "Agent Harness could not complete the request")
    # Section 10.1's cancel request, byte for byte: its digest, cancelled at once.
    receipt = await command(harness, CANCEL_BODY)
    assert receipt["command_digest"] == CANCEL_DIGEST
    assert receipt["state"] == "cancelled" and receipt["replayed"] is False
    again = await command(harness, cancel(reason="another reason", request_id="req-0009"))
    assert again["state"] == "cancelled" and again["replayed"] is True
    assert again["command_digest"] != CANCEL_DIGEST
    events = await eventually(lambda: _tail_is(harness, "error"), "the run's end is in its events")
    assert events[-1]["event"]["payload"]["message"]
    # The turn its tool was cut short in is closed before the error.
    assert collapsed(events) == ["agent_start", "turn_start", "tool_execution_start", "turn_end", "error"]
    assert len(fake.requests) == 1  # the model was not called again
    # Nothing changed: the spec's empty change set.
    changes = await eventually(lambda: _changes(harness), "the change set is captured")
    assert changes["state"] == "cancelled" and changes["patch_bytes"] == 0
    assert changes["patch_base64"] == "" and changes["patch_digest"] == EMPTY_DIGEST
    assert changes["base_tree"] == changes["result_tree"] == BASE_TREE

    # Section 10.1's recover request: a new run from the cancelled one, and its replays.
    fake.script(text("Resumed."))
    receipt = await command(harness, RECOVER_BODY)
    assert receipt["command_digest"] == RECOVER_DIGEST and receipt["action"] == "recover"
    assert receipt["identity"]["run_id"] == "run-42-2" and receipt["replayed"] is False
    done = await finished(harness, run_id="run-42-2")
    assert done["state"] == "completed"
    first = (await page(harness, None, 1, run_id="run-42-2"))["events"][0]["event"]
    assert first["payload"] == {"prompt": "<resume run=run-42-1>"}
    assert (await command(harness, RECOVER_BODY))["replayed"] is True
    conflict = await command(harness, recover("run-42-9", run_id="run-42-2"), 500)
    assert conflict["error"]["code"] == "RUN_IDENTITY_CONFLICT"
    conflict = await command(harness, recover("run-42-2", run_id="run-42-1"), 500)
    assert conflict["error"]["code"] == "RUN_IDENTITY_CONFLICT"  # a start's run id
    missing = await command(harness, recover("no-such-run", run_id="run-42-7"), 500)
    assert missing == error_body("SESSION_ERROR", "Agent Harness could not complete the request")


async def _tail_is(http: Http, kind: str) -> list[dict[str, Any]] | None:
    events = await all_events(http)
    return events if events and events[-1]["event"]["type"] == kind else None


async def _changes(http: Http) -> dict[str, Any] | None:
    async with http.client.post("/v1/agent/changes", json=changes_request()) as reply:
        return await reply.json() if reply.status == 200 else None


async def test_paging_through_a_long_run(harness: Http, fake: FakeLLM) -> None:
    answer = "".join(f"word{i} " for i in range(150))  # 8-character deltas: over a hundred chunks,
    # written apart (the deltas one network read brings go on as one)
    fake.script(tool_call("list_files", {"path": "."}), replace(text(answer), chunk_delay=0.002))
    await command(harness, start("long"))
    await finished(harness)
    for limit in (64, 7, 1):
        events = await all_events(harness, limit)
        deltas = [e["event"]["payload"]["text"] for e in events if e["event"]["type"] == "text_delta"]
        assert "".join(deltas) == answer and len(deltas) > 100
    # Pages read while the run goes are a prefix of the final ones.
    assert len(events) > 128


async def test_malformed_requests_are_invalid_json(harness: Http) -> None:
    # 10.5 exactly; the value is not echoed.
    assert await command(harness, {"action": "start", "secret": "x"}, 400) == INVALID_JSON
    good = start()
    bad_bodies: list[Any] = [
        "{",
        "[]",
        '{"action":"start","request":{}}',
        {**good, "extra": 1},
        {"action": "pause", "request": good["request"]},
        {"action": "start", "request": {**good["request"], "unknown": True}},
        {"action": "start", "request": {**good["request"], "prompt": 7}},
        {"action": "start", "request": {k: v for k, v in good["request"].items() if k != "prompt"}},
        {"action": "start", "request": {**good["request"], "identity": {**identity(), "extra": ""}}},
        json.dumps(good)[:-1] + ',"action":"start"}',  # a duplicated key
        json.dumps(good).replace("Add a", "\\ud800 Add a"),  # a lone surrogate
    ]
    for body in bad_bodies:
        assert await command(harness, body, 400) == INVALID_JSON, body
    for limit in (-1, 65536, 1.0, True, "3", None):
        assert await page(harness, None, limit, 400) == INVALID_JSON  # type: ignore[arg-type]
    for after in (-1, 2**64, 0.5):
        assert await page(harness, after, 3, 400) == INVALID_JSON  # type: ignore[arg-type]
    # The content type, and the 128 KiB body bound.
    body = json.dumps(good)
    for headers in ({"Content-Type": "text/plain"}, {}, {"Content-Type": "application/xml"}):
        got = await post(harness, "/v1/agent/commands", body, 400, headers=headers)
        assert got == INVALID_JSON
    padded = body[:-1] + " " * (128 * 1024 - len(body)) + "}"
    assert len(padded) == 128 * 1024 + 0
    big = body[:-1] + " " * (128 * 1024 - len(body) + 1) + "}"
    assert await command(harness, big, 400) == INVALID_JSON
    chunked = await harness.client.post(
        "/v1/agent/commands", data=_chunks(big.encode()), headers={"Content-Type": "application/json"}
    )
    assert chunked.status == 400 and await chunked.json() == INVALID_JSON
    # ... while application/*+json and a body of exactly 128 KiB are read.
    receipt = await post(
        harness, "/v1/agent/commands", padded, headers={"Content-Type": "application/vnd.a3s+json"}
    )
    assert receipt["command_digest"] == START_DIGEST


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 4096):
        yield data[i : i + 4096]


async def test_values_that_break_their_rules(harness: Http) -> None:
    good = start()
    request = good["request"]

    def changed(path: tuple[str, ...], value: Any) -> dict[str, Any]:
        body = copy.deepcopy(good)
        holder = body["request"]
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
        return body

    unsupported = [changed(("schema",), "a3s.code.agent-run-start.v2"), changed(("identity", "schema"), "x")]
    for body in unsupported:
        assert await command(harness, body, 400) == UNSUPPORTED
    invalid = [
        changed(("identity", "protocol"), "a3s.code.agent.v2"),
        changed(("identity", "agent_release_identity"), "sha256:" + "A" * 64),
        changed(("identity", "agent_release_identity"), "sha256:" + "1" * 63),
        changed(("identity", "session_id"), "   "),
        changed(("identity", "session_id"), "a\nb"),
        changed(("identity", "run_id"), "r" * 257),
        changed(("identity", "run_id"), "é" * 129),  # 258 bytes
        changed(("identity", "run_id"), "a\0b"),
        changed(("request_id",), ""),
        changed(("request_id",), "a\rb"),
        changed(("prompt",), " \n "),
        changed(("prompt",), "x" * (64 * 1024 + 1)),
        changed(("prompt",), "nul\0"),
    ]
    for body in invalid:
        assert await command(harness, body, 400) == INVALID_FIELD, body["request"]
    assert request["prompt"] == PROMPT  # the copies were changed, not the original
    assert await command(harness, cancel(reason=""), 400) == INVALID_FIELD
    assert await command(harness, cancel(reason="x" * 1025), 400) == INVALID_FIELD
    assert await command(harness, recover("run-42-1"), 400) == INVALID_FIELD  # its own run id
    for limit in (0, 65):
        assert await page(harness, None, limit, 400) == INVALID_FIELD
    # A wrong schema wins over a bad value: schema first.
    both = changed(("schema",), "nope")
    both["request"]["prompt"] = ""
    assert await command(harness, both, 400) == UNSUPPORTED
    # The rules allow what they do not forbid: a 256-byte id, a multi-line prompt.
    ok = changed(("identity", "run_id"), "r" * 256)
    ok["request"]["prompt"] = "two\nlines"
    assert (await command(harness, ok))["replayed"] is False


async def test_unknown_sessions_and_runs_and_changes_without_git(
    workspace: Path, tmp_path: Path, fake: FakeLLM
) -> None:
    not_found = "Agent protocol resource was not found"
    async with running(agent_settings(workspace, tmp_path / "data")) as server:  # no release set
        await initialize(server, fake)
        async with serving(server) as http:
            session_missing = error_body("a3s.code.agent_protocol.session_not_found", not_found)
            assert await page(http, None, 3, 404) == session_missing
            assert await post(http, "/v1/agent/changes", changes_request(), 404) == session_missing
            assert await command(http, cancel(), 404) == session_missing
            # Any well-formed release digest is accepted when none is configured.
            fake.script(text("fine"))
            await command(http, start(release=OTHER_RELEASE))
            done = await finished(http, release=OTHER_RELEASE)
            assert done["state"] == "completed"
            run_missing = error_body("a3s.code.agent_protocol.run_not_found", not_found)
            assert await page(http, None, 3, 404, run_id="nope") == run_missing
            assert await command(http, cancel(run_id="nope"), 404) == run_missing
            # The workspace is not a git repository: no change set, ever.
            unavailable = error_body(
                "a3s.code.agent_protocol.change_set_unavailable", "Agent run has no Git-compatible change set"
            )
            assert await post(http, "/v1/agent/changes", changes_request(), 422) == unavailable
            # A cancel of a finished run changes nothing: a replay with its terminal state.
            replay = await command(http, cancel())
            assert replay["replayed"] is True and replay["state"] == "completed"


async def test_a_failed_run_and_its_error_event(harness: Http, fake: FakeLLM) -> None:
    harness.server.runtime.settings.llm_retries = 0
    fake.script(*[text("x", delay=5.0)] * 3)  # slower than the 1 s timeout
    await command(harness, start("time out"))
    done = await finished(harness)
    assert done["state"] == "failed"
    events = await all_events(harness)
    assert events[-1]["event"]["type"] == "error" and events[-1]["event"]["payload"]["message"]


async def test_the_server_refuses_with_harness_closed_while_not_ready(harness: Http) -> None:
    readiness = Readiness(Application(harness.server.runtime).lifecycle)  # starting
    async with serving(harness.server, readiness=readiness) as http:
        closed = error_body("a3s.code.agent_protocol.harness_closed", "Agent Harness is draining")
        assert await command(http, start(), 503) == closed
        assert await page(http, None, 3, 503) == closed
        async with http.client.get("/health/ready") as reply:
            assert reply.status == 503
            assert await reply.json() == {"schema": "a3s.code.agent-health.v1", "status": "not_ready"}


async def test_the_token_guards_the_harness(workspace: Path, tmp_path: Path) -> None:
    settings = replace(agent_settings(workspace, tmp_path / "data"), auth_token="s3cret-token")
    async with running(settings) as server, serving(server) as http:
        async with http.client.post("/v1/agent/commands", json=start()) as reply:
            assert reply.status == 401 and (await reply.json())["error"]["code"] == "UNAUTHENTICATED"
        headers = {"Authorization": "Bearer s3cret-token"}
        async with http.client.post(
            "/v1/agent/events:page", json=page_request(None, 3), headers=headers
        ) as reply:
            assert reply.status == 404  # through the token: the protocol's own answer
        async with http.client.get("/health/ready") as reply:
            assert reply.status == 200  # the probes stay open


async def test_a_hostile_repository_runs_nothing_while_changes_are_captured(
    harness: Http, fake: FakeLLM
) -> None:
    repo = harness.server.workspace
    pwned = repo.parent / "pwned"
    for key, value in [
        ("core.fsmonitor", f"touch {pwned}.fsmonitor; false"),
        ("diff.external", f"sh -c 'touch {pwned}.diff'"),
        ("filter.evil.clean", f"sh -c 'touch {pwned}.clean; cat'"),
        ("filter.evil.smudge", f"sh -c 'touch {pwned}.smudge; cat'"),
        ("diff.evil.textconv", f"sh -c 'touch {pwned}.textconv; cat'"),
        ("core.pager", f"sh -c 'touch {pwned}.pager; cat'"),
    ]:
        git(repo, "config", key, value)
    (repo / ".gitattributes").write_text("* filter=evil diff=evil\n")
    hooks = repo / ".git" / "hooks"
    for hook in ("post-index-change", "reference-transaction"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {pwned}.{hook}\n")
        (hooks / hook).chmod(0o755)
    fake.script(*edit_turns())
    await command(harness, start())
    await finished(harness)
    changes = await eventually(lambda: _changes(harness), "the change set is captured")
    patch = base64.b64decode(changes["patch_base64"])
    assert b"+# demo" in patch and b'+    verbose = "--verbose" in sys.argv' in patch
    assert sorted(p.name for p in repo.parent.iterdir() if p.name.startswith("pwned")) == []


async def test_concurrent_duplicate_starts_admit_one_run(harness: Http, fake: FakeLLM) -> None:
    fake.script(text("once"))
    receipts = await asyncio.gather(*(command(harness, start(request_id=f"req-{i}")) for i in range(6)))
    assert sorted(r["replayed"] for r in receipts) == [False] + [True] * 5
    await finished(harness)
    assert len(fake.requests) == 1


async def test_runs_survive_a_restart(workspace: Path, tmp_path: Path, fake: FakeLLM) -> None:
    """A host retrying after a restart gets a replay, the same events and the same change set; a
    run its process left executing cannot be cancelled (409) but can be recovered."""
    make_repository(workspace)
    settings = replace(agent_settings(workspace, tmp_path / "data"), release_identity=RELEASE)
    async with running(settings) as server:
        await initialize(server, fake)
        async with serving(server) as http:
            fake.script(*edit_turns())
            await command(http, start())
            await finished(http)
            before = await all_events(http)
            changes = await eventually(lambda: _changes(http), "the change set is captured")
    async with running(settings) as server:
        await initialize(server, fake)
        await server.runtime.store.reserve_harness_run(
            "conv-42",
            "run-dead",
            {
                "prompt": "p",
                "workspace": str(workspace),
                "after_seq": 0,
                "updated_at": 1,
                "state": "executing",
                "chunk_run": "",
                "failure": "",
                "base_tree": None,
                "result_tree": None,
                "captured_at": 0,
            },
        )
        async with serving(server) as http:
            replay = await command(http, start())
            assert replay["replayed"] is True and replay["state"] == "completed"
            assert replay["command_digest"] == START_DIGEST
            assert replay["latest_event_sequence_exclusive"] == len(before)
            assert await all_events(http) == before
            assert await post(http, "/v1/agent/changes", changes_request()) == changes
            assert (await command(http, start(prompt="other"), 500))["error"][
                "code"
            ] == "RUN_IDENTITY_CONFLICT"
            assert len(fake.requests) == 2  # nothing ran again
            unavailable = await command(http, cancel(run_id="run-dead"), 409)
            assert unavailable == error_body(
                "a3s.code.agent_protocol.run_unavailable",
                "Agent protocol identity or state conflicts with the request",
            )
            pending = await post(http, "/v1/agent/changes", changes_request(run_id="run-dead"), 425)
            assert pending["error"]["code"] == "a3s.code.agent_protocol.change_set_pending"
            fake.script(text("Picked up."))
            await command(http, recover("run-dead", run_id="run-next"))
            assert (await finished(http, run_id="run-next"))["state"] == "completed"
            assert "run-dead" in fake.requests[-1].messages[-1]["content"]


def test_the_release_identity_is_a_sha256_digest_checked_at_start(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    assert settings_from(release_identity=digest, env={}).release_identity == digest
    assert settings_from(env={"A3S_RELEASE_IDENTITY": digest}).release_identity == digest
    assert settings_from(env={}).release_identity == ""  # any well-formed digest is accepted
    for bad in ("sha256:" + "AB" * 32, "sha256:abc", "md5:" + "a" * 32, digest + "0"):
        with pytest.raises(ConfigError, match="--release-identity"):
            settings_from(release_identity=bad, env={})
    serve = subprocess.run(
        [sys.executable, "-m", "a3s_agent", "serve", "--release-identity", "sha256:nope"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert serve.returncode == 2 and "--release-identity (A3S_RELEASE_IDENTITY) must be" in serve.stderr


async def test_a_retention_gap_is_reported_and_paging_goes_on_from_what_is_kept(
    harness: Http, fake: FakeLLM
) -> None:
    fake.script(replace(text("".join(f"w{i} " for i in range(40))), chunk_delay=0.002))  # deltas apart
    await command(harness, start("long enough"))
    await finished(harness)
    latest = len(await all_events(harness))
    await harness.server.runtime.store.prune_log(0, 6)  # the session keeps its newest 6 entries
    got = await page(harness, None, 64)
    first = got["first_available_sequence"]
    assert got["retention_gap"] is True and 0 < first < latest
    assert got["latest_sequence_exclusive"] == latest
    assert [e["sequence"] for e in got["events"]] == list(range(first, latest))
    assert got["has_more"] is False and got["next_after_event_sequence"] == latest - 1
    # A cursor inside what is kept has no gap.
    kept = await page(harness, first, 64)
    assert kept["retention_gap"] is False and kept["events"][0]["sequence"] == first + 1


def test_an_oversized_payload_is_bounded() -> None:
    from a3s_agent.app.harness_events import MAX_PAYLOAD_BYTES, TRUNCATED, bounded

    small = {"id": "call_1", "name": "bash", "output": "fine", "exit_code": 0}
    assert bounded(small) is small
    big = {**small, "output": "x" * 300_000, "note": "y" * 1000}
    shrunk = bounded(big)
    assert shrunk["output"].endswith(TRUNCATED) and shrunk["note"] == "y" * 1000
    assert len(json.dumps(shrunk, ensure_ascii=False).encode()) <= MAX_PAYLOAD_BYTES
    # Too many keys to shrink by halving strings: a stub with the digest and the identity keys.
    wide = {"id": "call_2", "turn": 3, **{f"k{i}": "z" * 40 for i in range(3000)}}
    stub = bounded(wide)
    original = json.dumps(wide, ensure_ascii=False, separators=(",", ":")).encode()
    assert stub == {
        "bounded": True,
        "reason": "agent_protocol_event_payload_limit",
        "original_payload_sha256": "sha256:" + hashlib.sha256(original).hexdigest(),
        "id": "call_2",
        "turn": 3,
    }


def steer(words: str, request_id: str = "req-0005", **who: str) -> dict[str, Any]:
    return {
        "action": "steer",
        "request": {
            "schema": "a3s.code.agent-run-steer.v1",
            "request_id": request_id,
            "identity": identity(**who),
            "input": words,
        },
    }


async def test_a_steer_reaches_the_running_turn_and_is_in_its_events(harness: Http, fake: FakeLLM) -> None:
    git_dir = harness.server.workspace / ".git"  # where a command may write, not the work tree
    started, go = git_dir / "started", git_dir / "go"
    held = f"touch {started}; for i in $(seq 600); do [ -f {go} ] && break; sleep 0.05; done"
    fake.script(
        tool_call("bash", {"command": held}), lambda body: text(f"heard: {body['messages'][-1]['content']}")
    )
    unknown = await command(harness, steer("too early"), 404)
    assert unknown["error"]["code"].endswith("session_not_found")
    await command(harness, start())
    await eventually(started.exists, "the tool runs")

    receipt = await command(harness, steer("use tabs, not spaces"))
    assert receipt["action"] == "steer" and receipt["state"] == "executing" and receipt["replayed"] is False
    assert (await command(harness, steer("x" * 70_000), 400)) == INVALID_FIELD  # over the prompt bound
    other = await command(harness, steer("not yours", run_id="run-42-9"), 404)
    assert other["error"]["code"].endswith("run_not_found")
    go.touch()
    done = await finished(harness)
    assert done["state"] == "completed"

    events = await all_events(harness)
    applied = [e["event"]["payload"] for e in events if e["event"]["type"] == "run_control_applied"]
    assert applied == [
        {"request_id": "req-0005", "operation": "steer", "turn_id": None, "turn_revision": 0,
         "input": "use tabs, not spaces"}
    ]  # fmt: skip
    assert events[-1]["event"]["payload"]["text"] == "heard: use tabs, not spaces"
    assert fake.requests[1].messages[-1] == {"role": "user", "content": "use tabs, not spaces"}
    late = await command(harness, steer("after the end", request_id="req-0006"), 409)
    assert late["error"]["code"].endswith("run_unavailable")
