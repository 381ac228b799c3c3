"""Conversion between protobuf messages and core types. API keys never leave through here."""

from __future__ import annotations

import json
from collections.abc import Iterable

from ...core.errors import InvalidArgument
from ...core.models import Attachment, LLMConfig, Message, Session, SessionConfig
from ...proto import code_agent_pb2 as pb
from ...tools.registry import Tool, ToolOutput

_ROLES = {
    pb.Message.ROLE_USER: "user",
    pb.Message.ROLE_ASSISTANT: "assistant",
    pb.Message.ROLE_SYSTEM: "system",
    pb.Message.ROLE_TOOL: "tool",
}
_ROLE_NUMBERS = {name: number for number, name in _ROLES.items()}
_ATTACHMENTS = {
    pb.Attachment.TYPE_FILE: "file",
    pb.Attachment.TYPE_IMAGE: "image",
    pb.Attachment.TYPE_CODE: "code",
    pb.Attachment.TYPE_DATA: "data",
}
_ATTACHMENT_NUMBERS = {name: number for number, name in _ATTACHMENTS.items()}


def llm_from_pb(llm: pb.LLMConfig) -> LLMConfig:
    return LLMConfig(
        provider=llm.provider,
        model=llm.model,
        api_key=llm.api_key,
        base_url=llm.base_url,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens,
    )


def llm_to_pb(llm: LLMConfig) -> pb.LLMConfig:
    """The wire form, always without the API key."""
    return pb.LLMConfig(
        provider=llm.provider,
        model=llm.model,
        base_url=llm.base_url,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens,
    )


def session_config_from_pb(config: pb.SessionConfig) -> SessionConfig:
    return SessionConfig(
        name=config.name,
        workspace=config.workspace,
        llm=llm_from_pb(config.llm) if config.HasField("llm") else None,
        system_prompt=config.system_prompt,
        max_context_length=config.max_context_length,
        auto_compact=config.auto_compact,
    )


def session_config_to_pb(config: SessionConfig) -> pb.SessionConfig:
    out = pb.SessionConfig(
        name=config.name,
        workspace=config.workspace,
        system_prompt=config.system_prompt,
        max_context_length=config.max_context_length,
        auto_compact=config.auto_compact,
    )
    if config.llm is not None:
        out.llm.CopyFrom(llm_to_pb(config.llm))
    return out


def session_to_pb(session: Session) -> pb.Session:
    return pb.Session(
        session_id=session.id,
        config=session_config_to_pb(session.config),
        state=int(session.state),
        context_usage=pb.ContextUsage(
            total_tokens=session.usage.total_tokens,
            prompt_tokens=session.usage.prompt_tokens,
            completion_tokens=session.usage.completion_tokens,
            message_count=session.message_count,
        ),
        created_at=session.created_at,
        updated_at=session.updated_at,
    )


def message_from_pb(message: pb.Message, field: str) -> Message:
    """A core message; `field` names where it came from for error messages."""
    role = _ROLES.get(message.role)
    if role is None:
        raise InvalidArgument(f"{field}.role must be ROLE_USER, ROLE_ASSISTANT, ROLE_SYSTEM or ROLE_TOOL")
    attachments = []
    for index, item in enumerate(message.attachments):
        kind = _ATTACHMENTS.get(item.type)
        if kind is None:
            raise InvalidArgument(f"{field}.attachments[{index}].type must be one of TYPE_FILE..TYPE_DATA")
        attachments.append(
            Attachment(
                kind=kind, name=item.name, mime_type=item.mime_type, content=item.content, url=item.url
            )
        )
    return Message(
        role=role, content=message.content, attachments=attachments, metadata=dict(message.metadata)
    )


def messages_from_pb(messages: Iterable[pb.Message], field: str) -> list[Message]:
    return [message_from_pb(m, f"{field}[{i}]") for i, m in enumerate(messages)]


def message_to_pb(message: Message) -> pb.Message:
    return pb.Message(
        role=_ROLE_NUMBERS[message.role],
        content=message.content,
        attachments=[
            pb.Attachment(
                type=_ATTACHMENT_NUMBERS[a.kind],
                name=a.name,
                mime_type=a.mime_type,
                content=a.content,
                url=a.url,
            )
            for a in message.attachments
        ],
        metadata=message.metadata,
    )


def tool_result_to_pb(result: ToolOutput) -> pb.ToolResult:
    return pb.ToolResult(
        success=result.success, output=result.output, error=result.error, metadata=result.string_metadata()
    )


def tool_to_pb(item: Tool) -> pb.Tool:
    return pb.Tool(
        name=item.name,
        description=item.description,
        parameters_schema=json.dumps(item.parameters_schema),
        tags=item.tags,
        **{"async": True},
    )


def tool_capability_to_pb(item: Tool) -> pb.ToolCapability:
    return pb.ToolCapability(
        name=item.name, description=item.description, parameters=item.parameter_names, **{"async": True}
    )
