"""The provider configuration group of the later dialect (a3s-string-dialect.md 4.4): each RPC a
conversion of code_agent_later_pb2's messages around one call of `app.providers` (app/providers.py
says what they do).

A failure is a status, not `success=false`: an unknown provider is NOT_FOUND, a name taken
ALREADY_EXISTS, a bad field INVALID_ARGUMENT naming it. A provider's `api_key` is never answered
with: a reply carries the `${env:...}`/`${file:...}` reference the key was given as, or no api_key.
"""

from __future__ import annotations

from typing import Any

from ...app import Application
from ...base.errors import InvalidArgument
from ...base.providers import ModelSpec, ProviderChange
from ...proto import code_agent_later_pb2 as later
from .. import later_service as groups
from .errors import rpc


class LaterProviderService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def ListProviders(
        self, request: later.ListProvidersRequest, context: Any
    ) -> later.ListProvidersResponse:
        return later.ListProvidersResponse(**groups.provider_list(self.app.providers.list()))

    @rpc
    async def GetProvider(self, request: later.GetProviderRequest, context: Any) -> later.GetProviderResponse:
        return later.GetProviderResponse(provider=groups.provider_info(self.app.providers.get(request.name)))

    @rpc
    async def AddProvider(self, request: later.AddProviderRequest, context: Any) -> later.AddProviderResponse:
        view = await self.app.providers.add(_change(request))
        return later.AddProviderResponse(success=True, provider=groups.provider_info(view))

    @rpc
    async def UpdateProvider(
        self, request: later.UpdateProviderRequest, context: Any
    ) -> later.UpdateProviderResponse:
        view = await self.app.providers.update(_change(request))
        return later.UpdateProviderResponse(success=True, provider=groups.provider_info(view))

    @rpc
    async def RemoveProvider(
        self, request: later.RemoveProviderRequest, context: Any
    ) -> later.RemoveProviderResponse:
        await self.app.providers.remove(request.name)
        return later.RemoveProviderResponse(success=True)

    @rpc
    async def SetDefaultModel(
        self, request: later.SetDefaultModelRequest, context: Any
    ) -> later.SetDefaultModelResponse:
        done = await self.app.providers.set_default(request.provider, request.model)
        return later.SetDefaultModelResponse(success=True, provider=done.provider, model=done.model)

    @rpc
    async def GetDefaultModel(
        self, request: later.GetDefaultModelRequest, context: Any
    ) -> later.GetDefaultModelResponse:
        return later.GetDefaultModelResponse(**groups.default_model(self.app.providers.default()))


def _change(request: later.AddProviderRequest | later.UpdateProviderRequest) -> ProviderChange:
    if not request.HasField("provider"):
        raise InvalidArgument("provider is required")
    info = request.provider
    return ProviderChange(
        name=info.name,
        base_url=info.base_url if info.HasField("base_url") else None,
        api_key=info.api_key if info.HasField("api_key") else None,
        models=tuple(_model(model, f"provider.models[{i}]") for i, model in enumerate(info.models)),
    )


def _model(model: later.ModelInfo, where: str) -> ModelSpec:
    groups.refuse_model_endpoint(where, model.api_key, model.base_url)
    return ModelSpec(
        id=model.id,
        name=model.name,
        family=model.family,
        attachment=model.attachment,
        reasoning=model.reasoning,
        tool_call=model.tool_call,
        temperature=model.temperature,
        release_date=model.release_date,
        input_modalities=tuple(model.modalities.input),
        output_modalities=tuple(model.modalities.output),
        cost_input=model.cost.input,
        cost_output=model.cost.output,
        cost_cache_read=model.cost.cache_read,
        cost_cache_write=model.cost.cache_write,
        context_limit=model.limit.context,
        output_limit=model.limit.output,
    )
