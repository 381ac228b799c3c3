"""Choosing and caching the provider for an LLM configuration."""

from __future__ import annotations

from collections.abc import Callable

from ..base.errors import FailedPrecondition
from ..base.models import LLMConfig
from ..llm.endpoints import credentials_clash, keyless_endpoint
from ..llm.modes import RELAY_PROVIDER, ToolMode, anthropic_thinking, tool_mode
from ..llm.provider import Provider

ProviderFactory = Callable[[LLMConfig], Provider]
"""Builds the provider that talks to an LLM endpoint, given its configuration."""
KEY_HINT = (
    "send config.llm.api_key with Initialize or in the session's config.llm, or start the server"
    " with A3S_LLM_API_KEY (or OPENAI_API_KEY)"
)
"""Where an LLM key may come from (the layers of Runtime.llm_for)."""


def credentials_problem(llm: LLMConfig) -> str | None:
    """Why a merged LLM config's credentials cannot work at its endpoint, else None."""
    endpoint = keyless_endpoint(llm)
    if endpoint is not None:
        return f"no API key is configured for {endpoint}: {KEY_HINT}"
    clash = credentials_clash(llm)
    return None if clash is None else f"the LLM config: {clash}"


def check_credentials(llm: LLMConfig) -> None:
    """FailedPrecondition, before any connection, when the credentials cannot work (see above)."""
    problem = credentials_problem(llm)
    if problem is not None:
        raise FailedPrecondition(problem)


class ProviderCache:
    """One provider (and so one HTTP connection pool) per endpoint and key."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_retries: int,
        tool_mode: ToolMode = "native",
        relay_dir: str = "",
        connect: ProviderFactory | None = None,
        relay: ProviderFactory | None = None,
    ) -> None:
        """`connect` replaces the HTTP providers (the relay and the text tool mode still apply on top
        of it): the seam through which tests plug in an in-process model.
        `relay` replaces the relay provider (the relay CLI's waits and prompts)."""
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._tool_mode: ToolMode = tool_mode
        self._relay_dir = relay_dir
        self._connect = connect or self._http
        self._relay = relay or self._relay_at
        self._providers: dict[tuple[str, str, str], Provider] = {}

    def get(self, llm: LLMConfig) -> Provider:
        key = (llm.provider, llm.base_url, llm.api_key)
        provider = self._providers.get(key)
        if provider is None:
            provider = self._providers[key] = self._build(llm)
        return provider

    def _build(self, llm: LLMConfig) -> Provider:
        """`relay` is the copy-paste relay; `anthropic` and `claude` speak Anthropic's Messages API;
        every other name the OpenAI Chat Completions protocol. Tools are CodingAgent text commands in
        text tool mode (`openai+text`)."""
        name, mode = tool_mode(llm.provider, self._tool_mode)
        if name == RELAY_PROVIDER:
            return self._relay(llm)
        inner = self._connect(llm)
        if mode == "text":
            from ..text_protocol.tag_mode import TextToolProvider

            return TextToolProvider(inner)
        return inner

    def _relay_at(self, llm: LLMConfig) -> Provider:
        from ..text_protocol.relay import RelayProvider, relay_dir_of  # loads only when used

        return RelayProvider(relay_dir_of(llm.base_url, self._relay_dir))

    def _http(self, llm: LLMConfig) -> Provider:
        """The provider for the protocol the name speaks (each imported when first used);
        FailedPrecondition, before any connection, when its credentials cannot work there."""
        check_credentials(llm)
        thinking = anthropic_thinking(tool_mode(llm.provider, self._tool_mode)[0])
        if thinking is not None:
            from ..llm.anthropic_provider import AnthropicProvider

            return AnthropicProvider(
                llm, thinking=thinking, timeout_s=self._timeout_s, max_retries=self._max_retries
            )
        from ..llm.openai_compat import OpenAICompatibleProvider

        return OpenAICompatibleProvider(llm, timeout_s=self._timeout_s, max_retries=self._max_retries)

    async def close(self) -> None:
        for provider in self._providers.values():
            await provider.close()
        self._providers.clear()
