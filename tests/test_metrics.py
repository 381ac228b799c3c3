"""Metrics (base/metrics.py, docs/operations/telemetry.md#metrics): a real `a3s-agent serve` with
`--prometheus-metrics` scraped over HTTP and read with prometheus_client's own text parser, the
six-turn task moving its counters; the same metrics pushed over OTLP/HTTP to the receiver of
tests/test_telemetry.py; /metrics behind the token; off, no route and no SDK."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from acp import text_block
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from a3s_agent.base import metrics
from a3s_agent.faces.acp.content import PromptBlock
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, tool_call

from . import test_telemetry
from .conftest import ServerProcess, eventually, run_fresh_server, user
from .security.sandboxes import MECHANISMS
from .test_acp import Editor, acp_agent
from .test_telemetry import (
    SECRET_PROMPT,
    TOOL_NAMES,
    Receiver,
    attributes,
    generate,
    otel_env,
    script_task,
    task_workspace,
    traceparent,
)

# The fixtures of tests/test_telemetry.py: an OTLP receiver, servers against the fake model.
receiver = test_telemetry.receiver
served = test_telemetry.served

TOKEN = "tok-metrics-test"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GRPC_AUTH = [("authorization", f"Bearer {TOKEN}")]
PRICES = {"fake-model": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}
DASHBOARD = Path(__file__).parent.parent / "docs" / "operations" / "grafana-dashboard.json"


def prometheus_env(tmp_path: Path) -> dict[str, str]:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    return {"A3S_PROMETHEUS_METRICS": "1", "A3S_AUTH_TOKEN": TOKEN, "A3S_MODEL_PRICES": str(prices)}


async def scrape(server: ServerProcess, headers: dict[str, str] = AUTH) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(f"http://127.0.0.1:{server.http_port}") as http,
        http.get("/metrics", headers=headers) as reply,
    ):
        return reply.status, await reply.text()


async def scrape_until(
    server: ServerProcess, ready: Callable[[list[Sample]], bool], what: str
) -> list[Sample]:
    """The samples of a scrape once `ready` says they show `what` (a run's end is recorded after
    its client got the last chunk)."""

    async def scraped() -> list[Sample] | None:
        status, text = await scrape(server)
        found = samples(text) if status == 200 else []
        return found if ready(found) else None

    return await eventually(scraped, what)


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(found: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels` (0 with none)."""
    return sum(s.value for s in found if s.name == name and labels.items() <= s.labels.items())


async def http_task(server: ServerProcess) -> str:
    """The six-turn task over the REST face, with the token; the session's id."""
    async with aiohttp.ClientSession(f"http://127.0.0.1:{server.http_port}", headers=AUTH) as http:
        async with http.post("/sessions", json={}) as reply:
            assert reply.status == 201
            session_id: str = (await reply.json())["session_id"]
        body = {"messages": [{"role": "ROLE_USER", "content": SECRET_PROMPT}]}
        async with http.post(f"/sessions/{session_id}/generate", json=body) as reply:
            assert reply.status == 200, await reply.text()
    return session_id


async def test_prometheus_metrics_count_a_task(tmp_path: Path, served: Any, fake: FakeLLM) -> None:
    server = await served(prometheus_env(tmp_path))
    status, before = await scrape(server)
    assert status == 200
    assert value(samples(before), "gen_ai_client_token_usage_count") == 0
    script_task(fake)
    await http_task(server)
    found = await scrape_until(server, lambda f: value(f, "a3s_generations_total") == 1, "the end")
    usages = fake.usages[-6:]
    model = {"gen_ai_request_model": "fake-model", "gen_ai_provider_name": "openai"}
    # The GenAI conventions' client metrics: one token record of each type per model request.
    for kind, field in (("input", "prompt_tokens"), ("output", "completion_tokens")):
        assert value(found, "gen_ai_client_token_usage_count", gen_ai_token_type=kind, **model) == 6
        assert value(found, "gen_ai_client_token_usage_sum", gen_ai_token_type=kind, **model) == sum(
            u[field] for u in usages
        )
    duration = "gen_ai_client_operation_duration_seconds_count"
    assert value(found, duration, gen_ai_operation_name="chat", **model) == 6
    assert value(found, duration, gen_ai_operation_name="invoke_agent", **model) == 1
    # Cost at the operator's prices, per model.
    spent = sum(u["prompt_tokens"] * 3.0 + u["completion_tokens"] * 15.0 for u in usages) / 1e6
    assert value(found, "a3s_gen_ai_client_cost_usd_total", **model) == pytest.approx(spent)
    # The server's own: each tool call by tool and outcome, the generation by finish reason.
    for name in TOOL_NAMES:
        got = value(
            found, "a3s_tool_duration_seconds_count", gen_ai_tool_name=name, a3s_tool_outcome="success"
        )
        assert got == 1, name
    assert value(found, "a3s_generations_total", gen_ai_response_finish_reason="stop") == 1
    assert value(found, "a3s_store_commit_duration_seconds_count") > 0
    assert value(found, "a3s_sessions_active") == 1
    assert value(found, "a3s_runs_active") == 0  # the run is over
    assert {s.labels["a3s_lane"] for s in found if s.name == "a3s_lane_queue_depth"} == {
        "control", "query", "execute", "generate"
    }  # fmt: skip
    assert all("swordfish" not in str(s.labels) for s in found)  # no content in labels


async def test_gauges_show_a_call_waiting_for_its_confirmation(
    tmp_path: Path, served: Any, fake: FakeLLM
) -> None:
    server = await served(prometheus_env(tmp_path))
    fake.script(tool_call("write_file", {"path": "c.txt", "content": "x"}, id="w1"), "ok", "second")
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        session_id = (await stub.CreateSession(pb.CreateSessionRequest(), metadata=GRPC_AUTH)).session_id
        policy = pb.ConfirmationPolicy(
            enabled=True, require_confirm_tools=["write_file"], default_timeout_ms=60_000
        )
        ask = pb.SetConfirmationPolicyRequest(session_id=session_id, policy=policy)
        await stub.SetConfirmationPolicy(ask, metadata=GRPC_AUTH)
        go = pb.GenerateRequest(session_id=session_id, messages=[user("write")])
        stream = stub.StreamGenerate(go, metadata=GRPC_AUTH)
        async for chunk in stream:
            if chunk.metadata.get("type") == "confirmation_required":
                break
        waiting = samples((await scrape(server))[1])
        assert value(waiting, "a3s_confirmations_waiting") == 1
        assert value(waiting, "a3s_runs_active") == 1
        assert value(waiting, "a3s_sessions_active") == 1
        assert value(waiting, "a3s_replica_leases") == 1  # the run's
        assert value(waiting, "a3s_lane_queue_depth") == 0  # it holds its lane: nothing waits for one
        # A second generation of the session waits for the first's generate lane.
        second = stub.StreamGenerate(go, metadata=GRPC_AUTH)
        queued = await scrape_until(
            server, lambda f: value(f, "a3s_lane_queue_depth", a3s_lane="generate") == 1, "the queued one"
        )
        assert value(queued, "a3s_lane_queue_depth", a3s_lane="execute") == 0
        answer = pb.ConfirmToolExecutionRequest(session_id=session_id, tool_id="w1", approved=False)
        await stub.ConfirmToolExecution(answer, metadata=GRPC_AUTH)
        [c async for c in stream]
        [c async for c in second]
    after = await scrape_until(server, lambda f: value(f, "a3s_runs_active") == 0, "the run's end")
    assert value(after, "a3s_confirmations_waiting") == 0 and value(after, "a3s_runs_active") == 0
    assert value(after, "a3s_replica_leases") == 0
    rejected = value(
        after, "a3s_tool_duration_seconds_count", gen_ai_tool_name="write_file", a3s_tool_outcome="error"
    )
    assert rejected == 1


async def test_a_compaction_is_counted_by_its_trigger(tmp_path: Path, served: Any, fake: FakeLLM) -> None:
    server = await served(prometheus_env(tmp_path))
    fake.fallback = "Goal: the parser. Done so far: nothing."  # each summary, and the answer
    words = [" ".join(f"m{i}w{n}" for n in range(600)) for i in range(40)]
    roles = [pb.Message.ROLE_ASSISTANT if i % 2 else pb.Message.ROLE_USER for i in range(40)]
    history = [pb.Message(role=role, content=text) for role, text in zip(roles, words, strict=True)]
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        config = pb.SessionConfig(auto_compact=True, max_context_length=32_000)
        create = pb.CreateSessionRequest(config=config, initial_context=history)
        created = await stub.CreateSession(create, metadata=GRPC_AUTH)
        go = pb.GenerateRequest(session_id=created.session_id, messages=[user("go on")])
        [c async for c in stub.StreamGenerate(go, metadata=GRPC_AUTH)]
    found = samples((await scrape(server))[1])
    assert value(found, "a3s_compactions_total", a3s_compaction_trigger="threshold") == 1
    assert value(found, "a3s_compactions_total", a3s_compaction_trigger="overflow") == 0


class Sandboxed(ServerProcess):
    """The server with `--sandbox <mechanism>`."""

    mechanism = ""

    def command(self) -> list[str]:
        return [*super().command(), "--sandbox", self.mechanism]


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_a_write_the_sandbox_refuses_is_a_denial(tmp_path: Path, fake: FakeLLM, mechanism: str) -> None:
    probe = Path("/usr/a3s-metrics-probe")  # outside the workspace: only the sandbox stops it
    fake.script(tool_call("bash", {"command": f"touch {probe}"}, id="b1"), "understood")
    llm = {"A3S_LLM_MODEL": "fake-model", "A3S_LLM_BASE_URL": fake.base_url, "A3S_LLM_API_KEY": "sk-test"}
    server = Sandboxed(
        task_workspace(tmp_path / "workspace"), tmp_path / "data", {**llm, **prometheus_env(tmp_path)}
    )
    server.mechanism = mechanism
    await asyncio.to_thread(server.start)
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.CodeAgentServiceStub(channel)
            session_id = (await stub.CreateSession(pb.CreateSessionRequest(), metadata=GRPC_AUTH)).session_id
            go = pb.GenerateRequest(session_id=session_id, messages=[user("touch it")])
            [c async for c in stub.StreamGenerate(go, metadata=GRPC_AUTH)]
        found = samples((await scrape(server))[1])
    finally:
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(probe.unlink, missing_ok=True)
    assert value(found, "a3s_sandbox_denials_total", a3s_tool_sandbox=mechanism) == 1
    assert (
        value(found, "a3s_tool_duration_seconds_count", gen_ai_tool_name="bash", a3s_tool_outcome="error")
        == 1
    )


async def test_a_tool_the_model_made_up_is_one_label(tmp_path: Path, served: Any, fake: FakeLLM) -> None:
    server = await served(prometheus_env(tmp_path))
    fake.script(*(tool_call(f"made_up_{n}", {}, id=f"c{n}") for n in range(3)), "Done.")
    await http_task(server)
    status, text = await scrape(server)
    assert status == 200 and "made_up" not in text
    assert value(samples(text), "a3s_tool_duration_seconds_count", gen_ai_tool_name="_OTHER") == 3


async def test_metrics_need_the_token(tmp_path: Path, served: Any) -> None:
    server = await served(prometheus_env(tmp_path))
    assert (await scrape(server, {}))[0] == 401
    status, text = await scrape(server, {"Authorization": "Bearer not-the-token"})
    assert status == 401 and "gen_ai" not in text
    # A page of another name rebound to this address is refused, the token notwithstanding.
    status, text = await scrape(server, {**AUTH, "Host": "rebound.example"})
    assert status == 421 and "gen_ai" not in text
    assert (await scrape(server))[0] == 200


@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
async def test_the_metrics_route_is_there_only_when_enabled(served: Any, enabled: bool) -> None:
    server = await served({"A3S_AUTH_TOKEN": TOKEN, "A3S_PROMETHEUS_METRICS": "1" if enabled else "0"})
    assert (await scrape(server))[0] == (200 if enabled else 404)


def input_tokens(receiver: Receiver, expected: int) -> Metric | None:
    """The latest export's gen_ai.client.token.usage, once its input tokens are `expected`
    (cumulative: the whole task)."""
    for export in reversed(receiver.metrics):
        for resource in export.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == "gen_ai.client.token.usage":
                        inputs = [
                            p for p in metric.histogram.data_points if attributes(p)["gen_ai.token.type"] == "input"
                        ]  # fmt: skip
                        return metric if inputs and inputs[0].sum == expected else None
    return None


async def test_metrics_are_pushed_over_otlp(receiver: Receiver, served: Any, fake: FakeLLM) -> None:
    server = await served({**otel_env(receiver), "OTEL_METRIC_EXPORT_INTERVAL": "100"})
    script_task(fake)
    header, _, _ = traceparent()
    await generate(server, "go", [("traceparent", header)])
    usages = fake.usages[-6:]
    expected = sum(u["prompt_tokens"] for u in usages)

    def tokens_in() -> Metric | None:
        return input_tokens(receiver, expected)

    metric = await eventually(tokens_in, "the task's token usage over OTLP")
    assert metric.unit == "{token}"
    (point,) = [p for p in metric.histogram.data_points if attributes(p)["gen_ai.token.type"] == "input"]
    assert point.count == 6
    assert attributes(point)["gen_ai.request.model"] == "fake-model"
    assert list(point.explicit_bounds)[:3] == [1, 4, 16]  # the conventions' advised buckets
    wanted = {"gen_ai.client.operation.duration", "a3s.tool.duration", "a3s.generations"}

    def all_in() -> bool:  # the generation's end is recorded after the client's last chunk
        sent = receiver.metrics
        return wanted <= {
            m.name for e in sent for r in e.resource_metrics for s in r.scope_metrics for m in s.metrics
        }

    await eventually(all_in, "the generation's and the tool calls' metrics")
    resource = attributes(receiver.metrics[-1].resource_metrics[0].resource)
    assert resource["service.name"] == "agent-under-test"


async def test_otel_metrics_exporter_none_sends_traces_alone(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    server = await served({**otel_env(receiver), "OTEL_METRICS_EXPORTER": "none"})
    fake.script(tool_call("read_file", {"path": "task.py"}, id="r1"), "It greets.")
    header, trace_id, _ = traceparent()
    await generate(server, "what does it do?", [("traceparent", header)])
    assert await asyncio.to_thread(server.stop) == 0  # an exporter, were there one, pushes at the stop
    assert receiver.trace(trace_id) and receiver.metrics == []


async def test_a_metrics_endpoint_alone_sends_metrics_alone(
    receiver: Receiver, served: Any, fake: FakeLLM
) -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{receiver.port}/v1/metrics"}
    server = await served(endpoint)
    fake.script(tool_call("read_file", {"path": "task.py"}, id="r1"), "It greets.")
    await generate(server, "what does it do?", [])
    assert await asyncio.to_thread(server.stop) == 0
    assert input_tokens(receiver, sum(u["prompt_tokens"] for u in fake.usages[-2:])) is not None
    assert receiver.spans == []


async def test_an_acp_agent_pushes_its_metrics_over_otlp(
    receiver: Receiver, tmp_path: Path, fake: FakeLLM
) -> None:
    workspace = task_workspace(tmp_path / "editor")
    fake.script(tool_call("read_file", {"path": "task.py"}, id="r1"), "It greets.")
    env = {**otel_env(receiver), "A3S_SANDBOX": "off"}  # pushed every 60 s, and at the stop
    async with acp_agent(Editor(), workspace, fake, tmp_path / "data", env=env) as conn:
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        prompt: list[PromptBlock] = [text_block("what does it do?")]
        assert (await conn.prompt(session_id=session.session_id, prompt=prompt)).stop_reason == "end_turn"
    expected = sum(u["prompt_tokens"] for u in fake.usages[-2:])
    metric = await eventually(lambda: input_tokens(receiver, expected), "the agent's metrics at its stop")
    (point,) = [p for p in metric.histogram.data_points if attributes(p)["gen_ai.token.type"] == "input"]
    assert point.count == 2


def test_metrics_without_the_http_listener_refuse_to_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "a3s_agent", "serve", "--prometheus-metrics", "--http-listen", "off"]
    command += ["--workspace", str(tmp_path), "--data-dir", str(tmp_path / "data")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--prometheus-metrics (A3S_PROMETHEUS_METRICS) serves /metrics on the HTTP listener" in done.stderr


_MODULES_CHILD = """
import json, os, signal, sys

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc


async def main() -> None:
    settings = Settings(
        listen="127.0.0.1:{port}", http_listen="127.0.0.1:{http_port}",
        workspace=Path({workspace!r}), data_dir=Path({data!r}), prometheus_metrics={prometheus},
    )
    serving = asyncio.create_task(server.run(settings))
    async with grpc.aio.insecure_channel("127.0.0.1:{port}") as channel:
        await until_serving(pb_grpc.CodeAgentServiceStub(channel))
        loaded = [m for m in ("opentelemetry.sdk", "prometheus_client") if m in sys.modules]
    os.kill(os.getpid(), signal.SIGTERM)
    code = await serving
    print(json.dumps({{"loaded": loaded, "code": code}}))


asyncio.run(main())
"""


@pytest.mark.parametrize("prometheus", [False, True], ids=["off", "on"])
def test_off_no_metrics_sdk_is_loaded(tmp_path: Path, prometheus: bool) -> None:
    # "on" shows what the check would see if off were not off.
    report, _ = run_fresh_server(_MODULES_CHILD, tmp_path, {}, 120, prometheus=prometheus)
    assert report["code"] == 0
    assert report["loaded"] == (["opentelemetry.sdk", "prometheus_client"] if prometheus else [])


def dashboard_metrics() -> set[str]:
    """The metric names the dashboard's queries read (the Prometheus names, suffixes and all):
    what is left of each expression without its label matchers and `by (...)` lists."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert exprs
    bare = [re.sub(r"\{[^}]*\}|\bby \([^)]*\)", "", expr) for expr in exprs]
    return {name for expr in bare for name in re.findall(r"\b(?:gen_ai|a3s)_[a-z_]+\b", expr)}


def declared_metrics() -> set[str]:
    """The Prometheus names of every instrument the server declares, one value recorded of each
    (a counter the task does not move, e.g. compactions, is not in a scrape until it moves)."""
    assert metrics.configure("test", prometheus=True, prices={})
    try:
        for instrument in metrics.INSTRUMENTS:
            if instrument.kind == "counter":
                metrics.add(instrument, 1, {})
            else:
                metrics.record(instrument, 1, {})
        return {s.name for s in samples((metrics.prometheus_text() or b"").decode())}
    finally:
        metrics.shutdown()


async def test_the_dashboard_reads_only_metrics_the_server_exports(
    tmp_path: Path, served: Any, fake: FakeLLM
) -> None:
    server = await served(prometheus_env(tmp_path))
    script_task(fake)
    await http_task(server)
    _, text = await scrape(server)  # the gauges, which only a running server has
    exported = {s.name for s in samples(text)} | declared_metrics()
    read = dashboard_metrics()
    assert "a3s_lane_queue_depth" in read and "gen_ai_client_token_usage_sum" in read
    assert read <= exported, read - exported
