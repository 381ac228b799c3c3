"""Provider settings (A3S's provider configuration group): named provider entries a session's LLM
config may name, and the default model of sessions that name none (runtime/provider_settings.py
keeps them and says which key an entry may use). The domain types are base/providers.py's.
"""

from __future__ import annotations

from ..base.providers import DefaultModel, ProviderChange, ProviderList, ProviderView
from ..runtime import Runtime


class Providers:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def list(self) -> ProviderList:
        """The entries, and the default model as `default` says it."""
        return ProviderList(self._rt.provider_settings.listed().providers, self.default())

    def get(self, name: str) -> ProviderView:
        """NotFound for an unknown name."""
        return self._rt.provider_settings.get(name)

    async def add(self, change: ProviderChange) -> ProviderView:
        """AlreadyExists for a name taken; InvalidArgument naming the field at fault."""
        return await self._rt.provider_settings.add(change)

    async def update(self, change: ProviderChange) -> ProviderView:
        return await self._rt.provider_settings.update(change)

    async def remove(self, name: str) -> None:
        await self._rt.provider_settings.remove(name)

    async def set_default(self, provider: str, model: str) -> DefaultModel:
        return await self._rt.provider_settings.set_default(provider, model)

    def default(self) -> DefaultModel:
        """The model a session naming none uses: the one SetDefaultModel set, else the server's own
        (its flags and environment, or the last Initialize: a provider "" is the OpenAI-compatible
        one); empty fields when there is none."""
        stored = self._rt.provider_settings.default
        if stored is not None:
            return stored
        llm = self._rt.llm_for()
        if not llm.model:
            return DefaultModel()
        return DefaultModel(llm.provider, llm.model)
