"""The warm-up the server runs once it is ready, so that the first session and the first
generation do not pay for what start-up leaves lazy (start-up stays fast: tests/test_lazy_imports.py).

What is warmed, on a worker thread (it is CPU-bound; the event loop keeps answering): at once, the
schemas of the tools a session is offered (cached: the first CreateSession needs them); then, once
the server has been quiet for a moment (`until_quiet`: its own CPU under a tenth of a core for
QUIET_WINDOWS windows in a row, or after QUIET_WAIT_MAX_S), the modules of the HTTP model providers
(the first Generate) and the tokenizer of the server's default model, loaded by counting those
schemas. Both are CPU work holding the interpreter (the tokenizer ~0.3 s, part of it in tiktoken's
Rust code holding the lock throughout), so a call arriving during them waits: clients that connect
at ready and go on at once (Initialize, CreateSession, Generate) come before them; a Generate that
does imports the provider modules itself (~11 ms, once). Nothing waits for the tokenizer meanwhile:
from the warm-up's first step, which announces its load, until the load is done, session replies
estimate their usage (core/loop/context.py `shown_usage`) and the auto-compaction check settles by a
byte bound (`over_threshold`); a call that needs the exact count waits for the same load, never
repeats it. Stopping skips the steps not begun; a failure is logged, never fatal (the first calls
then load what they need, as without a warm-up)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..llm.messages import tool_schema
from ..llm.tokens import TokenCounter
from ..tools.registry import Tool

if TYPE_CHECKING:
    from . import Runtime

log = logging.getLogger(__name__)

GENERATION_MODULES = ("a3s_agent.llm.openai_compat", "a3s_agent.llm.anthropic_provider")
"""Imported when the first generation builds its provider (runtime/providers.py); each costs
nothing measurable in memory."""


class WarmUp:
    """Started once the server is ready; `stop` at shutdown."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._stopping = threading.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="warm-up")

    async def stop(self) -> None:
        """Skip what is not begun and stop waiting: a step already running on its thread ends
        on its own (each is bounded: an import, one tokenizer load)."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        started = time.perf_counter()
        try:
            tools = self._runtime.tools_for(None)  # read on the loop, which owns the runtime's state
            model = self._runtime.llm_for().model
            # Before the worker starts: session replies estimate from now on rather than load it.
            TokenCounter(model).announce_load()
            schemas = await asyncio.to_thread(_prepare, tools, self._stopping)
            await until_quiet()
            await asyncio.to_thread(_load_lazy, model, schemas, self._stopping)
        except Exception as exc:
            log.warning("warm-up failed (the first calls will load what they need): %s", exc)
            return
        if not self._stopping.is_set():
            log.debug("warmed up in %.0f ms", (time.perf_counter() - started) * 1000)


QUIET_WINDOW_S = 0.1
QUIET_WINDOWS = 2
QUIET_CPU_SHARE = 0.1
"""Of one core: below it, the server is serving nothing much (a health check, a stream waiting)."""
QUIET_WAIT_MAX_S = 10.0
"""A server never that quiet loads the tokenizer anyway after this long (session replies would
stay estimates otherwise)."""


async def until_quiet() -> None:
    """Return once the process has used under QUIET_CPU_SHARE of a core for QUIET_WINDOWS windows
    of QUIET_WINDOW_S in a row, or QUIET_WAIT_MAX_S after the call."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_WAIT_MAX_S
    calm, cpu, wall = 0, time.process_time(), loop.time()
    while calm < QUIET_WINDOWS and wall < deadline:
        await asyncio.sleep(QUIET_WINDOW_S)
        now_cpu, now_wall = time.process_time(), loop.time()
        calm = calm + 1 if now_cpu - cpu < QUIET_CPU_SHARE * (now_wall - wall) else 0
        cpu, wall = now_cpu, now_wall


LOAD_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval while the tokenizer loads (Python's default is 5 ms):
parsing its BPE file is Python code on the warm-up's thread, and a call on the event loop waits up
to one interval each time it needs the interpreter back."""


def _prepare(tools: Sequence[Tool], stopping: threading.Event) -> list[dict[str, Any]]:
    """The tool schemas (the first CreateSession builds them otherwise: ~12 ms)."""
    return [] if stopping.is_set() else [tool_schema(tool) for tool in tools]


def _load_lazy(model: str, schemas: list[dict[str, Any]], stopping: threading.Event) -> None:
    """The provider modules (~11 ms: the first Generate imports them otherwise), then the tokenizer
    of `model`, loaded by counting `schemas` (which leaves their count cached); what is left is
    skipped once the server stops."""
    for module in GENERATION_MODULES:
        if stopping.is_set():
            return
        importlib.import_module(module)
    if stopping.is_set():
        return
    counter = TokenCounter(model)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(LOAD_SWITCH_INTERVAL_S)
    try:
        if counter.encoding is None:  # the load; None when the model is counted as chars/4
            log.debug("no tokenizer to load for %r", model)
    finally:
        sys.setswitchinterval(interval)
    counter.count_tools(schemas)
