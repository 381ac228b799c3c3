"""What an image in a prompt costs in tokens, by its size, the way providers bill it.

- OpenAI (and the default for any other model): `detail: "low"` is 85 tokens; otherwise the image
  is scaled to fit in 2048x2048, then down so that its shorter side is at most 768 pixels, and costs
  85 plus 170 per 512-pixel tile it covers (a 1024x1024 image: 768x768, 4 tiles, 765 tokens).
- Anthropic (`claude` models): an image whose long side is over 1568 pixels is scaled down to it;
  it costs width * height / 750 tokens, at most 1600.

The size is read from the image's first bytes (tools/images.py) in its `data:` URL, or an Anthropic
block's base64 data, decoding only as much as that takes. An image given by a link, or whose size
cannot be read, is counted at the most an image costs (1445 tokens for OpenAI, 1600 for Anthropic):
an estimate that errs towards compacting early, never late.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from ..tools.images import image_of

LOW_DETAIL_TOKENS = 85
_TILE, _TILE_TOKENS, _FIT, _SHORT_SIDE = 512, 170, 2048, 768
_ANTHROPIC_LONG_SIDE, _ANTHROPIC_PIXELS_PER_TOKEN, _ANTHROPIC_MAX = 1568, 750, 1600
_PREFIXES = (1024, 128 * 1024)
"""Base64 characters decoded before the whole: PNG, GIF and WebP say their size in the first few
bytes, a JPEG after its metadata segments (EXIF and ICC profiles, rarely past 64 KiB)."""


def openai_tokens(width: int, height: int) -> int:
    """What OpenAI counts for an image of this size (high detail)."""
    fit = min(1.0, _FIT / max(width, height))
    scale = fit * min(1.0, _SHORT_SIDE / (min(width, height) * fit))
    tiles = math.ceil(_scaled(width, scale) / _TILE) * math.ceil(_scaled(height, scale) / _TILE)
    return LOW_DETAIL_TOKENS + _TILE_TOKENS * tiles


def anthropic_tokens(width: int, height: int) -> int:
    """What Anthropic counts for an image of this size."""
    scale = min(1.0, _ANTHROPIC_LONG_SIDE / max(width, height))
    pixels = _scaled(width, scale) * _scaled(height, scale)
    return min(_ANTHROPIC_MAX, math.ceil(pixels / _ANTHROPIC_PIXELS_PER_TOKEN))


def _scaled(side: int, scale: float) -> int:
    """A side's pixels once scaled (whole pixels, at least one)."""
    return max(1, round(side * scale))


OPENAI_MAX_TOKENS = openai_tokens(_SHORT_SIDE, _FIT)
"""The most an image costs OpenAI: 768x2048 after scaling, 2x4 tiles."""


def image_tokens(part: dict[str, Any], anthropic: bool) -> int:
    """Tokens of one image part: Chat Completions' `image_url`, the Responses API's `input_image`
    or an Anthropic `image` block."""
    if not anthropic and (part.get("detail") or _url_field(part).get("detail")) == "low":
        return LOW_DETAIL_TOKENS
    size = _size(*_base64_data(part))
    if size is None:
        return _ANTHROPIC_MAX if anthropic else OPENAI_MAX_TOKENS
    return anthropic_tokens(*size) if anthropic else openai_tokens(*size)


def _url_field(part: dict[str, Any]) -> dict[str, Any]:
    value = part.get("image_url")
    return value if isinstance(value, dict) else {}


def _base64_data(part: dict[str, Any]) -> tuple[str, int]:
    """The text holding the image's base64 and where the base64 starts in it (a data URL is not
    copied: it may be megabytes); ("", 0) for a link."""
    source = part.get("source")
    if isinstance(source, dict):  # an Anthropic block
        data = source.get("data") if source.get("type") == "base64" else ""
        return (data, 0) if isinstance(data, str) else ("", 0)
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url.startswith("data:"):
        return "", 0
    comma = url.find(",", 0, 256)
    return (url, comma + 1) if comma > 0 and url[:comma].endswith(";base64") else ("", 0)


def _size(text: str, start: int) -> tuple[int, int] | None:
    """(width, height) of the image whose base64 starts at `start` in `text`, decoding a prefix at a time."""
    whole = len(text) - start
    for chars in (*_PREFIXES, whole):
        chars = min(chars, whole)
        try:
            image = image_of(base64.b64decode(text[start : start + chars - chars % 4]))
        except (binascii.Error, ValueError):
            return None
        if image is not None:
            return image.width, image.height
        if chars == whole:
            return None
    return None
