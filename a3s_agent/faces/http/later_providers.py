"""The later dialect's provider configuration group over HTTP, as faces/grpc/later_providers.py
serves it over gRPC: a failure is an error (404, 409, 400 naming the field), and a reply never holds
a key (faces/later_service.py builds both faces' replies). An `api_key` or `base_url` absent (or
null) leaves it as it is on update; "" clears it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...app import Application
from ...base.errors import InvalidArgument
from ...base.providers import ModelSpec, ProviderChange
from .. import later_service as groups
from .convert import Given, Plain
from .rpc_table import Handlers

HANDLERS = Handlers()


@HANDLERS.rpc("ListProviders")
async def _list(app: Application, request: Given) -> Plain:
    return groups.provider_list(app.providers.list())


@HANDLERS.rpc("GetProvider")
async def _get(app: Application, request: Given) -> Plain:
    return {"provider": groups.provider_info(app.providers.get(request["name"]))}


@HANDLERS.rpc("AddProvider")
async def _add(app: Application, request: Given) -> Plain:
    view = await app.providers.add(_change(request["provider"]))
    return {"success": True, "provider": groups.provider_info(view)}


@HANDLERS.rpc("UpdateProvider")
async def _update(app: Application, request: Given) -> Plain:
    view = await app.providers.update(_change(request["provider"]))
    return {"success": True, "provider": groups.provider_info(view)}


@HANDLERS.rpc("RemoveProvider")
async def _remove(app: Application, request: Given) -> Plain:
    await app.providers.remove(request["name"])
    return {"success": True}


@HANDLERS.rpc("SetDefaultModel")
async def _set_default(app: Application, request: Given) -> Plain:
    done = await app.providers.set_default(request["provider"], request["model"])
    return {"success": True, "provider": done.provider, "model": done.model}


@HANDLERS.rpc("GetDefaultModel")
async def _get_default(app: Application, request: Given) -> Plain:
    return groups.default_model(app.providers.default())


def _change(info: Mapping[str, Any] | None) -> ProviderChange:
    if info is None:
        raise InvalidArgument("provider is required")
    return ProviderChange(
        name=info["name"],
        base_url=info["base_url"],
        api_key=info["api_key"],
        models=tuple(_model(model, f"provider.models[{i}]") for i, model in enumerate(info["models"])),
    )


def _model(model: Mapping[str, Any], where: str) -> ModelSpec:
    groups.refuse_model_endpoint(where, model["api_key"], model["base_url"])
    modalities = model["modalities"] or {"input": [], "output": []}
    cost = model["cost"] or {"input": 0.0, "output": 0.0, "cache_read": 0.0, "cache_write": 0.0}
    limit = model["limit"] or {"context": 0, "output": 0}
    return ModelSpec(
        id=model["id"],
        name=model["name"],
        family=model["family"],
        attachment=model["attachment"],
        reasoning=model["reasoning"],
        tool_call=model["tool_call"],
        temperature=model["temperature"],
        release_date=model["release_date"] or "",
        input_modalities=tuple(modalities["input"]),
        output_modalities=tuple(modalities["output"]),
        cost_input=cost["input"],
        cost_output=cost["output"],
        cost_cache_read=cost["cache_read"],
        cost_cache_write=cost["cache_write"],
        context_limit=limit["context"],
        output_limit=limit["output"],
    )
