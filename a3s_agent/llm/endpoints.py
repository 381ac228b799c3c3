"""Which endpoint an LLM config calls, and what its credentials cannot do there, told before any
connection (kept apart from the providers themselves, so that checking costs no imports).

- A public model API (KEYED_HOSTS) answers nothing without a key: a config calling one with no
  api_key (and no credentials in its URL) would only fail after the connection, or after retries
  where the network is closed.
- Credentials in a base URL (`https://user:password@host/v1`) are sent as HTTP Basic
  authentication, in the Authorization header; the OpenAI-compatible protocol sends the api_key
  there too, so the two cannot go together (Anthropic's sends the key as `x-api-key`: both go).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..base.models import LLMConfig
from .modes import RELAY_PROVIDER, anthropic_thinking, tool_mode
from .redact import shown_url, url_secrets

OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
KEYED_HOSTS = frozenset(
    {
        "api.openai.com",
        "api.anthropic.com",
        "api.deepseek.com",
        "api.moonshot.ai",
        "api.moonshot.cn",
        "openrouter.ai",
        "api.groq.com",
        "api.mistral.ai",
        "api.x.ai",
        "generativelanguage.googleapis.com",
    }
)
"""Public model APIs that answer nothing without a key."""


def speaks_anthropic(provider: str) -> bool:
    """Whether a provider name means Anthropic's Messages API (else the OpenAI-compatible one)."""
    return anthropic_thinking(tool_mode(provider)[0]) is not None


def base_url_of(llm: LLMConfig) -> str:
    """The base URL a config calls: its own, else its protocol's public API."""
    return llm.base_url or (ANTHROPIC_BASE_URL if speaks_anthropic(llm.provider) else OPENAI_BASE_URL)


def keyless_endpoint(llm: LLMConfig) -> str | None:
    """The public API the config calls (as it may be shown) when it has no key for it, else None."""
    url = base_url_of(llm)
    if llm.api_key or url_secrets(url) or _has_userinfo(url) or tool_mode(llm.provider)[0] == RELAY_PROVIDER:
        return None
    return shown_url(url) if (urlsplit(url).hostname or "").lower() in KEYED_HOSTS else None


def credentials_clash(llm: LLMConfig) -> str | None:
    """What is wrong when the base URL's credentials and the api_key would both be the
    Authorization header, else None."""
    if llm.api_key and _has_userinfo(llm.base_url) and not speaks_anthropic(llm.provider):
        return (
            "base_url carries credentials (user:password@) and api_key is set, and an OpenAI-compatible"
            " endpoint takes each as its Authorization header: give one of them"
        )
    return None


def _has_userinfo(url: str) -> bool:
    return "@" in urlsplit(url).netloc
