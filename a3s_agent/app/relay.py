"""The relay (`a3s-agent relay`): sessions whose LLM is a person relaying a chat window, run by an
application in this process. text_protocol/relay.py is the provider: each model turn an outbox
file, each answer a `.txt` file in the relay directory's inbox."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from ..base.models import LLMConfig
from ..config import Settings
from ..llm.modes import RELAY_PROVIDER
from ..llm.provider import Provider
from ..text_protocol.relay import RELAY_SCHEME, RelayProvider, RelaySession, RelayTiming, load_sessions
from ..text_protocol.renderer import CONTINUATION_PROMPT
from .application import Application
from .standalone import standalone

__all__ = [
    "CONTINUATION_PROMPT",
    "RelaySession",
    "RelayTiming",
    "load_sessions",
    "relay_application",
    "relay_llm",
]


def relay_llm(relay_dir: Path) -> LLMConfig:
    """The LLM config of a relay session (the model name is only a label)."""
    return LLMConfig(provider=RELAY_PROVIDER, model="relay", base_url=f"{RELAY_SCHEME}{relay_dir.resolve()}")


def relay_application(
    relay_dir: Path, workspace: Path, timing: RelayTiming, on_waiting: Callable[[Path], None]
) -> AbstractAsyncContextManager[Application]:
    """An application over a runtime of its own whose sessions are kept in `<relay_dir>/data`, and
    whose relay waits for answers with `timing`, calling `on_waiting` with each outbox to paste."""

    def relay(llm: LLMConfig) -> Provider:
        return RelayProvider(relay_dir, timing=timing, on_waiting=on_waiting)

    return standalone(Settings(workspace=workspace, data_dir=relay_dir / "data"), relay=relay)
