"""Provider entries and the default model (A3S's provider configuration group): kept in the store,
cached here for `Runtime.llm_for` (which cannot wait on the store), reloaded after each change made
here and when another replica says it made one.

Keys follow the rule every key here follows: a key is sent only to the endpoint it was given for.
- A key a client gives with an entry is bound to the entry's endpoint then (its base URL, or its
  protocol's public API): an update that moves the entry elsewhere without giving a key drops it,
  and a key whose endpoint is no longer the entry's is never used (`key_url`, checked at each use).
- It is stored only when the operator allows it (A3S_STORE_PROVIDER_KEYS); otherwise it is kept in
  the memory of the server it was given to (as a session's or Initialize's key is): a restart or
  another replica does not have it.
- A reference (`${env:NAME}`, `${file:PATH}`) is accepted only when the operator lists it
  (A3S_PROVIDER_KEY_REFS) and only for the endpoint listed with it; it is read at each use, so a
  client can neither name another secret of the server's nor send a listed one elsewhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..base.errors import InvalidArgument, NotFound
from ..base.models import LLMConfig, same_url
from ..base.providers import (
    MAX_KEY_CHARS,
    DefaultModel,
    KeyReference,
    ProviderChange,
    ProviderList,
    ProviderView,
    checked_base_url,
    checked_key,
    checked_models,
    checked_name,
    entry_name,
    key_reference,
)
from ..base.secrets import withheld
from ..config import ProviderKeySettings
from ..core.store.events import now_ms
from ..core.store.providers import ProviderRecord, ProviderTable
from ..llm.endpoints import base_url_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _HeldKey:
    key: str
    url: str  # the endpoint it was given for


class ProviderSettings:
    def __init__(
        self, table: ProviderTable, keys: ProviderKeySettings, changed: Callable[[], Awaitable[None]]
    ) -> None:
        """`changed` tells the other replicas that the entries changed (they `load` them again)."""
        self._table = table
        self._keys = keys
        self._changed = changed
        self._records: dict[str, ProviderRecord] = {}
        self._default: DefaultModel | None = None
        self._held: dict[str, _HeldKey] = {}  # keys given here, kept in memory only

    async def load(self) -> None:
        records, self._default = await self._table.providers()
        self._records = {record.name: record for record in records}
        self._held = {name: held for name, held in self._held.items() if name in self._records}

    # --- what clients see -----------------------------------------------------------------------

    def listed(self) -> ProviderList:
        return ProviderList([self._view(r) for r in self._records.values()], self._default or DefaultModel())

    def get(self, name: str) -> ProviderView:
        return self._view(self._record(name, "name"))

    @property
    def default(self) -> DefaultModel | None:
        return self._default

    def _view(self, record: ProviderRecord) -> ProviderView:
        reference = key_reference(record.api_key, "") if record.api_key else None
        return ProviderView(
            record.name,
            record.base_url,
            record.models,
            key_reference=reference.text if reference is not None else "",
        )

    def _record(self, name: str, where: str) -> ProviderRecord:
        if not name:
            raise InvalidArgument(f"{where} is required: the name of a stored provider")
        record = self._records.get(name)
        if record is None:
            raise NotFound(f"{where}: no provider named {name[:70]!r} (ListProviders lists them)")
        return record

    # --- changes ----------------------------------------------------------------------------------

    async def add(self, change: ProviderChange) -> ProviderView:
        """A new entry; AlreadyExists when one has its name, InvalidArgument naming the field."""
        name = checked_name(change.name, "provider.name")
        base_url = checked_base_url(change.base_url or "", "provider.base_url")
        models = checked_models(change.models, "provider.models")
        now = now_ms()
        record = ProviderRecord(name, base_url, models, "", "", now, now)
        record, held = self._with_key(record, change.api_key)
        await self._table.add_provider(record)
        self._hold(name, held)
        return await self._reloaded(name)

    async def update(self, change: ProviderChange) -> ProviderView:
        """Change the fields given (`provider.name` says which entry); NotFound for an unknown one.
        Moving the entry to another endpoint without giving a key drops the key it had."""
        await self.load()  # what other replicas changed last, not this one's copy
        old = self._record(change.name, "provider.name")
        base_url = old.base_url
        if change.base_url is not None:
            base_url = checked_base_url(change.base_url, "provider.base_url")
        models = checked_models(change.models, "provider.models") if change.models else old.models
        record = replace(old, base_url=base_url, models=models, updated_at=now_ms())
        moved = not same_url(self._url(old), self._url(record))
        held: _HeldKey | None = None
        if change.api_key is not None:
            record, held = self._with_key(replace(record, api_key="", key_url=""), change.api_key)
        elif moved:
            record = replace(record, api_key="", key_url="")
        else:
            held = self._held.get(old.name)
        if not await self._table.save_provider(record):
            raise NotFound(f"provider.name: no provider named {change.name!r} (it was removed)")
        self._hold(record.name, held)
        return await self._reloaded(record.name)

    async def remove(self, name: str) -> None:
        """NotFound for an unknown entry; the default goes with the entry it names."""
        if not name:
            raise InvalidArgument("name is required: the name of a stored provider")
        if not await self._table.remove_provider(name):
            raise NotFound(f"name: no provider named {name[:70]!r} (ListProviders lists them)")
        self._held.pop(name, None)
        await self.load()
        await self._changed()

    async def set_default(self, provider: str, model: str) -> DefaultModel:
        """The model sessions use when they name none: a model of a stored entry (one it lists, when
        it lists any)."""
        if not provider.strip():
            raise InvalidArgument("provider is required: the name of a stored provider")
        if not model.strip():
            raise InvalidArgument("model is required")
        record = self._record(provider, "provider")
        listed = [m.id for m in record.models]
        if listed and model not in listed:
            raise InvalidArgument(
                f"model {model[:70]!r} is not one of {provider}'s models: {', '.join(listed)}"
            )
        default = DefaultModel(provider, model.strip())
        if not await self._table.set_default_model(default, now_ms()):
            raise NotFound(f"provider: no provider named {provider!r} (it was removed)")
        await self.load()
        await self._changed()
        return default

    async def _reloaded(self, name: str) -> ProviderView:
        await self.load()
        await self._changed()
        return self.get(name)

    def _hold(self, name: str, held: _HeldKey | None) -> None:
        if held is None:
            self._held.pop(name, None)
        else:
            self._held[name] = held

    def _with_key(self, record: ProviderRecord, given: str | None) -> tuple[ProviderRecord, _HeldKey | None]:
        """The record with the key a client gave ("" or None: none), and the key to keep in memory
        when the operator does not let keys be stored."""
        value = checked_key(given or "", "provider.api_key")
        if not value:
            return replace(record, api_key="", key_url=""), None
        url = self._url(record)
        reference = key_reference(value, "provider.api_key")
        if reference is not None:
            self._check_reference(reference, url)
            return replace(record, api_key=reference.text, key_url=url), None
        if self._keys.stored:
            return replace(record, api_key=value, key_url=url), None
        log.warning(
            "provider %s: its api_key is kept in this server's memory only (A3S_STORE_PROVIDER_KEYS is"
            " off): a restart or another replica does not have it",
            record.name,
        )
        return replace(record, api_key="", key_url=""), _HeldKey(value, url)

    def _check_reference(self, reference: KeyReference, url: str) -> None:
        bound = self._keys.references.get(reference)
        if bound is None:
            raise InvalidArgument(
                f"provider.api_key: {reference.text} is not a reference the operator allows"
                " (A3S_PROVIDER_KEY_REFS lists those, each with its endpoint)"
            )
        if not same_url(bound, url):
            raise InvalidArgument(
                f"provider.api_key: the operator allows {reference.text} only for {bound}, and this"
                f" provider calls {url}"
            )

    # --- what sessions use ----------------------------------------------------------------------

    def default_llm(self) -> LLMConfig | None:
        """The default model as an LLM config layer (None when none is set)."""
        if self._default is None:
            return None
        return LLMConfig(provider=self._default.provider, model=self._default.model)

    def pinned(self, llm: LLMConfig) -> LLMConfig:
        """A config layer (a session's, Initialize's) as it is kept: one bringing its own key for an
        entry, without a base URL, gets the entry's endpoint written in, the one its key was given
        for; so the key stays there, whatever the entry becomes."""
        record = self._records.get(entry_name(llm.provider))
        if record is None or not llm.api_key or llm.base_url:
            return llm
        return replace(llm, base_url=self._url(record))

    def expand(self, llm: LLMConfig) -> LLMConfig:
        """A config layer naming a stored entry, completed from it: its endpoint, its key (unless the
        layer brings its own) and a model (the default's when that is of this entry, else its
        first). A layer naming another endpoint than the entry's takes nothing from it, nor one
        bringing its own key without an endpoint: that key was given for what the layer meant then
        (`pinned` wrote the entry's endpoint into those given for an entry)."""
        record = self._records.get(entry_name(llm.provider))
        if record is None or (llm.api_key and not llm.base_url):
            return llm
        url = self._url(record)
        if llm.base_url and not same_url(llm.base_url, url):
            return llm
        return replace(
            llm,
            base_url=url,
            api_key=llm.api_key or self._key(record),
            model=llm.model or self._model(record),
        )

    def _model(self, record: ProviderRecord) -> str:
        if self._default is not None and self._default.provider == record.name:
            return self._default.model
        return record.models[0].id if record.models else ""

    def _url(self, record: ProviderRecord) -> str:
        """The endpoint an entry calls: its base URL, else its protocol's public API."""
        return base_url_of(LLMConfig(provider=record.name, base_url=record.base_url))

    def _key(self, record: ProviderRecord) -> str:
        """The entry's key, where it is still bound to the entry's endpoint; "" otherwise."""
        url = self._url(record)
        if record.api_key and same_url(record.key_url, url):
            reference = key_reference(record.api_key, "")
            return record.api_key if reference is None else self._resolved(record.name, reference, url)
        held = self._held.get(record.name)
        return held.key if held is not None and same_url(held.url, url) else ""

    def _resolved(self, name: str, reference: KeyReference, url: str) -> str:
        """A reference's key, read now, when the operator (still) allows it for `url`; "" otherwise."""
        try:
            self._check_reference(reference, url)
        except InvalidArgument:
            log.warning(
                "provider %s: %s is no longer allowed for %s; it has no key", name, reference.text, url
            )
            return ""
        if reference.kind == "env":
            return (os.environ.get(reference.target) or withheld(reference.target)).strip()
        try:
            with Path(reference.target).open("rb") as handle:
                return handle.read(MAX_KEY_CHARS).decode().strip()
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("provider %s: cannot read its key file %s: %s", name, reference.target, exc)
            return ""
