"""How an LLM config's provider name picks the protocol and the way tools are offered (kept apart
from the providers themselves, so choosing costs no imports).

A name is a provider and optional suffixes: `openai+text` (tools as CodingAgent text commands),
`anthropic+thinking` (Anthropic's Messages API with extended thinking on), `claude+thinking+text`.
"""

from __future__ import annotations

from typing import Literal

ToolMode = Literal["native", "text"]
RELAY_PROVIDER = "relay"  # the outbox/inbox relay: a person copies each turn to a chat and back
ANTHROPIC_PROVIDERS = frozenset({"anthropic", "claude"})  # the names A3S Code and Box configs use
_MODE_SUFFIXES: dict[str, ToolMode] = {"+text": "text", "+native": "native"}
_THINKING_SUFFIX = "+thinking"


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


def anthropic_thinking(name: str) -> bool | None:
    """For a name without its mode suffix: None when it does not mean Anthropic's Messages API, else
    whether extended thinking is asked for ("anthropic" -> False, "claude+thinking" -> True)."""
    base = name.removesuffix(_THINKING_SUFFIX)
    if base.strip().lower() not in ANTHROPIC_PROVIDERS:
        return None
    return base != name
