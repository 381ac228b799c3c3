"""`cron`: what a scheduled job's firing costs beyond its command, against the same command run
through the bash tool (ExecuteTool) by the same server."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .common import agent_process
from .report import Row

COMMAND = "echo fired"
_WARM_UP = 5


async def bench_cron(seconds: float, workspace: Path) -> list[Row]:
    """RunCronJob of a shell job (its firing recorded, leased and closed in the SQLite store, the
    command run through the bash tool in the job's session) against ExecuteTool of bash with the
    same command, on one `serve --enable-cron`; calls alternate, medians of each."""
    calls = max(20, int(seconds * 20))
    times: dict[str, list[float]] = {"bash": [], "cron": []}
    with agent_process(workspace, extra=("--enable-cron",)) as agent:
        agent.wait_healthy()
        with grpc.insecure_channel(agent.address) as channel:
            stub, cron = pb_grpc.CodeAgentServiceStub(channel), later_grpc.CodeAgentServiceStub(channel)
            job = cron.CreateCronJob(
                later.CreateCronJobRequest(name="bench", schedule="@yearly", command=COMMAND), timeout=30
            ).job
            bash = pb.ExecuteToolRequest(tool_name="bash", arguments=json.dumps({"command": COMMAND}))
            fire = later.RunCronJobRequest(id=job.id)

            def through_bash() -> None:
                result = stub.ExecuteTool(bash, timeout=60).result
                assert result.success and result.output.strip() == "fired", result

            def fired() -> None:
                reply = cron.RunCronJob(fire, timeout=60)
                assert reply.success and reply.execution.stdout.strip() == "fired", reply

            runs: dict[str, Callable[[], None]] = {"bash": through_bash, "cron": fired}
            for index in range(calls + _WARM_UP):
                for name in sorted(runs, reverse=index % 2 == 1):  # the order alternates
                    started = time.perf_counter()
                    runs[name]()
                    if index >= _WARM_UP:
                        times[name].append(time.perf_counter() - started)
    bash_ms, cron_ms = (statistics.median(times[name]) * 1000 for name in ("bash", "cron"))
    return [
        Row(f"ExecuteTool(bash {COMMAND!r}) median (ms)", f"{bash_ms:.2f}"),
        Row("RunCronJob of a shell job with that command, median (ms)", f"{cron_ms:.2f}"),
        Row("cron firing overhead (ms)", f"{cron_ms - bash_ms:.2f}", "report"),
        Row("cron firing ratio (RunCronJob / ExecuteTool bash)", f"{cron_ms / bash_ms:.2f}", "<= 1.5"),
    ]
