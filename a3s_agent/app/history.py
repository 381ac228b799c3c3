"""A session's history read in pages, and a stored session made ready again (A3S's GetMessages and
RestoreSession). A page comes as our messages or in A3S's shape (`Conversation`), which both faces
send as it is."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, cast

from ..base.models import Attachment, Message
from ..runtime import Runtime


@dataclass(frozen=True)
class HistoryPage:
    messages: list[Message]
    """The live history from `offset` on (compaction and clearing archive what came before)."""
    offset: int
    total: int
    """Messages in the live history."""
    updated_at: int
    """The session's last change, Unix ms: the store keeps no time per message."""


@dataclass(frozen=True)
class TextBlock:
    text: str


@dataclass(frozen=True)
class ToolUseBlock:
    id: str
    name: str
    arguments: str
    """The call's arguments as a JSON text."""


@dataclass(frozen=True)
class ToolResultBlock:
    tool_use_id: str
    content: str
    is_error: bool


Block = TextBlock | ToolUseBlock | ToolResultBlock


@dataclass(frozen=True)
class ConversationMessage:
    """A message as A3S's GetMessages gives it (a3s-string-dialect.md 4.1)."""

    id: str
    """`msg_<position in the live history>`."""
    role: str
    """user, assistant or system: a tool's result is a user message with a ToolResultBlock."""
    content: list[Block]
    timestamp: int
    """The session's last change, Unix ms (the store keeps no time per message)."""


@dataclass(frozen=True)
class Conversation:
    """A page of GetMessages: at most the bytes asked for, so it may end before the limit."""

    messages: list[ConversationMessage]
    total: int
    has_more: bool


class History:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    async def page(self, session_id: str, offset: int, limit: int | None) -> HistoryPage:
        """Up to `limit` messages (None: all) from position `offset`; NotFound for an unknown session."""
        messages = await self._history(session_id)
        end = len(messages) if limit is None else offset + limit
        updated_at = self._rt.sessions.get(session_id).updated_at
        return HistoryPage(messages[offset:end], offset, len(messages), updated_at)

    async def conversation(
        self, session_id: str, offset: int, limit: int | None, max_bytes: int
    ) -> Conversation:
        """`page` in A3S's shape, its messages cut short once they would hold more than `max_bytes`
        (then `has_more` is set and the client asks again from offset + len(messages)); a single
        message over it comes with its texts cut. A long history past the bound is never converted."""
        page = await self.page(session_id, offset, limit)
        converted = (_in_a3s_shape(page, i) for i in range(len(page.messages)))
        messages = _fitting(converted, max_bytes)
        cut_short = len(messages) < len(page.messages)
        more = cut_short or (limit is not None and offset + limit < page.total)
        return Conversation(messages, page.total, more)

    async def restore(self, session_id: str) -> int:
        """Load a stored session's history (sessions outlive restarts: there is nothing else to
        bring back); its message count. NotFound when no session is stored under `session_id`."""
        return len(await self._history(session_id))

    async def _history(self, session_id: str) -> list[Message]:
        await self._rt.sessions.refresh(session_id)
        return await self._rt.sessions.history(session_id)


def _in_a3s_shape(page: HistoryPage, position: int) -> ConversationMessage:
    """Our message as A3S's: a tool's result is a user message with a tool_result block, an
    assistant's calls are tool_use blocks after its text; attachments are named in a text block."""
    message = page.messages[position]
    blocks: list[Block] = []
    if message.role == "tool":
        failed = message.metadata.get("success") == "false"
        blocks.append(ToolResultBlock(message.tool_call_id, message.content, failed))
    elif message.content:
        blocks.append(TextBlock(message.content))
    blocks += [ToolUseBlock(c.id, c.name, c.arguments) for c in message.tool_calls]
    blocks += [TextBlock(_attachment_note(attachment)) for attachment in message.attachments]
    return ConversationMessage(
        id=f"msg_{page.offset + position}",
        role="user" if message.role == "tool" else message.role,
        content=blocks or [TextBlock("")],
        timestamp=page.updated_at,
    )


def _attachment_note(attachment: Attachment) -> str:
    what = attachment.name or attachment.url or attachment.mime_type
    return f"[{attachment.kind} attachment: {what}, {len(attachment.content)} bytes]"


_TEXT_FIELDS = {TextBlock: "text", ToolUseBlock: "arguments", ToolResultBlock: "content"}
"""The field of each kind of block that holds its (possibly long) text."""


def _strings(block: Block) -> list[str]:
    if isinstance(block, TextBlock):
        return [block.text]
    if isinstance(block, ToolUseBlock):
        return [block.id, block.name, block.arguments]
    return [block.tool_use_id, block.content]


def _size(message: ConversationMessage) -> int:
    """At least the bytes `message` takes in protobuf (each string with its tag and length, each
    block and the message with their headers and numbers); JSON's are of the same order."""
    strings = [message.id, message.role, *(s for block in message.content for s in _strings(block))]
    return sum(len(s.encode()) + 6 for s in strings) + 12 * len(message.content) + 24


def _fitting(messages: Iterable[ConversationMessage], budget: int) -> list[ConversationMessage]:
    """The first messages whose size fits `budget`, at least one (its texts cut to fit);
    converted as they are taken."""
    kept: list[ConversationMessage] = []
    used = 0
    for message in messages:
        size = _size(message)
        if used + size > budget:
            if not kept:
                kept.append(_cut(message, budget))
            break
        kept.append(message)
        used += size
    return kept


def _cut(message: ConversationMessage, budget: int) -> ConversationMessage:
    """`message` with each block's text cut to its share of `budget` (UTF-8 bytes), marked."""
    share = max(budget // (2 * len(message.content)), 1)
    blocks: list[Block] = []
    for block in message.content:
        field = _TEXT_FIELDS[type(block)]
        text: str = getattr(block, field)
        if len(text.encode()) > share:
            kept = text.encode()[:share].decode(errors="ignore")
            cut = len(text) - len(kept)
            marked = f"{kept}\n[{cut} characters cut: more than one reply carries]"
            block = replace(cast("Any", block), **{field: marked})
        blocks.append(block)
    return replace(message, content=blocks)
