"""benchmarks/peer_opencode.py (`python -m benchmarks --peer opencode`): the parts that need no npm,
our side of the task against a real server and the real fake LLM, and the whole comparison where
npm is."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks import peer_opencode as peer
from benchmarks.common import checkout_of


def test_config_points_only_at_the_fake_and_asks_nothing() -> None:
    config = peer.opencode_config("http://127.0.0.1:1234/v1")
    provider = config["provider"]["fake"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:1234/v1"
    assert config["model"] == config["small_model"] == "fake/fake-model"
    assert provider["models"]["fake-model"]["tool_call"] is True
    assert (config["autoupdate"], config["share"], config["lsp"], config["formatter"]) == (
        False,
        "disabled",
        False,
        False,
    )
    assert config["permission"] == "allow"
    json.dumps(config)  # written as opencode.json


def test_environment_keeps_opencode_inside_its_temp_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENCODE_CONFIG_CONTENT", '{"model": "anthropic/claude"}')
    monkeypatch.setenv("XDG_CONFIG_HOME", "/root/.config")
    rg = tmp_path / "bin" / "rg"
    env = peer.opencode_env(tmp_path / "home", tmp_path / "home" / "opencode.json", rg)
    assert "OPENCODE_CONFIG_CONTENT" not in env  # the user's own settings do not leak in
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        assert Path(env[name]).is_relative_to(tmp_path / "home"), name
    assert env["PATH"].split(":")[0] == str(rg.parent)
    assert env["OPENCODE_CONFIG"] == str(tmp_path / "home" / "opencode.json")
    for flag in ("AUTOUPDATE", "MODELS_FETCH", "LSP_DOWNLOAD", "DEFAULT_PLUGINS", "SHARE"):
        assert env[f"OPENCODE_DISABLE_{flag}"] == "1"


def test_install_without_npm_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert peer.install(tmp_path / "cache") == "npm is not on PATH"


def _tools(*names: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": {}}} for n in names]


def _play(tools: list[dict[str, Any]], folder: str) -> list[tuple[str, str, dict[str, Any] | str]]:
    """Plays the script as a model conversation would go; returns (side, tool or "text", arguments)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": peer.prompt(folder)}]},
    ]
    played = []
    for index in range(10):
        side, turn = peer.scripted_turn({"messages": messages, "tools": tools})
        if not turn.tool_calls:
            played.append((side, "text", turn.content))
            return played
        call = turn.tool_calls[0]
        played.append((side, call.name, dict(call.arguments)))
        messages += [
            {"role": "assistant", "tool_calls": [{"id": f"c{index}", "function": {"name": call.name}}]},
            {"role": "tool", "tool_call_id": f"c{index}", "content": "ok"},
        ]
    raise AssertionError("the script never ends")


def test_the_same_six_turns_in_each_sides_names() -> None:
    ours = _play(_tools("read_file", "grep", "edit_file", "bash", "write_file", "ls"), "w7")
    theirs = _play(_tools("read", "grep", "edit", "bash", "write", "glob"), "w7")
    assert [name for _, name, _ in ours] == ["read_file", "grep", "edit_file", "bash", "write_file", "text"]
    assert [name for _, name, _ in theirs] == ["read", "grep", "edit", "bash", "write", "text"]
    assert {side for side, _, _ in ours} == {"ours"} and {side for side, _, _ in theirs} == {"opencode"}
    assert ours[2][2] == {"path": "w7/src/app.py", "old_string": "return 'Hello ' + name",
                          "new_string": "return 'Hi ' + name"}  # fmt: skip
    assert theirs[2][2] == {"filePath": "w7/src/app.py", "oldString": "return 'Hello ' + name",
                            "newString": "return 'Hi ' + name"}  # fmt: skip
    assert ours[-1][2] == theirs[-1][2] == peer.ANSWER


def test_a_request_without_tools_is_opencodes_title_request() -> None:
    side, turn = peer.scripted_turn({"messages": [{"role": "user", "content": "folder=w0 go"}]})
    assert side == "title" and turn.content == peer.TITLE


def test_record_sees_a_changed_prefix() -> None:
    body = {"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "x"}],
            "tools": _tools("read_file")}  # fmt: skip
    first = peer.request_record(body, "ours")
    later = peer.request_record(
        {**body, "messages": [*body["messages"], {"role": "user", "content": "y"}]}, "ours"
    )
    changed = peer.request_record({**body, "messages": [{"role": "system", "content": "b"}]}, "ours")
    assert first["prefix"] == later["prefix"] and later["bytes"] > first["bytes"]
    assert changed["prefix"] != first["prefix"]
    assert first["tools_bytes"] == len(json.dumps(body["tools"], separators=(",", ":")))


def test_goals_are_evaluated_on_values_and_ratios() -> None:
    ours = {
        "tool schemas per request (KB)": 15.0,
        "request bytes per turn (KB)": 8.0,
        "first session after ready (ms)": 25.0,
        "server CPU per task (ms)": 12.0,
        "100 concurrent / one session, 200 ms model latency (ratio)": 3.0,
    }
    theirs = {**ours, "request bytes per turn (KB)": 10.0, "server CPU per task (ms)": 200.0,
              "100 concurrent / one session, 200 ms model latency (ratio)": 20.0}  # fmt: skip
    verdicts = {row[0]: row[4] for row in peer.table_rows(ours, theirs)}
    assert verdicts["tool schemas per request (KB)"].endswith(": met")
    assert verdicts["request bytes per turn (KB)"].endswith("not met")  # 0.8 > 0.7
    assert verdicts["first session after ready (ms)"].endswith("not met")  # 1.0 > 0.05
    assert verdicts["server CPU per task (ms)"].endswith(": met")  # 0.06 <= 0.1
    assert verdicts["100 concurrent / one session, 200 ms model latency (ratio)"].endswith(
        ": met"
    )  # 0.15 <= 0.2
    alone = {row[0]: row for row in peer.table_rows(ours, None)}
    assert alone["server CPU per task (ms)"][2:] == ("", "", "ratio <= 0.1: not measured")
    assert alone["tool schemas per request (KB)"][4].endswith(": met")


async def test_our_side_of_the_task_on_a_real_server(tmp_path: Path) -> None:
    """The scripted task through gRPC Generate on a real `a3s-agent serve` and the fake LLM process."""
    samples = peer.Samples()
    with peer.FakeProcess(tmp_path / "requests.jsonl", 0) as fake:
        workspace = tmp_path / "ours"
        peer.make_workspace(workspace, 2)
        server = peer.Ours(workspace, fake.base_url)
        try:
            await peer.one_run(server, samples, fake=fake, latency_ms=0)
        finally:
            await server.stop()
        records = fake.read()
    assert len(records) == 12 and {r["side"] for r in records} == {"ours"}  # warm-up + measured
    assert samples.prefix_stable and len(samples.requests) == 6
    assert (workspace / "w1" / "NOTES.md").read_text() == "greet says Hi now.\n"
    figures = peer.summarize(samples)
    assert figures["model requests per task"] == 6
    assert figures["tool schemas per request (KB)"] > 0


def test_the_code_before_has_a_row_beside_each_start_figure() -> None:
    """Rows of the code before (MEMORY_BASELINE) follow today's, judged against the same OpenCode."""
    ours = {
        "cold start to health (ms)": 700.0,
        "first session after ready (ms)": 4.0,
        peer.IDLE_RSS: 70.0,
        "server CPU per task (ms)": 12.0,
    }
    before = {"cold start to health (ms)": 650.0, "first session after ready (ms)": 3.0, peer.IDLE_RSS: 150.0}
    theirs = {
        "cold start to health (ms)": 1500.0,
        "first session after ready (ms)": 200.0,
        peer.IDLE_RSS: 300.0,
    }
    rows = peer.table_rows(ours, theirs, before)
    assert [row[0] for row in rows] == [
        "cold start to health (ms)",
        f"cold start to health (ms), before ({peer.MEMORY_BASELINE})",
        "first session after ready (ms)",
        f"first session after ready (ms), before ({peer.MEMORY_BASELINE})",
        peer.IDLE_RSS,
        f"{peer.IDLE_RSS}, before ({peer.MEMORY_BASELINE})",
        "server CPU per task (ms)",
    ]
    assert rows[4][1:] == ("70.00", "300", "0.23", "ratio <= 0.25: met")
    assert rows[5][1:] == ("150", "300", "0.50", "ratio <= 0.25: not met")
    assert rows[2][4] == "ratio <= 0.05: met"


async def test_start_figures_of_today_and_of_the_code_before(tmp_path: Path) -> None:
    """The start phase on real servers: today's code, and the code of MEMORY_BASELINE unpacked
    beside it, each left idle once (cold start, RSS after ready) and asked for a session once."""
    sides = {"today": peer.Samples(), "before": peer.Samples()}
    source = {"today": None, "before": checkout_of(peer.MEMORY_BASELINE, tmp_path)}
    with peer.FakeProcess(tmp_path / "requests.jsonl", 0) as fake:
        for name, samples in sides.items():
            for index, measure in enumerate((peer.idle_run, peer.first_session_run)):
                workspace = tmp_path / f"{name}-{index}"
                peer.make_workspace(workspace)
                server = peer.Ours(workspace, fake.base_url, source[name])
                try:
                    await measure(server, samples)
                finally:
                    await server.stop()
    for samples in sides.values():
        figures = peer.start_figures(samples)
        assert len(samples.start_s) == 2 and figures["cold start to health (ms)"] > 0
        assert figures["first session after ready (ms)"] > 0 and figures[peer.IDLE_RSS] > 20


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is needed to install opencode-ai")
@pytest.mark.skipif(
    not os.environ.get("A3S_PEER_BENCH"),
    reason="installs OpenCode from npm and runs it for minutes: set A3S_PEER_BENCH=1 to run it",
)
async def test_the_whole_comparison(tmp_path: Path) -> None:
    table = (await peer.run(runs=1, counts=(2,))).markdown()
    assert "OpenCode not run" not in table, table
    assert "prefix stable: yes" in table
    row = next(line for line in table.splitlines() if line.startswith("| server CPU per task"))
    assert len([cell for cell in row.split("|") if cell.strip()]) == 5, row
