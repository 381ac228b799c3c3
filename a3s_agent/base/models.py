"""Core data types: sessions, their configuration and their messages."""

from __future__ import annotations

import base64
import enum
from dataclasses import asdict, dataclass, field, replace
from typing import Any


class SessionState(enum.IntEnum):
    """Numbers match the wire enum SessionState."""

    ACTIVE = 1
    PAUSED = 2
    COMPLETED = 3
    ERROR = 4


@dataclass
class LLMConfig:
    """Which model to call and how. `api_key` lives in memory only: never stored, never returned."""

    provider: str = ""
    model: str = ""
    api_key: str = ""
    base_url: str = ""
    temperature: float = 0.0
    max_tokens: int = 0

    def without_secret(self) -> LLMConfig:
        return replace(self, api_key="")

    def merged_over(self, base: LLMConfig | None) -> LLMConfig:
        """This config with its empty fields filled from `base`, except the key and the endpoint: a
        key is bound to the endpoint it came with, so a config naming another endpoint gets no key
        from `base`; and one naming another provider means that provider's own endpoint, not the
        URL `base` gave for its provider."""
        if base is None:
            return replace(self)
        merged = LLMConfig(**{name: value or getattr(base, name) for name, value in vars(self).items()})
        if not self.api_key and self._names_other_endpoint(base):
            merged.api_key = ""
        if not self.base_url and self._names_other_provider(base):
            merged.base_url = ""
        return merged

    def _names_other_endpoint(self, base: LLMConfig) -> bool:
        other_url = bool(self.base_url) and _url_key(self.base_url) != _url_key(base.base_url)
        return other_url or self._names_other_provider(base)

    def _names_other_provider(self, base: LLMConfig) -> bool:
        return bool(self.provider) and _provider_key(self.provider) != _provider_key(base.provider)

    def is_empty(self) -> bool:
        return not any(asdict(self).values())


def _url_key(url: str) -> str:
    return url.strip().rstrip("/").lower()


def same_url(a: str, b: str) -> bool:
    """Whether two base URLs name one endpoint (a trailing slash and case aside)."""
    return _url_key(a) == _url_key(b)


DEFAULT_PROVIDER = "openai"
"""A configured model without a provider is served by the OpenAI-compatible one."""


def _provider_key(provider: str) -> str:
    """The provider a name means: "openai+text" is openai's endpoint, and no name means openai."""
    return provider.strip().lower().split("+", 1)[0] or DEFAULT_PROVIDER


@dataclass
class SessionConfig:
    name: str = ""
    workspace: str = ""
    llm: LLMConfig | None = None
    system_prompt: str = ""
    max_context_length: int = 0
    auto_compact: bool = False

    def to_storable(self) -> dict[str, Any]:
        """A JSON-ready dict without the API key."""
        data = asdict(self)
        if self.llm is not None:
            data["llm"] = asdict(self.llm.without_secret())
        return data

    @classmethod
    def from_storable(cls, data: dict[str, Any]) -> SessionConfig:
        llm = data.get("llm")
        return cls(**{**data, "llm": LLMConfig(**llm) if llm is not None else None})


@dataclass
class Attachment:
    """A file, image, code snippet or data blob sent with a message. `kind` is file|image|code|data."""

    kind: str = "file"
    name: str = ""
    mime_type: str = ""
    content: bytes = b""
    url: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["content"] = base64.b64encode(self.content).decode("ascii")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attachment:
        return cls(**{**data, "content": base64.b64decode(data.get("content", ""))})


ProviderState = dict[str, dict[str, Any]]
"""What a provider asked to be given back with a message or a call, opaque to everything else:
DeepSeek's `reasoning_content`, Gemini's `extra_content` (thought signatures), Anthropic's signed
thinking. Keyed by the provider that wrote it (its kind and endpoint), so it goes back only there;
stored with the message, never shown as content, never counted as the answer."""


@dataclass
class ToolCall:
    """A call the model (or a client) made: `arguments` is the JSON text."""

    id: str
    name: str
    arguments: str = "{}"
    provider_state: ProviderState = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.provider_state:
            data["provider_state"] = self.provider_state
        return data


@dataclass
class Message:
    """One entry of a conversation. `role` is user|assistant|system|tool."""

    role: str
    content: str = ""
    attachments: list[Attachment] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""
    provider_state: ProviderState = field(default_factory=dict)
    """See ProviderState: kept with an assistant message for the provider that wrote it."""

    def to_json(self) -> dict[str, Any]:
        """The non-core fields as a JSON-ready dict (role and content are stored as columns)."""
        data: dict[str, Any] = {}
        if self.attachments:
            data["attachments"] = [a.to_json() for a in self.attachments]
        if self.metadata:
            data["metadata"] = self.metadata
        if self.tool_calls:
            data["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id:
            data["tool_call_id"] = self.tool_call_id
        if self.name:
            data["name"] = self.name
        if self.provider_state:
            data["provider_state"] = self.provider_state
        return data

    @classmethod
    def from_json(cls, role: str, content: str, data: dict[str, Any]) -> Message:
        return cls(
            role=role,
            content=content,
            attachments=[Attachment.from_json(a) for a in data.get("attachments", [])],
            metadata=data.get("metadata", {}),
            tool_calls=[ToolCall(**c) for c in data.get("tool_calls", [])],
            tool_call_id=data.get("tool_call_id", ""),
            name=data.get("name", ""),
            provider_state=data.get("provider_state", {}),
        )


@dataclass
class Todo:
    """One item of a session's todo list (the `todo` tool's, GetTodos/SetTodos'): `status` is
    pending|in_progress|completed|cancelled, `priority` high|medium|low (tools/todo.py checks them)."""

    id: str
    content: str
    status: str = "pending"
    priority: str = "medium"

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Todo:
        return cls(**data)


@dataclass
class Usage:
    """Tokens as the provider counted them, in OpenAI's convention: `prompt_tokens` is all of the
    input, cache reads and writes included, and `completion_tokens` all of the output, reasoning
    included. The other three are parts of those, for pricing: `cache_read_tokens` and
    `cache_write_tokens` of the prompt, `reasoning_tokens` of the completion."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        theirs = vars(other)
        return Usage(**{name: mine + theirs[name] for name, mine in vars(self).items()})

    def counts(self) -> dict[str, int]:
        """The fields by name, in field order (what asdict gives, without its deep copy: they are
        ints); the stores write its values in their usage columns' order."""
        return dict(vars(self))
