"""Content blocks and our messages: a prompt's blocks as the user message the model reads, and a
stored user message as the blocks a replay shows."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Sequence

from acp.schema import (
    AudioContentBlock,
    BlobResourceContents,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
    UserMessageChunk,
)

from ...base.errors import InvalidArgument
from ...base.models import Attachment, Message

PromptBlock = (
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
)


def text_block(text: str) -> TextContentBlock:
    return TextContentBlock(type="text", text=text)


def user_message(blocks: Sequence[PromptBlock]) -> Message:
    """Text blocks and resource links make the text (a link as the markdown link editors write for a
    mention); images and embedded resources become attachments (text resources are shown to the
    model as files, binary ones as data, images as images)."""
    if not blocks:
        raise InvalidArgument("prompt must hold at least one content block")
    texts: list[str] = []
    attachments: list[Attachment] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            texts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            texts.append(f"[@{block.name}]({block.uri})")
        elif isinstance(block, ImageContentBlock):
            content = _decoded(block.data, "an image block's data")
            attachments.append(Attachment("image", block.uri or "", block.mime_type, content))
        elif isinstance(block, EmbeddedResourceContentBlock):
            attachments.append(_resource(block.resource))
        else:
            raise InvalidArgument("audio content is not supported (promptCapabilities.audio is false)")
    return Message(role="user", content="".join(texts), attachments=attachments)


def _resource(resource: TextResourceContents | BlobResourceContents) -> Attachment:
    mime = resource.mime_type or ""
    if isinstance(resource, TextResourceContents):
        return Attachment("file", resource.uri, mime, resource.text.encode("utf-8"))
    kind = "image" if mime.startswith("image/") else "data"
    return Attachment(kind, resource.uri, mime, _decoded(resource.blob, f"resource {resource.uri}'s blob"))


def _decoded(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"{what} is not valid base64: {exc}") from None


def user_chunks(message: Message) -> Iterator[UserMessageChunk]:
    """A stored user message as it was prompted: its text, then its images and resources."""
    if message.content:
        yield UserMessageChunk(session_update="user_message_chunk", content=text_block(message.content))
    for item in message.attachments:
        yield UserMessageChunk(session_update="user_message_chunk", content=_attachment_block(item))


def _attachment_block(item: Attachment) -> ImageContentBlock | EmbeddedResourceContentBlock:
    encoded = base64.b64encode(item.content).decode("ascii")
    if item.kind == "image":
        return ImageContentBlock(type="image", data=encoded, mime_type=item.mime_type or "image/png")
    uri = item.name or item.url or "attachment"
    mime = item.mime_type or None
    if item.kind == "data":
        resource: TextResourceContents | BlobResourceContents = BlobResourceContents(
            uri=uri, blob=encoded, mime_type=mime
        )
    else:
        resource = TextResourceContents(uri=uri, text=item.content.decode("utf-8", "replace"), mime_type=mime)
    return EmbeddedResourceContentBlock(type="resource", resource=resource)
