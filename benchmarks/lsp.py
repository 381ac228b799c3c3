"""`lsp`: a language server (basedpyright) through the agent against the tools' own work: LspHover
against ExecuteTool(read_file) of the same file on one server, and edit_file on a server with
basedpyright running for its workspace (the result waits for the file's errors) against edit_file
on a server running none; rounds alternating, medians."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.tools.process import find_binary

from .common import agent_process, read_file_call
from .report import Row, Skipped

_CALLS = 10
"""Calls of each kind per round."""
_MODULE = """\
def scale(value: int) -> int:
    return value * 2


def describe(value: int) -> str:
    return f"{value} scaled is {scale(value)}"
"""
_MAIN = "from mod import describe, scale\n\nprint(describe(scale(3)))\n"


async def bench_lsp(seconds: float, workspace: Path) -> list[Row]:
    if find_binary("basedpyright-langserver") is None:
        raise Skipped("basedpyright is not installed (pip install basedpyright)")
    served, plain = workspace / "served", workspace / "plain"
    for place in (served, plain):
        place.mkdir()
        (place / "mod.py").write_text(_MODULE)
        (place / "main.py").write_text(_MAIN)
    rounds = max(3, int(seconds))
    with agent_process(served) as with_server, agent_process(plain) as without:
        with_server.wait_healthy()
        without.wait_healthy()
        async with (
            grpc.aio.insecure_channel(with_server.address) as channel,
            grpc.aio.insecure_channel(without.address) as plain_channel,
        ):
            stub, plain_stub = (
                pb_grpc.CodeAgentServiceStub(channel),
                pb_grpc.CodeAgentServiceStub(plain_channel),
            )
            lsp = later_grpc.CodeAgentServiceStub(channel)
            await lsp.StartLspServer(later.StartLspServerRequest(language="python"), timeout=120)
            hover = later.LspHoverRequest(file_path="main.py", line=2, column=16)  # `scale`

            async def hover_call() -> None:
                reply = await lsp.LspHover(hover, timeout=60)
                assert reply.found, reply

            read = read_file_call("main.py")
            hover_s, read_s = await _alternating(hover_call, lambda: read(stub), rounds)
            edit_s, plain_edit_s = await _alternating(
                _toggling_edit(stub, diagnosed=True), _toggling_edit(plain_stub, diagnosed=False), rounds
            )
    return [
        Row("LspHover median (ms)", f"{hover_s * 1000:.2f}"),
        Row("ExecuteTool(read_file) of the same file median (ms)", f"{read_s * 1000:.2f}"),
        Row("hover ratio (LspHover / read_file)", f"{hover_s / read_s:.2f}", "<= 5"),
        Row("edit_file with its errors from basedpyright median (ms)", f"{edit_s * 1000:.2f}"),
        Row("edit_file alone median (ms)", f"{plain_edit_s * 1000:.2f}"),
        Row("diagnostics-after-edit ratio (with / alone)", f"{edit_s / plain_edit_s:.2f}", "report"),
    ]


async def _alternating(
    first: Callable[[], Awaitable[object]], second: Callable[[], Awaitable[object]], rounds: int
) -> tuple[float, float]:
    """Median seconds per call of each, in rounds of _CALLS calls alternating which goes first,
    after a warm-up call of each."""
    await first()
    await second()
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(rounds):
        order = [(0, first), (1, second)] if index % 2 == 0 else [(1, second), (0, first)]
        for side, call in order:
            for _ in range(_CALLS):
                started = time.perf_counter()
                await call()
                times[side].append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def _toggling_edit(stub: pb_grpc.CodeAgentServiceStub, diagnosed: bool) -> Callable[[], Awaitable[None]]:
    """An edit_file of mod.py that changes its content each call (`* 2` and `* 3` in turn);
    `diagnosed`: the result must carry the file's errors from the language server."""
    factors = ["2", "3"]

    async def call() -> None:
        old, new = factors
        factors.reverse()
        arguments = {"path": "mod.py", "old_string": f"value * {old}", "new_string": f"value * {new}"}
        request = pb.ExecuteToolRequest(tool_name="edit_file", arguments=json.dumps(arguments))
        result = (await stub.ExecuteTool(request, timeout=60)).result
        assert result.success, result.error
        assert ("lsp_errors" in result.metadata) == diagnosed, result

    return call
