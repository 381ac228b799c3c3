"""Provider entries and the default model (A3S's provider configuration group) as the store keeps
them: one row per entry, one row for the default. What they mean is base/providers.py's; which key
an entry may use is runtime/provider_settings.py's.

`api_key` is what the entry's key was given as: a reference (`${env:...}`, `${file:...}`), the key
itself only where the operator lets keys be stored, or "". `key_url` is the endpoint it was given
for: a key is used only while its entry still calls that endpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ...base.providers import DefaultModel, ModelSpec

COLUMNS = "name, base_url, models, api_key, key_url, created_at, updated_at"


@dataclass(frozen=True)
class ProviderRecord:
    name: str
    base_url: str
    models: tuple[ModelSpec, ...]
    api_key: str
    key_url: str
    created_at: int
    updated_at: int

    def row(self) -> tuple[Any, ...]:
        """The values of COLUMNS."""
        models = json.dumps([asdict(model) for model in self.models])
        return (
            self.name,
            self.base_url,
            models,
            self.api_key,
            self.key_url,
            self.created_at,
            self.updated_at,
        )


def record_of(row: tuple[Any, ...]) -> ProviderRecord:
    """A record from the values of COLUMNS."""
    name, base_url, models, api_key, key_url, created_at, updated_at = row
    specs = tuple(
        ModelSpec(
            **{
                **item,
                "input_modalities": tuple(item["input_modalities"]),
                "output_modalities": tuple(item["output_modalities"]),
            }
        )
        for item in json.loads(models)
    )
    return ProviderRecord(name, base_url, specs, api_key, key_url, created_at, updated_at)


class ProviderTable(Protocol):
    async def providers(self) -> tuple[list[ProviderRecord], DefaultModel | None]:
        """Every entry, in the order they were added, and the default model (None: none set)."""
        ...

    async def add_provider(self, record: ProviderRecord) -> None:
        """AlreadyExists when an entry of that name exists."""
        ...

    async def save_provider(self, record: ProviderRecord) -> bool:
        """Replace the entry of that name; False when there is none."""
        ...

    async def remove_provider(self, name: str) -> bool:
        """Remove the entry, and the default when it names it; False when there is none."""
        ...

    async def set_default_model(self, default: DefaultModel, now: int) -> bool:
        """Make `default` the default model, in one transaction with checking that its entry
        exists; False when it does not."""
        ...
