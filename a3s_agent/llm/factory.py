"""Choosing and caching the provider for an LLM configuration."""

from __future__ import annotations

from ..core.models import LLMConfig
from .openai_compat import OpenAICompatibleProvider
from .provider import Provider


class ProviderCache:
    """One provider (and so one HTTP connection pool) per endpoint and key."""

    def __init__(self, *, timeout_s: float, max_retries: int) -> None:
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._providers: dict[tuple[str, str, str], Provider] = {}

    def get(self, llm: LLMConfig) -> Provider:
        key = (llm.provider, llm.base_url, llm.api_key)
        provider = self._providers.get(key)
        if provider is None:
            # Every provider name we know today speaks the OpenAI Chat Completions protocol.
            provider = OpenAICompatibleProvider(llm, timeout_s=self._timeout_s, max_retries=self._max_retries)
            self._providers[key] = provider
        return provider

    async def close(self) -> None:
        for provider in self._providers.values():
            await provider.close()
        self._providers.clear()
