"""The warm-up a serving server runs once it is ready (runtime/warmup.py): it does not delay
readiness, it builds the tool schemas and, once the server is quiet, loads the provider modules and
the tokenizer; a stop during it is clean, a failure in it is not fatal. Each case runs `a3s-agent
serve`'s own `run` in a fresh process (pytest's has loaded the tokenizer already), with the warm-up
held on an event until the case lets it go."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from a3s_agent.llm import tokens
from a3s_agent.runtime import warmup

from .conftest import run_fresh_server

_CHILD = """
import json, os, signal, sys, threading

import aiohttp

from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.runtime import warmup

CASE = {case!r}
PROVIDER = "a3s_agent.llm.openai_compat"
entered, gate, prepared, finished = threading.Event(), threading.Event(), threading.Event(), threading.Event()
real_prepare, real_load = warmup._prepare, warmup._load_lazy
if CASE == "busy-long":
    warmup.QUIET_WAIT_MAX_S = 0.5


def held(*args):
    entered.set()
    gate.wait(60)
    try:
        if CASE == "fail":
            raise RuntimeError("the warm-up broke")
        return real_prepare(*args)
    finally:
        prepared.set()


def load(*args):
    try:
        real_load(*args)
    finally:
        finished.set()


warmup._prepare, warmup._load_lazy = held, load


def loaded():
    tiktoken = sys.modules.get("tiktoken")
    return tiktoken is not None and "o200k_base" in tiktoken.registry.ENCODINGS


async def health(stub, http):
    grpc_status = (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)).status
    async with http.get("http://127.0.0.1:{http_port}/health/ready") as reply:
        return [grpc_status, reply.status]


async def main():
    serving = serve()
    report = {{}}
    async with grpc.aio.insecure_channel("127.0.0.1:{port}") as channel, aiohttp.ClientSession() as http:
        stub = pb_grpc.CodeAgentServiceStub(channel)
        await until_serving(stub)
        assert await asyncio.to_thread(entered.wait, 30), "the warm-up never started"
        report["held"] = {{"health": await health(stub, http), "loaded": loaded(), "provider": PROVIDER in sys.modules}}
        if CASE == "stop":
            os.kill(os.getpid(), signal.SIGTERM)
            report["code"] = await asyncio.wait_for(serving, 30)  # while the warm-up is still held
            gate.set()
            await asyncio.to_thread(prepared.wait, 30)
            report["after"] = {{"loaded": loaded(), "provider": PROVIDER in sys.modules}}
            print(json.dumps(report))
            return
        if CASE.startswith("busy"):  # a busy server: the load waits for a quiet moment (or too long)
            burning = threading.Event()
            burner = threading.Thread(target=lambda: [None for _ in iter(burning.is_set, True)])
            burner.start()
            gate.set()
            await asyncio.to_thread(prepared.wait, 30)
            # 3 s: well past the quiet windows and a load; 10 s: past the longest wait (0.5 s) and the load
            load_done = await asyncio.to_thread(finished.wait, 10.0 if CASE == "busy-long" else 3.0)
            report["busy"] = {{"loaded while busy": load_done, "provider": PROVIDER in sys.modules}}
            burning.set()
            burner.join()
        gate.set()
        assert await asyncio.to_thread((finished if CASE != "fail" else prepared).wait, 60), "the warm-up never ended"
        report["after"] = {{"health": await health(stub, http), "loaded": loaded(), "provider": PROVIDER in sys.modules}}
        created = await stub.CreateSession(pb.CreateSessionRequest())
        report["session"] = bool(created.session_id)
    os.kill(os.getpid(), signal.SIGTERM)
    report["code"] = await serving
    print(json.dumps(report))


asyncio.run(main())
"""

SERVING = [1, 200]  # HealthCheck STATUS_HEALTHY, /health/ready 200


def _run_case(case: str, tmp_path: Path) -> tuple[dict[str, object], str]:
    return run_fresh_server(
        _CHILD, tmp_path, {"TIKTOKEN_CACHE_DIR": str(tmp_path / "tiktoken")}, 180, case=case
    )


def test_the_server_is_ready_while_the_warm_up_runs_and_warmed_after_it(tmp_path: Path) -> None:
    report, _ = _run_case("ready", tmp_path)
    assert report["held"] == {"health": SERVING, "loaded": False, "provider": False}
    assert report["after"] == {"health": SERVING, "loaded": True, "provider": True}
    assert report["session"] and report["code"] == 0
    assert any((tmp_path / "tiktoken").iterdir()), "the tokenizer's file was not seeded"


def test_the_tokenizer_load_waits_while_the_server_is_busy(tmp_path: Path) -> None:
    """A thread burning the interpreter stands for callers keeping the server busy: the schemas are
    warmed, the provider modules and the tokenizer wait until the burn stops."""
    report, _ = _run_case("busy", tmp_path)
    assert report["busy"] == {"loaded while busy": False, "provider": False}
    assert report["after"] == {"health": SERVING, "loaded": True, "provider": True}


def test_a_server_never_quiet_loads_the_tokenizer_after_the_longest_wait(tmp_path: Path) -> None:
    """QUIET_WAIT_MAX_S (0.5 s in this case): the load comes while the burn goes on."""
    report, _ = _run_case("busy-long", tmp_path)
    assert report["busy"] == {"loaded while busy": True, "provider": True}
    assert report["after"] == {"health": SERVING, "loaded": True, "provider": True}


def test_a_stop_during_the_warm_up_is_clean_and_skips_what_is_left(tmp_path: Path) -> None:
    report, _ = _run_case("stop", tmp_path)
    assert report["held"] == {"health": SERVING, "loaded": False, "provider": False}
    assert report["code"] == 0
    assert report["after"] == {"loaded": False, "provider": False}


def test_a_failed_warm_up_is_logged_and_the_server_serves_on(tmp_path: Path) -> None:
    report, stderr = _run_case("fail", tmp_path)
    assert report["after"] == {"health": SERVING, "loaded": False, "provider": False}
    assert report["session"] and report["code"] == 0
    assert "warm-up failed" in stderr and "the warm-up broke" in stderr


def test_the_tokenizer_loads_with_a_short_switch_interval_and_it_is_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the warm-up's thread parses the BPE file, calls on the event loop get the interpreter
    back within LOAD_SWITCH_INTERVAL_S instead of Python's 5 ms; afterwards the interval is the
    process's again."""
    seen: list[float] = []
    monkeypatch.setattr(tokens, "load_encoding", lambda name: seen.append(sys.getswitchinterval()))
    before = sys.getswitchinterval()
    warmup._load_lazy("gpt-4o", [], threading.Event())
    assert seen == [warmup.LOAD_SWITCH_INTERVAL_S] and sys.getswitchinterval() == before
