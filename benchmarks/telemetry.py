"""The `telemetry` section: what OpenTelemetry costs the server. The server's own CPU per six-turn
task with telemetry off, on the code before telemetry (TELEMETRY_BASELINE), and with traces
exported over OTLP/HTTP to a receiver in the benchmark's process (which decodes what it gets, to
count the spans): servers side by side, batches alternating, medians. Spans are exported in the
SDK's batches (every 5 s by default), so some of a batch's export falls in the next; over the
batches it evens out."""

from __future__ import annotations

import contextlib
import http.server
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .common import checkout_of, run_task, task_server, warmed_up
from .cpu import cpu_ns, spread
from .report import Row, Skipped

TELEMETRY_BASELINE = "5ba062d"
"""The commit before OpenTelemetry: its server runs beside today's with telemetry off."""
BATCH = 10
"""Tasks per batch: the CPU of ten tasks is well above schedstat's resolution."""


class _Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP receiver on 127.0.0.1, in threads of its own (the benchmark's event loop blocks
    while a server stops, and a stopping server exports its last spans): counts the spans it is
    sent; other signals (metrics) are answered, not read."""

    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                reply = b""
                if self.path == "/v1/traces":
                    decoded = ExportTraceServiceRequest.FromString(body)
                    with receiver.lock:
                        receiver.spans += sum(
                            len(s.spans) for r in decoded.resource_spans for s in r.scope_spans
                        )
                    reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.port = self.server_address[1]


async def bench_telemetry(seconds: float, workspace: Path) -> list[Row]:
    if sys.platform != "linux":
        raise Skipped("it reads Linux's /proc/<pid>/task/*/schedstat")
    with _Receiver() as receiver:
        thread = threading.Thread(target=receiver.serve_forever, daemon=True)
        thread.start()
        try:
            return await _measure(seconds, workspace, receiver)
        finally:
            receiver.shutdown()


async def _measure(seconds: float, workspace: Path, receiver: _Receiver) -> list[Row]:
    endpoint = f"http://127.0.0.1:{receiver.port}"
    modes: dict[str, tuple[dict[str, str], bool]] = {  # name: (environment, baseline's code)
        "off": ({}, False),
        TELEMETRY_BASELINE: ({}, True),
        "traces": ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{endpoint}/v1/traces"}, False),
        "traces and metrics": ({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, False),  # both, as the SDK reads it
    }
    batches = max(6, int(seconds * 4))
    per_task: dict[str, list[float]] = {name: [] for name in modes}
    async with contextlib.AsyncExitStack() as stack:
        old = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        source = checkout_of(TELEMETRY_BASELINE, old)
        stubs = []
        for index, (name, (env, baseline)) in enumerate(modes.items()):
            fake, agent = task_server(
                stack,
                workspace,
                f"mode{index}",
                batches * BATCH + 1,
                source=source if baseline else None,
                env=env,
            )
            stub = await warmed_up(stack, fake, agent, f"the server with telemetry {name}")
            stubs.append((name, stub, agent.proc.pid))
        for round_ in range(batches):
            for name, stub, pid in stubs if round_ % 2 == 0 else stubs[::-1]:
                before = cpu_ns(pid)
                for _ in range(BATCH):
                    await run_task(stub)
                per_task[name].append((cpu_ns(pid) - before) / BATCH / 1e6)
    # The servers stopped gracefully, exporting their last spans; the warm-up tasks count.
    tasks_traced = (batches * BATCH + 1) * (len(modes) - 2)
    off, base = statistics.median(per_task["off"]), statistics.median(per_task[TELEMETRY_BASELINE])
    rows = [
        Row(f"server CPU per six-turn task, telemetry off, median of {batches} batches (ms)", f"{off:.1f}"),
        Row(f"server CPU per six-turn task on {TELEMETRY_BASELINE}, before telemetry (ms)", f"{base:.1f}"),
        Row(
            "lowest / highest batch, off and before (ms)",
            f"{spread(per_task['off'])}, {spread(per_task[TELEMETRY_BASELINE])}",
        ),
        Row(
            f"server CPU per task, telemetry off / {TELEMETRY_BASELINE}", f"{off / base:.2f}x", "within noise"
        ),
    ]
    for name in list(modes)[2:]:
        on = statistics.median(per_task[name])
        rows.append(Row(f"server CPU per six-turn task, {name} exported (ms)", f"{on:.1f}"))
        rows.append(Row(f"server CPU per task, {name} / off", f"{on / off:.2f}x", "<= 1.1x"))
    rows.append(Row("spans received per traced task", f"{receiver.spans / tasks_traced:.1f}"))
    return rows
