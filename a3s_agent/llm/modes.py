"""How an LLM config's provider name picks the way tools are offered (kept apart from the
providers themselves, so choosing costs no imports)."""

from __future__ import annotations

from typing import Literal

ToolMode = Literal["native", "text"]
RELAY_PROVIDER = "relay"  # the outbox/inbox relay: a person copies each turn to a chat and back
_MODE_SUFFIXES: dict[str, ToolMode] = {"+text": "text", "+native": "native"}


def tool_mode(provider: str, default: ToolMode = "native") -> tuple[str, ToolMode]:
    """The provider name without its mode suffix, and the tool mode: "openai+text" -> ("openai", "text")."""
    for suffix, mode in _MODE_SUFFIXES.items():
        if provider.endswith(suffix):
            return provider.removesuffix(suffix), mode
    return provider, default


def speaks_text_protocol(provider: str, default: ToolMode) -> bool:
    """Whether a model writes CodingAgent commands: tag tool mode, or the relay."""
    name, mode = tool_mode(provider, default)
    return mode == "text" or name == RELAY_PROVIDER
