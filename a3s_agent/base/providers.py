"""Provider entries (A3S's provider configuration group): named endpoints a session's LLM config may
name instead of spelling out a base URL and key, their models as A3S describes them, and the default
model of sessions that name none; the checks of what a client gives for them.

An entry's name is a provider name as LLM configs use it, so it also says the protocol
(llm/modes.py): `anthropic` and `claude` speak Anthropic's Messages API, every other name the
OpenAI-compatible one. A key is never part of what is shown: an entry says only whether it has one,
and the reference it was given as (`${env:NAME}`, `${file:PATH}`), which names a secret without
holding it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .errors import InvalidArgument

MAX_MODELS = 200
MAX_TEXT_CHARS = 200
MAX_URL_CHARS = 2_000
MAX_KEY_CHARS = 4_000
RESERVED_NAMES = frozenset({"relay"})  # the relay's base_url is a directory, not an endpoint
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_REFERENCE = re.compile(r"\$\{(env|file):([^}]*)\}")
REFERENCE_KINDS = ("env", "file")


@dataclass(frozen=True)
class ModelSpec:
    """A model of an entry, as A3S's ModelInfo describes it (prices per million tokens)."""

    id: str
    name: str = ""
    family: str = ""
    attachment: bool = False
    reasoning: bool = False
    tool_call: bool = False
    temperature: bool = False
    release_date: str = ""
    input_modalities: tuple[str, ...] = ()
    output_modalities: tuple[str, ...] = ()
    cost_input: float = 0.0
    cost_output: float = 0.0
    cost_cache_read: float = 0.0
    cost_cache_write: float = 0.0
    context_limit: int = 0
    output_limit: int = 0


@dataclass(frozen=True)
class ProviderChange:
    """What a client says of an entry: None leaves a field as it is (UpdateProvider) or empty (Add);
    an empty `models` leaves the models as they are on update."""

    name: str
    base_url: str | None = None
    api_key: str | None = None
    models: tuple[ModelSpec, ...] = ()


@dataclass(frozen=True)
class ProviderView:
    """An entry as it is shown: never its key."""

    name: str
    base_url: str
    models: tuple[ModelSpec, ...] = ()
    key_reference: str = ""
    """The `${env:...}`/`${file:...}` reference its key was given as; "" for none or a key itself."""


@dataclass(frozen=True)
class DefaultModel:
    provider: str = ""
    model: str = ""


@dataclass(frozen=True)
class KeyReference:
    kind: str  # env or file
    target: str  # the variable's name or the file's path

    @property
    def text(self) -> str:
        return f"${{{self.kind}:{self.target}}}"


@dataclass(frozen=True)
class ProviderList:
    providers: list[ProviderView] = field(default_factory=list)
    default: DefaultModel = field(default_factory=DefaultModel)


def entry_name(provider: str) -> str:
    """The entry a provider name means: without its mode suffixes ("anthropic+thinking" -> "anthropic")."""
    return provider.split("+", 1)[0].strip()


def checked_name(name: str, where: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"{where} must be 1-64 letters, digits, '.', '_' or '-' (starting with a letter or digit),"
            f" not {name[:70]!r}"
        )
    if name in RESERVED_NAMES:
        raise InvalidArgument(f"{where} {name!r} is reserved (the relay is configured by its base_url)")
    return name


def checked_base_url(url: str, where: str) -> str:
    """An http(s) URL with a host, without credentials or a query (they would be secrets kept
    outside the key's rules); "" (the protocol's public API) stays ""."""
    url = url.strip()
    if not url:
        return ""
    if len(url) > MAX_URL_CHARS:
        raise InvalidArgument(f"{where} is longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"{where} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidArgument(f"{where} must be an http:// or https:// URL with a host, not {url[:80]!r}")
    if "@" in parts.netloc or parts.query or parts.fragment:
        raise InvalidArgument(
            f"{where} must not carry credentials, a query or a fragment: give the key as api_key"
        )
    return url.rstrip("/")


def key_reference(value: str, where: str) -> KeyReference | None:
    """The reference `value` is (`${env:NAME}`, `${file:PATH}`), None for a key itself. A value that
    looks like a reference but is not a well-formed one is InvalidArgument, so that it is never
    taken for (and sent as) a key."""
    match = _REFERENCE.fullmatch(value.strip())
    if match is not None and match.group(2).strip():
        return KeyReference(match.group(1), match.group(2).strip())
    if value.lstrip().startswith(("${", "env:", "file:")):
        raise InvalidArgument(
            f"{where} looks like a reference but is not one: write ${{env:NAME}} or ${{file:PATH}}"
        )
    return None


def checked_key(value: str, where: str) -> str:
    if len(value) > MAX_KEY_CHARS or any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise InvalidArgument(f"{where} must be one line of at most {MAX_KEY_CHARS} characters")
    return value.strip()


def checked_models(models: tuple[ModelSpec, ...], where: str) -> tuple[ModelSpec, ...]:
    if len(models) > MAX_MODELS:
        raise InvalidArgument(f"{where} lists {len(models)} models; at most {MAX_MODELS} are kept")
    seen: set[str] = set()
    for index, model in enumerate(models):
        at = f"{where}[{index}]"
        if not model.id.strip() or len(model.id) > MAX_TEXT_CHARS:
            raise InvalidArgument(f"{at}.id is required (at most {MAX_TEXT_CHARS} characters)")
        if model.id in seen:
            raise InvalidArgument(f"{at}.id {model.id!r} is listed twice")
        seen.add(model.id)
        for name in ("name", "family", "release_date"):
            if len(getattr(model, name)) > MAX_TEXT_CHARS:
                raise InvalidArgument(f"{at}.{name} is longer than {MAX_TEXT_CHARS} characters")
    return models
