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
from ...base.providers import DefaultModel, ModelSpec, ProviderChange, ProviderView
from ...proto import code_agent_later_pb2 as later
from ..agent_service import DEFAULT_MODEL_PROVIDER
from .errors import rpc

METHODS = (
    "ListProviders", "GetProvider", "AddProvider", "UpdateProvider", "RemoveProvider", "SetDefaultModel",
    "GetDefaultModel",
)  # fmt: skip


class LaterProviderService:
    def __init__(self, app: Application) -> None:
        self.app = app

    @rpc
    async def ListProviders(
        self, request: later.ListProvidersRequest, context: Any
    ) -> later.ListProvidersResponse:
        listed = self.app.providers.list()
        provider, model = _default(listed.default)
        return later.ListProvidersResponse(
            providers=[_info(view) for view in listed.providers],
            default_provider=provider,
            default_model=model,
        )

    @rpc
    async def GetProvider(self, request: later.GetProviderRequest, context: Any) -> later.GetProviderResponse:
        return later.GetProviderResponse(provider=_info(self.app.providers.get(request.name)))

    @rpc
    async def AddProvider(self, request: later.AddProviderRequest, context: Any) -> later.AddProviderResponse:
        view = await self.app.providers.add(_change(request))
        return later.AddProviderResponse(success=True, provider=_info(view))

    @rpc
    async def UpdateProvider(
        self, request: later.UpdateProviderRequest, context: Any
    ) -> later.UpdateProviderResponse:
        view = await self.app.providers.update(_change(request))
        return later.UpdateProviderResponse(success=True, provider=_info(view))

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
        provider, model = _default(self.app.providers.default())
        return later.GetDefaultModelResponse(provider=provider, model=model)


def _default(default: DefaultModel) -> tuple[str | None, str | None]:
    """The default's fields as the optional strings of the replies (unset when there is none)."""
    if not default.model:
        return None, None
    return default.provider or DEFAULT_MODEL_PROVIDER, default.model


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
    for field in ("api_key", "base_url"):
        if model.HasField(field) and getattr(model, field):
            raise InvalidArgument(
                f"{where}.{field}: a model of its own endpoint or key is not supported; give the"
                f" provider's {field}, or add a provider for that endpoint"
            )
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


def _info(view: ProviderView) -> later.ProviderInfo:
    return later.ProviderInfo(
        name=view.name,
        api_key=view.key_reference or None,
        base_url=view.base_url or None,
        models=[_model_info(model) for model in view.models],
    )


def _model_info(model: ModelSpec) -> later.ModelInfo:
    return later.ModelInfo(
        id=model.id,
        name=model.name,
        family=model.family,
        attachment=model.attachment,
        reasoning=model.reasoning,
        tool_call=model.tool_call,
        temperature=model.temperature,
        release_date=model.release_date or None,
        modalities=later.ModelModalitiesInfo(input=model.input_modalities, output=model.output_modalities),
        cost=later.ModelCostInfo(
            input=model.cost_input,
            output=model.cost_output,
            cache_read=model.cost_cache_read,
            cache_write=model.cost_cache_write,
        ),
        limit=later.ModelLimitInfo(context=model.context_limit, output=model.output_limit),
    )
