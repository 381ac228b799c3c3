"""What an LLM config's credentials cannot do at its endpoint, told before any connection (kept
apart from the providers themselves, so that checking costs no imports).

- Credentials in a base URL (`https://user:password@host/v1`) are sent as HTTP Basic
  authentication, in the Authorization header; the OpenAI-compatible protocol sends the api_key
  there too, so the two cannot go together (Anthropic's sends the key as `x-api-key`: both go).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..base.models import LLMConfig
from .modes import anthropic_thinking, tool_mode


def speaks_anthropic(provider: str) -> bool:
    """Whether a provider name means Anthropic's Messages API (else the OpenAI-compatible one)."""
    return anthropic_thinking(tool_mode(provider)[0]) is not None


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
