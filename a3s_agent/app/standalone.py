"""An application in a process of its own, for the commands that run the agent without the server:
`a3s-agent relay`, `coven`, `acp` and `ops`."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ..base import metrics
from ..config import Settings
from ..runtime import Runtime, gauges
from ..runtime.providers import ProviderFactory
from ..spaces.policies import DEFAULT_PRESET, PolicySpec
from ..spaces.service import RunResult
from ..tools.builtin import builtin_registry
from ..tools.registry import ToolRegistry
from .application import Application


@asynccontextmanager
async def standalone(
    settings: Settings, *, relay: ProviderFactory | None = None, registry: ToolRegistry | None = None
) -> AsyncIterator[Application]:
    """The application over a runtime of its own with the built-in tools (or `registry`'s), started
    for the block and closed after it, its metrics pushed over OTLP when the environment asks.
    `relay` replaces the relay provider (see ProviderCache)."""
    runtime = Runtime(
        settings, registry=registry if registry is not None else builtin_registry(), relay=relay
    )
    app = Application(runtime)
    # Metrics over OTLP when the OTEL_* variables name an endpoint (no /metrics: no HTTP face here).
    if metrics.configure(app.lifecycle.info.version, False, settings.model_prices):
        gauges.observe(runtime)
    await runtime.start()
    try:
        yield app
    finally:
        await runtime.close()
        await asyncio.to_thread(metrics.shutdown)  # the last metrics exported


async def run_operations_file(path: Path, workspace: Path, policy: PolicySpec = DEFAULT_PRESET) -> RunResult:
    """Run the operations message in the JSON file `path` in `workspace`; its events message.

    For `a3s-agent ops`: the run lives in a temporary data dir, so a run that needs approval ends
    with the awaiting_approval events message and cannot be resumed."""
    with tempfile.TemporaryDirectory(prefix="a3s-spaces-") as data_dir:
        async with standalone(Settings(workspace=workspace, data_dir=Path(data_dir))) as app:
            return await app.spaces.run_file(path, workspace, policy)
