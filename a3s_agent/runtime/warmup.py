"""The warm-up the server runs once it reports ready, so that the first session and the first
generation do not pay for what start-up leaves lazy (start-up stays fast: tests/test_lazy_imports.py).

What is warmed, on a worker thread (it is CPU-bound; the event loop keeps answering health checks):
the schemas of the tools a session is offered (cheap, cached: the first CreateSession needs them),
then the tokenizer of the server's default model, loaded by counting those schemas (which leaves
their count in the token cache), then the modules of the HTTP model providers. A call that needs the
exact count meanwhile waits for the same load, never repeats it; session replies do not wait: from
the warm-up's first step, which announces the load before the schemas are built, until the load is
done, their usage is an estimate (core/context.py `shown_usage`). Stopping skips the steps not
begun; a failure is logged, never fatal (the first calls then load what they need, as without a
warm-up)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

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
            await asyncio.to_thread(_warm, model, tools, self._stopping)
        except Exception as exc:
            log.warning("warm-up failed (the first calls will load what they need): %s", exc)
            return
        if not self._stopping.is_set():
            log.debug("warmed up in %.0f ms", (time.perf_counter() - started) * 1000)


LOAD_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval while the tokenizer loads (Python's default is 5 ms):
parsing its BPE file is Python code on the warm-up's thread, and a call on the event loop waits up
to one interval each time it needs the interpreter back."""


def _warm(model: str, tools: Sequence[Tool], stopping: threading.Event) -> None:
    """The tool schemas and the tokenizer first (the first CreateSession counts tokens), then the
    provider modules (the first Generate), skipping what is left once the server stops."""
    if stopping.is_set():
        return
    counter = TokenCounter(model)
    schemas = [tool_schema(tool) for tool in tools]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(LOAD_SWITCH_INTERVAL_S)
    try:
        if counter.encoding is None:  # the load; None when the model is counted as chars/4
            log.debug("no tokenizer to load for %r", model)
    finally:
        sys.setswitchinterval(interval)
    counter.count_tools(schemas)
    for module in GENERATION_MODULES:
        if stopping.is_set():
            return
        importlib.import_module(module)
