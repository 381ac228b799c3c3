"""Tool metrics, cost summaries and queue statistics (the later dialect's GetToolMetrics,
GetCostSummary, GetQueueStats) through the app layer, after real generations against the fake
LLM over real gRPC: tool calls and model use come from the durable log (the same after a
restart), lanes from the live control state, prices from the operator's file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from a3s_agent.app import Application
from a3s_agent.app import observability as observability_module
from a3s_agent.app.observability import CostSummary, LaneStats, Observability, QueueStats, ToolMetrics
from a3s_agent.base.errors import InvalidArgument, NotFound
from a3s_agent.base.prices import MAX_FILE_BYTES, ModelPrice, load_prices
from a3s_agent.config import ConfigError, settings_from
from a3s_agent.core.store.protocol import LogEntry
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, error, text, tool_call, tool_calls

from .conftest import LiveServer, agent_settings, eventually, initialize, new_session, running, user

PRICES = {"fake-model": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}


def app_of(server: LiveServer) -> Application:
    return Application(server.runtime)


def generate(server: LiveServer, session_id: str, content: str = "go") -> asyncio.Task[pb.GenerateResponse]:
    return asyncio.ensure_future(
        server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user(content)]))
    )


@pytest.fixture
def prices_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(PRICES))
    return path


@pytest.fixture
async def priced(
    workspace: Path, tmp_path: Path, fake: FakeLLM, prices_file: Path
) -> AsyncIterator[LiveServer]:
    """A server with the operator's price file, its model the fake LLM."""
    settings = replace(agent_settings(workspace, tmp_path / "data"), model_prices=load_prices(prices_file))
    async with running(settings) as server:
        await initialize(server, fake)
        yield server


async def tool_run(server: LiveServer, fake: FakeLLM) -> str:
    """A session whose generation made a bash call (50 ms or more) that succeeded and a call of
    A3S Code's `read` that failed (no such file)."""
    fake.script(
        tool_calls([("bash", {"command": "sleep 0.05; echo hi"}), ("read", {"file_path": "missing.txt"})]),
        text("done"),
    )
    session_id = await new_session(server)
    reply = await generate(server, session_id)
    assert [c.result.success for c in reply.tool_calls] == [True, False]
    return session_id


# --- tool metrics ----------------------------------------------------------------------------


async def test_tool_metrics_count_the_model_s_calls_by_the_names_it_used(
    agent: LiveServer, fake: FakeLLM
) -> None:
    before = datetime.now(UTC)
    session_id = await tool_run(agent, fake)
    after = datetime.now(UTC)
    fake.script(tool_call("bash", {"command": "true"}), text("ok"))
    other = await new_session(agent)
    await generate(agent, other)
    observability = app_of(agent).observability

    metrics = await observability.tool_metrics(session_id, None)
    bash, read = metrics.tools
    assert (bash.tool_name, bash.total_calls, bash.success_count, bash.failure_count) == ("bash", 1, 1, 0)
    assert bash.total_duration_ms >= 50
    assert bash.min_duration_ms == bash.max_duration_ms == bash.avg_duration_ms == bash.total_duration_ms
    assert (read.tool_name, read.total_calls, read.success_count, read.failure_count) == ("read", 1, 0, 1)
    assert metrics.total_calls == 2
    assert metrics.total_duration_ms == bash.total_duration_ms + read.total_duration_ms
    for stats in metrics.tools:
        called = datetime.fromisoformat(stats.last_called_at)
        assert called.utcoffset() == timedelta(0)
        assert before - timedelta(milliseconds=5) <= called <= after

    everywhere = await observability.tool_metrics(None, None)
    assert {t.tool_name: t.total_calls for t in everywhere.tools} == {"bash": 2, "read": 1}
    assert everywhere.total_calls == 3
    only_read = await observability.tool_metrics(None, "read")
    assert [t.tool_name for t in only_read.tools] == ["read"] and only_read.total_calls == 1
    # A3S Code's `read` is read_file's alias, but metrics keep the name the model used.
    assert await observability.tool_metrics(None, "read_file") == ToolMetrics([], 0, 0)
    assert await observability.tool_metrics(session_id, "x" * 100_000) == ToolMetrics([], 0, 0)
    with pytest.raises(NotFound):
        await observability.tool_metrics("ghost", None)


async def test_durations_are_those_of_the_calls(agent: LiveServer, fake: FakeLLM) -> None:
    fake.script(
        tool_call("bash", {"command": "sleep 0.3"}),
        tool_call("bash", {"command": "true"}),
        text("done"),
    )
    session_id = await new_session(agent)
    await generate(agent, session_id)
    (bash,) = (await app_of(agent).observability.tool_metrics(session_id, "bash")).tools
    assert bash.total_calls == 2
    assert 300 <= bash.max_duration_ms < 3000 and bash.min_duration_ms < 300
    assert abs(bash.avg_duration_ms - bash.total_duration_ms / 2) <= 1


# --- cost summaries --------------------------------------------------------------------------


def _today() -> date:
    return datetime.now(UTC).date()


async def test_cost_is_tokens_times_the_operator_s_prices(priced: LiveServer, fake: FakeLLM) -> None:
    first_day = _today()
    session_id = await tool_run(priced, fake)
    days = {first_day.isoformat(), _today().isoformat()}  # the run may cross midnight
    usage = priced.runtime.sessions.get(session_id).usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    summary = await app_of(priced).observability.cost_summary(session_id, None, None, None)
    cost = (usage.prompt_tokens * 3.0 + usage.completion_tokens * 15.0) / 1e6
    assert summary.call_count == 2  # the model's calls: the tool turn and the answer
    assert (summary.total_prompt_tokens, summary.total_completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert summary.total_tokens == usage.total_tokens
    assert summary.total_cost_usd == pytest.approx(cost)
    (model,) = summary.by_model
    assert (model.model, model.call_count, model.total_tokens) == ("fake-model", 2, usage.total_tokens)
    assert model.cost_usd == pytest.approx(cost)
    (day,) = summary.by_day
    assert day.date in days and (day.call_count, day.total_tokens) == (2, usage.total_tokens)
    assert day.cost_usd == pytest.approx(cost)


async def test_without_a_price_file_tokens_are_counted_at_no_cost(agent: LiveServer, fake: FakeLLM) -> None:
    session_id = await tool_run(agent, fake)
    summary = await app_of(agent).observability.cost_summary(None, None, None, None)
    assert summary.total_cost_usd == 0.0 and summary.by_model[0].cost_usd == 0.0
    assert summary.total_tokens == agent.runtime.sessions.get(session_id).usage.total_tokens > 0
    assert summary.call_count == 2


async def test_cost_filters_by_model_and_day(priced: LiveServer, fake: FakeLLM) -> None:
    session_id = await tool_run(priced, fake)
    observability = app_of(priced).observability
    full = await observability.cost_summary(session_id, None, None, None)
    (day,) = full.by_day  # the day the calls were made (not the day the test module was loaded)
    spent = date.fromisoformat(day.date)
    today, tomorrow, yesterday = (
        d.isoformat() for d in (spent, spent + timedelta(days=1), spent - timedelta(days=1))
    )
    assert await observability.cost_summary(session_id, "fake-model", today, today) == full
    assert await observability.cost_summary(None, None, yesterday, tomorrow) == full
    assert await observability.cost_summary(session_id, "another-model", None, None) == CostSummary()
    assert await observability.cost_summary(session_id, None, tomorrow, None) == CostSummary()
    assert await observability.cost_summary(session_id, None, None, yesterday) == CostSummary()
    assert await observability.cost_summary(session_id, None, tomorrow, yesterday) == CostSummary()


@pytest.mark.parametrize(
    "bad",
    ["2026-13-01", "2026-02-30", "tomorrow", "20261124", "2026-W47-2", "2026-11-24T00:00", "x" * 10_000],
)
async def test_a_malformed_date_is_refused_naming_it(agent: LiveServer, bad: str) -> None:
    observability = app_of(agent).observability
    with pytest.raises(InvalidArgument, match="start_date must be a date as YYYY-MM-DD") as err:
        await observability.cost_summary(None, None, bad, None)
    assert len(str(err.value)) < 200
    with pytest.raises(InvalidArgument, match="end_date"):
        await observability.cost_summary(None, None, "2026-01-01", bad)


async def test_failed_and_cancelled_generations_count_what_they_spent(
    agent: LiveServer, fake: FakeLLM
) -> None:
    observability = app_of(agent).observability
    fake.script(tool_call("bash", {"command": "true"}), error(400))
    failed = await new_session(agent)
    with pytest.raises(grpc.aio.AioRpcError):
        await generate(agent, failed)
    summary = await observability.cost_summary(failed, None, None, None)
    assert summary.call_count == 1
    assert summary.total_tokens == agent.runtime.sessions.get(failed).usage.total_tokens > 0

    fake.script(tool_call("bash", {"command": "sleep 60"}, id="call_slow"), text("never"))
    cancelled = await new_session(agent)
    running_generation = generate(agent, cancelled)
    await eventually(lambda: "call_slow" in agent.runtime.control.of(cancelled).tool_tasks)
    assert (await agent.stub.Cancel(pb.CancelRequest(session_id=cancelled))).success
    with pytest.raises(grpc.aio.AioRpcError):
        await running_generation
    summary = await observability.cost_summary(cancelled, None, None, None)
    assert summary.call_count == 1
    assert summary.total_tokens == agent.runtime.sessions.get(cancelled).usage.total_tokens > 0


# --- queue statistics ------------------------------------------------------------------------


async def test_queue_stats_while_generations_run_and_after(agent: LiveServer, fake: FakeLLM) -> None:
    observability = app_of(agent).observability
    fake.script(tool_call("bash", {"command": "sleep 60"}, id="call_slow"), text("second"))
    session_id = await new_session(agent)
    assert await observability.queue_stats(session_id) == QueueStats(
        LaneStats(), LaneStats(), LaneStats(), LaneStats()
    )
    first = generate(agent, session_id)
    running = await eventually(
        stats_when(observability, session_id, lambda s: s.execute.active == 1),
        "the bash call holding the execute lane",
    )
    assert running.generate == LaneStats(active=1)
    second = generate(agent, session_id, "again")  # waits for the session's generation lock
    waiting = await eventually(
        stats_when(observability, session_id, lambda s: s.generate.pending == 1),
        "the second generation waiting",
    )
    assert waiting.generate == LaneStats(pending=1, active=1) and waiting.dead_letters == 0
    assert (await agent.stub.Cancel(pb.CancelRequest(session_id=session_id))).success
    with pytest.raises(grpc.aio.AioRpcError):
        await first
    assert (await second).message.content == "second"
    after = await observability.queue_stats(session_id)
    assert after.generate == LaneStats(completed=1, failed=1)
    assert after.execute == LaneStats(failed=1)  # the cancelled bash call
    assert after.control == LaneStats(completed=1)  # the Cancel
    assert after.query == LaneStats()


async def test_queue_stats_count_external_tasks_and_tool_outcomes(agent: LiveServer, fake: FakeLLM) -> None:
    observability = app_of(agent).observability
    fake.script(
        tool_calls([("read_file", {"path": "missing.txt"}), ("bash", {"command": "make deploy"})]),
        text("deployed"),
    )
    session_id = await new_session(agent)
    config = pb.LaneHandlerConfig(mode=pb.TASK_HANDLER_MODE_EXTERNAL, timeout_ms=5000)
    await agent.stub.SetLaneHandler(
        pb.SetLaneHandlerRequest(session_id=session_id, lane=pb.SESSION_LANE_EXECUTE, config=config)
    )
    running_generation = generate(agent, session_id)
    waiting = await eventually(
        stats_when(observability, session_id, lambda s: s.execute.external == 1),
        "the bash call handed to the host",
    )
    assert waiting.execute == LaneStats(external=1)
    assert waiting.query == LaneStats(failed=1)  # read_file of a missing file
    (task,) = (await agent.stub.ListPendingExternalTasks(
        pb.ListPendingExternalTasksRequest(session_id=session_id)
    )).tasks  # fmt: skip
    await agent.stub.CompleteExternalTask(
        pb.CompleteExternalTaskRequest(session_id=session_id, task_id=task.task_id, success=True, result="ok")
    )
    await running_generation
    after = await observability.queue_stats(session_id)
    assert after.execute == LaneStats(completed=1)
    assert after.control == LaneStats(completed=1)
    assert after.generate == LaneStats(completed=1)
    with pytest.raises(NotFound):
        await observability.queue_stats("ghost")


def stats_when(
    observability: Observability, session_id: str, condition: Callable[[QueueStats], bool]
) -> Callable[[], Awaitable[QueueStats | None]]:
    """For `eventually`: the session's queue stats once they meet `condition`."""

    async def check() -> QueueStats | None:
        stats = await observability.queue_stats(session_id)
        return stats if condition(stats) else None

    return check


# --- durability, paging ----------------------------------------------------------------------


async def test_metrics_and_costs_survive_a_restart_lanes_start_over(
    workspace: Path, tmp_path: Path, fake: FakeLLM, prices_file: Path
) -> None:
    settings = replace(agent_settings(workspace, tmp_path / "data"), model_prices=load_prices(prices_file))
    async with running(settings) as first:
        await initialize(first, fake)
        session_id = await tool_run(first, fake)
        observability = app_of(first).observability
        metrics = await observability.tool_metrics(None, None)
        cost = await observability.cost_summary(None, None, None, None)
        lanes = await observability.queue_stats(session_id)
    assert metrics.total_calls == 2 and cost.call_count == 2 and lanes.generate.completed == 1
    async with running(settings) as second:
        observability = app_of(second).observability
        assert await observability.tool_metrics(None, None) == metrics
        assert await observability.tool_metrics(session_id, None) == metrics
        assert await observability.cost_summary(None, None, None, None) == cost
        assert await observability.queue_stats(session_id) == QueueStats(
            LaneStats(), LaneStats(), LaneStats(), LaneStats()
        )


async def test_the_log_is_read_a_page_at_a_time(
    agent: LiveServer, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = await tool_run(agent, fake)
    observability = app_of(agent).observability
    metrics = [await observability.tool_metrics(s, None) for s in (session_id, None)]
    costs = [await observability.cost_summary(s, None, None, None) for s in (session_id, None)]
    reads: list[int] = []
    store = agent.runtime.store
    read_log, read_since = store.read_log, store.read_log_since

    async def counted_log(session: str, after: int, limit: int) -> list[LogEntry]:
        reads.append(limit)
        return await read_log(session, after, limit)

    async def counted_since(after: int, limit: int) -> list[LogEntry]:
        reads.append(limit)
        return await read_since(after, limit)

    monkeypatch.setattr(observability_module, "PAGE", 3)
    monkeypatch.setattr(store, "read_log", counted_log)
    monkeypatch.setattr(store, "read_log_since", counted_since)
    assert [await observability.tool_metrics(s, None) for s in (session_id, None)] == metrics
    assert [await observability.cost_summary(s, None, None, None) for s in (session_id, None)] == costs
    assert len(reads) > 8 and set(reads) == {3}


# --- the price file --------------------------------------------------------------------------


def test_the_price_file_is_read_from_the_flag_or_the_environment(prices_file: Path) -> None:
    expected = {"fake-model": ModelPrice(3.0, 15.0)}
    assert settings_from(model_prices=str(prices_file), env={}).model_prices == expected
    assert settings_from(env={"A3S_MODEL_PRICES": str(prices_file)}).model_prices == expected
    assert settings_from(env={}).model_prices == {}
    assert ModelPrice(3.0, 15.0).cost(1_000_000, 2_000_000) == pytest.approx(33.0)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"m": 3}', "exactly input_per_mtok and output_per_mtok"),
        ('{"m": {"input_per_mtok": 1}}', "exactly input_per_mtok and output_per_mtok"),
        ('{"m": {"input_per_mtok": 1, "output_per_mtok": 2, "cache": 1}}', "exactly"),
        ('{"m": {"input_per_mtok": "1", "output_per_mtok": 2}}', "input_per_mtok must be a number"),
        ('{"m": {"input_per_mtok": true, "output_per_mtok": 2}}', "input_per_mtok must be a number"),
        ('{"m": {"input_per_mtok": 1, "output_per_mtok": -2}}', "output_per_mtok must be a finite number"),
        ('{"m": {"input_per_mtok": NaN, "output_per_mtok": 2}}', "finite"),
        ('{"m": {"input_per_mtok": 1e999, "output_per_mtok": 2}}', "finite"),
    ],
)
def test_a_bad_price_file_is_a_start_up_error_naming_it(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=problem) as err:
        settings_from(model_prices=str(path), env={})
    assert str(err.value).startswith("--model-prices: ") and str(path) in str(err.value)
    with pytest.raises(ConfigError, match=r"^A3S_MODEL_PRICES: "):
        settings_from(env={"A3S_MODEL_PRICES": str(path)})


def test_a_missing_oversized_or_binary_price_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*missing\.json"):
        settings_from(model_prices=str(tmp_path / "missing.json"), env={})
    with pytest.raises(ConfigError, match="cannot read"):
        settings_from(model_prices=str(tmp_path), env={})  # a directory
    huge = tmp_path / "huge.json"
    huge.write_text(
        '{"m": {"input_per_mtok": 1, "output_per_mtok": 2}, "pad": "' + "x" * MAX_FILE_BYTES + '"}'
    )
    with pytest.raises(ConfigError, match="larger than"):
        settings_from(model_prices=str(huge), env={})
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match="not UTF-8"):
        settings_from(model_prices=str(binary), env={})


def test_serve_stops_at_start_on_a_bad_price_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text('{"gpt": {"input_per_mtok": "cheap", "output_per_mtok": 1}}')
    done = subprocess.run(
        [sys.executable, "-m", "a3s_agent", "serve", "--listen", "127.0.0.1:0", "--http-listen", "off",
         "--workspace", str(tmp_path), "--data-dir", str(tmp_path / "data"), "--model-prices", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--model-prices: {path}: model 'gpt': input_per_mtok must be a number" in done.stderr
    assert "Traceback" not in done.stderr
