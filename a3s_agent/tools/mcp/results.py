"""An MCP tool's result as ours: text blocks are the output; images become image attachments the
model is shown, as read_file's are (only bytes that are an image every vision provider takes, and
MAX_IMAGES a result); an embedded resource's text is included, a resource link or audio is
described in a line; structured content is the output when no block says anything; `isError`
fails the call."""

from __future__ import annotations

import base64
import binascii
import json

import mcp_types

from ...base.models import Attachment
from ..images import MAX_IMAGE_BYTES, MAX_IMAGE_SIDE, image_of
from ..registry import ToolOutput

MAX_IMAGES = 8


def to_output(result: mcp_types.CallToolResult) -> ToolOutput:
    """A tool result as ours: the text of its blocks, images as attachments."""
    parts: list[str] = []
    attachments: list[Attachment] = []
    for block in result.content:
        parts.append(_block(block, attachments))
    text = "\n".join(part for part in parts if part)
    if not text.strip() and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if result.is_error:
        return ToolOutput(
            success=False, error=text or "the MCP tool reported an error", attachments=attachments
        )
    return ToolOutput(output=text, attachments=attachments)


def _block(block: mcp_types.ContentBlock, attachments: list[Attachment]) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent):
        return _image(block.data, block.mime_type, f"image-{len(attachments) + 1}", attachments)
    if isinstance(block, mcp_types.AudioContent):
        return f"[audio ({block.mime_type}, {_size(block.data)}): not shown]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource {block.uri}{about(block.name, block.mime_type)}: read it with read_mcp_resource]"
    if isinstance(block, mcp_types.EmbeddedResource):
        return contents_text(block.resource, attachments)
    return f"[{getattr(block, 'type', 'unknown')} content: not shown]"


def contents_text(
    contents: mcp_types.TextResourceContents | mcp_types.BlobResourceContents, attachments: list[Attachment]
) -> str:
    if isinstance(contents, mcp_types.TextResourceContents):
        return f"[resource {contents.uri}]\n{contents.text}"
    mime = contents.mime_type or "application/octet-stream"
    if mime.startswith("image/"):
        return _image(contents.blob, mime, contents.uri, attachments)
    return f"[resource {contents.uri} ({mime}, {_size(contents.blob)}): binary, not shown]"


def _image(data: str, mime: str, name: str, attachments: list[Attachment]) -> str:
    """An image the model is shown as read_file shows one: only when its bytes are an image every
    vision provider takes (tools/images.py), MAX_IMAGES a result at most."""
    try:
        content = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[image {name} ({mime}): its data is not valid base64]"
    image = image_of(content)
    if image is None:
        return f"[image {name} ({mime}, {len(content)} bytes): not an image this agent can show]"
    if not image.fits(len(content)) or len(attachments) >= MAX_IMAGES:
        why = (
            "too many images"
            if image.fits(len(content))
            else f"over {MAX_IMAGE_BYTES} bytes or {MAX_IMAGE_SIDE} pixels a side"
        )
        return f"[image {name} ({image.mime_type}, {image.width}x{image.height}): not shown, {why}]"
    attachments.append(Attachment(kind="image", name=name, mime_type=image.mime_type, content=content))
    return f"[image {name} ({image.mime_type}, {image.width}x{image.height}, {len(content)} bytes)]"


def _size(data: str) -> str:
    return f"{len(data) * 3 // 4} bytes"


def about(name: str, mime: str | None) -> str:
    return f" ({', '.join(part for part in (name, mime) if part)})" if name or mime else ""
