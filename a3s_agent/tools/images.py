"""Images as read_file hands them to a model: told by their first bytes, with their pixel size.

PNG, JPEG, GIF and WebP are the formats every vision API takes (OpenAI, Anthropic, Gemini, and the
local servers that copy OpenAI's API). The content decides, not the file name; a file that starts
like an image but whose header does not parse is no image. Bounds: an image is shown to a model up
to MAX_IMAGE_BYTES and MAX_IMAGE_SIDE pixels a side, the strictest provider's limits (Anthropic
refuses an image whose base64 exceeds 5 MB, or with a side over 8000 pixels), since an image a
provider refuses would stay in the session's history and fail every later request.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAX_IMAGE_BYTES = 5 * 1024 * 1024 * 3 // 4
"""3.75 MiB: the file size whose base64 is 5 MiB."""
MAX_IMAGE_SIDE = 8000
MAGIC_BYTES = 12
"""How many leading bytes `looks_like_image` needs."""

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"
_GIFS = (b"GIF87a", b"GIF89a")
# JPEG start-of-frame markers (they carry the size): C0-CF but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # markers without a length


@dataclass(frozen=True)
class Image:
    format: str  # PNG | JPEG | GIF | WebP
    width: int
    height: int

    @property
    def mime_type(self) -> str:
        return f"image/{self.format.lower()}"

    def fits(self, size: int) -> bool:
        """Whether every vision provider takes it (see the module's bounds)."""
        return size <= MAX_IMAGE_BYTES and max(self.width, self.height) <= MAX_IMAGE_SIDE


def looks_like_image(head: bytes) -> bool:
    """Whether the file's first MAGIC_BYTES are those of an image format read here."""
    return head.startswith((_PNG, _JPEG, *_GIFS)) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")


def image_of(data: bytes) -> Image | None:
    """The image `data` (a whole file, or enough of its start) holds, or None."""
    try:
        if data.startswith(_PNG):
            found = _png(data)
        elif data.startswith(_JPEG):
            found = _jpeg(data)
        elif data.startswith(_GIFS):
            found = Image("GIF", *struct.unpack_from("<HH", data, 6))
        elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            found = _webp(data)
        else:
            return None
    except struct.error:  # the header is cut short
        return None
    return found if found is not None and found.width > 0 and found.height > 0 else None


def _png(data: bytes) -> Image | None:
    if data[12:16] != b"IHDR":
        return None
    return Image("PNG", *struct.unpack_from(">II", data, 16))


def _jpeg(data: bytes) -> Image | None:
    """The size in the first start-of-frame segment, walking the segments from the start."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker == 0xDA:  # start of scan: no frame header came before it
            return None
        (length,) = struct.unpack_from(">H", data, at + 2)
        if marker in _SOF:
            height, width = struct.unpack_from(">HH", data, at + 5)
            return Image("JPEG", width, height)
        at += 2 + length
    return None


def _webp(data: bytes) -> Image | None:
    chunk = data[12:16]
    if chunk == b"VP8X":  # extended: the canvas size, 24 bits each, minus one
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return Image("WebP", width, height) if len(data) >= 30 else None
    if chunk == b"VP8L":  # lossless: 14 bits each, minus one, after the 0x2f signature
        if data[20:21] != b"\x2f":
            return None
        (bits,) = struct.unpack_from("<I", data, 21)
        return Image("WebP", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8 ":  # lossy: after the frame tag and the start code, 14 bits each
        if data[23:26] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack_from("<HH", data, 26)
        return Image("WebP", width & 0x3FFF, height & 0x3FFF)
    return None
