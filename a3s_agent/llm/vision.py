"""Which models take images, and what a model that does not gets instead of a tool result's image.

A model takes images when its family does (`takes_images`: GPT-4o, 4.1, 4.5 and 5, o1, o3 and o4,
Claude 3 and later, Gemini, and the open vision families: LLaVA, Qwen-VL, Pixtral, Llama 3.2 Vision
and 4, InternVL, MiniCPM-V, names with "vision" or "vl"), unless the server's `vision_models`
setting (Initialize `config.custom`) says otherwise: comma-separated name patterns (`*` and `?`
wildcards, case-insensitive), each taking images, or not when it starts with `!`; the last
pattern matching a model decides, and a model none matches keeps its family's default.
E.g. "my-local-vlm, !gpt-4o-mini" or "*" (every model) or "!*" (none).

A model that does not take images is sent a tool result's text with a note in place of its image
(`WithoutImages`); the image stays in the stored history, for a model that does. Images a client
attached to its own message are passed on as they are: the client chose to send them.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import Any

from ..base.errors import InvalidArgument
from .provider import CompletionRequest, Provider, ProviderEvent

VISION_MODELS_KEY = "vision_models"
"""The Initialize `config.custom` key of the override."""

NOT_SHOWN = "(The image itself is not shown: this model does not take images.)"

_FAMILIES = re.compile(
    r"""^(?:
        (?:chatgpt-)?gpt-4o | gpt-4\.1 | gpt-4\.5 | gpt-4-turbo(?!-preview) | gpt-4-vision | gpt-5
        | o1(?!-mini|-preview) | o3(?!-mini) | o4
        | claude-(?:3|opus|sonnet|haiku|[a-z]+-4|4)
        | gemini | llava | bakllava | pixtral | internvl | minicpm-v | moondream | llama-?4
    )""",
    re.VERBOSE,
)
_GENERIC = re.compile(r"vision|(?<![a-z])vl(?![a-z])")
"""Open vision models mostly say so in their names: llama3.2-vision, qwen2.5-vl, qwen2.5vl:7b."""


def takes_images(model: str, overrides: str = "") -> bool:
    """Whether `model` is sent images: the last of `overrides` matching it, else its family's default."""
    name = model.strip().lower()
    for pattern in reversed(_patterns(overrides)):
        if fnmatchcase(name, pattern.lstrip("!")):
            return not pattern.startswith("!")
    short = name.rsplit("/", 1)[-1]  # "openai/gpt-4o" (OpenRouter), "library/llava:13b"
    return bool(_FAMILIES.match(short) or _GENERIC.search(short))


def vision_models(custom: Mapping[str, str]) -> str:
    """The override an Initialize's `config.custom` sets ("" when it sets none), checked."""
    value = custom.get(VISION_MODELS_KEY, "")
    if any(not pattern.lstrip("!") for pattern in _patterns(value)):
        raise InvalidArgument(
            f"config.custom.{VISION_MODELS_KEY} must be comma-separated model name patterns, each"
            f" optionally after '!', not {value!r}"
        )
    return value


def _patterns(overrides: str) -> list[str]:
    return [pattern.strip().lower() for pattern in overrides.split(",") if pattern.strip()]


class WithoutImages:
    """The provider as a model that does not take images uses it: each tool result's image parts
    are left out, a note in their place. It wraps the cached provider for one run and owns nothing."""

    def __init__(self, inner: Provider) -> None:
        self._inner = inner

    def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        return self._inner.stream(replace(request, messages=[_text_only(m) for m in request.messages]))

    async def close(self) -> None:
        """Nothing to release: the provider it wraps belongs to the provider cache."""


def _text_only(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if message.get("role") != "tool" or not isinstance(content, list):
        return message
    texts = [part for part in content if part.get("type") != "image_url"]
    if len(texts) < len(content):
        texts.append({"type": "text", "text": NOT_SHOWN})
    return {**message, "content": texts}
