"""Conversion between protobuf messages and core types. API keys never leave through here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

from ...app.lifecycle import AgentInfo
from ...app.types import (
    AgentEvent,
    ConfirmationPolicy,
    ContextUsage,
    DoneEvent,
    Event,
    GenerateOptions,
    Generation,
    LaneHandler,
    NoticeEvent,
    PendingTask,
    PermissionPolicy,
    Session,
    TextEvent,
    ThinkingEvent,
    Tool,
    ToolCallEvent,
    ToolOutput,
    ToolResultEvent,
    TurnEvent,
)
from ...base.errors import InvalidArgument
from ...base.models import Attachment, LLMConfig, Message, SessionConfig, ToolCall, Usage
from ...proto import code_agent_pb2 as pb
from ..agent_service import (
    check_message_count,
    check_message_size,
    event_time,
    generate_options,
    generation_metadata,
    lane_handler,
    thinking_metadata,
    tool_call_id,
    turn_metadata,
    yolo_lanes,
)
from ..call_metadata import SEQ

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


def info_to_pb(info: AgentInfo) -> pb.AgentInfo:
    return pb.AgentInfo(
        name=info.name,
        version=info.version,
        description=info.description,
        author=info.author,
        license=info.license,
        homepage=info.homepage,
    )


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


def context_usage_to_pb(usage: ContextUsage) -> pb.ContextUsage:
    return pb.ContextUsage(
        total_tokens=usage.total_tokens,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        message_count=usage.message_count,
    )


def session_to_pb(session: Session, usage: ContextUsage | None) -> pb.Session:
    """The wire session; without `usage` (ListSessions), context_usage carries the message count only."""
    return pb.Session(
        session_id=session.id,
        config=session_config_to_pb(session.config),
        state=cast("pb.SessionState", int(session.state)),
        context_usage=(
            context_usage_to_pb(usage)
            if usage is not None
            else pb.ContextUsage(message_count=session.message_count)
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
        role=role,
        content=message.content,
        attachments=attachments,
        metadata=dict(message.metadata),
        tool_call_id=tool_call_id(message.metadata, field) if role == "tool" else "",
    )


def messages_from_pb(messages: Sequence[pb.Message], field: str, max_count: int) -> list[Message]:
    """Core messages: at most `max_count` of them, and MAX_REQUEST_MESSAGE_SIZE in all."""
    check_message_count(len(messages), field, max_count)
    converted = [message_from_pb(m, f"{field}[{i}]") for i, m in enumerate(messages)]
    check_message_size(converted, field)
    return converted


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


FINISH_REASONS = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "tool_calls": pb.FINISH_REASON_TOOL_CALLS,
    "content_filter": pb.FINISH_REASON_CONTENT_FILTER,
}


def options_from_pb(request: pb.GenerateRequest | pb.GenerateStructuredRequest) -> GenerateOptions:
    """Without `options` tools are on; with them, see generate_options."""
    if not request.HasField("options"):
        return GenerateOptions()
    o = request.options
    return generate_options(
        enable_tools=o.enable_tools,
        allowed_tools=list(o.allowed_tools),
        max_tool_calls=o.max_tool_calls,
        temperature=o.temperature,
        max_tokens=o.max_tokens,
        stop_sequences=list(o.stop_sequences),
        return_intermediate_steps=o.return_intermediate_steps,
    )


def usage_to_pb(usage: Usage) -> pb.Usage:
    return pb.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )


def tool_call_to_pb(call: ToolCall, result: ToolOutput | None = None) -> pb.ToolCall:
    out = pb.ToolCall(id=call.id, name=call.name, arguments=call.arguments)
    if result is not None:
        out.result.CopyFrom(tool_result_to_pb(result))
    return out


def generate_response(session_id: str, generation: Generation, with_steps: bool) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        session_id=session_id,
        message=message_to_pb(generation.message),
        tool_calls=[tool_call_to_pb(call, result) for call, result in generation.tool_calls],
        usage=usage_to_pb(generation.usage),
        finish_reason=FINISH_REASONS[generation.finish_reason],
        metadata=generation_metadata(generation, with_steps),
    )


def event_to_chunk(session_id: str, event: AgentEvent, with_steps: bool, seq: int) -> pb.GenerateChunk:
    """One stream chunk per agent event, its seq in the session's log in `metadata["seq"]`."""
    chunk = _chunk(session_id, event, with_steps)
    chunk.metadata[SEQ] = str(seq)
    return chunk


def _chunk(session_id: str, event: AgentEvent, with_steps: bool) -> pb.GenerateChunk:
    """TOOL_RESULT carries its call's id in tool_call."""
    if isinstance(event, TextEvent):
        return pb.GenerateChunk(
            type=pb.GenerateChunk.CHUNK_TYPE_CONTENT, session_id=session_id, content=event.text
        )
    if isinstance(event, ToolCallEvent):
        return pb.GenerateChunk(
            type=pb.GenerateChunk.CHUNK_TYPE_TOOL_CALL,
            session_id=session_id,
            tool_call=tool_call_to_pb(event.call),
        )
    if isinstance(event, ToolResultEvent):
        return pb.GenerateChunk(
            type=pb.GenerateChunk.CHUNK_TYPE_TOOL_RESULT,
            session_id=session_id,
            tool_call=tool_call_to_pb(event.call),
            tool_result=tool_result_to_pb(event.result),
            metadata={"tool_call_id": event.call.id},
        )
    if isinstance(event, NoticeEvent):
        return pb.GenerateChunk(
            type=pb.GenerateChunk.CHUNK_TYPE_METADATA, session_id=session_id, metadata=event.data
        )
    if isinstance(event, TurnEvent):
        return pb.GenerateChunk(
            type=pb.GenerateChunk.CHUNK_TYPE_METADATA,
            session_id=session_id,
            metadata=turn_metadata(event),
        )
    if isinstance(event, ThinkingEvent):
        return pb.GenerateChunk(
            type=pb.GenerateChunk.CHUNK_TYPE_METADATA,
            session_id=session_id,
            metadata=thinking_metadata(event),
        )
    assert isinstance(event, DoneEvent)
    generation = event.generation
    return pb.GenerateChunk(
        type=pb.GenerateChunk.CHUNK_TYPE_DONE,
        session_id=session_id,
        content=generation.message.content,
        metadata=generation_metadata(generation, with_steps),
    )


def event_to_pb(event: Event) -> pb.AgentEvent:
    timestamp, data = event_time(event)
    out = pb.AgentEvent(
        type=cast("pb.AgentEvent.EventType", int(event.type)),
        timestamp=timestamp,
        message=event.message,
        data=data,
    )
    if event.session_id is not None:
        out.session_id = event.session_id
    return out


_DECISIONS = {
    pb.PERMISSION_DECISION_ALLOW: "allow",
    pb.PERMISSION_DECISION_DENY: "deny",
    pb.PERMISSION_DECISION_ASK: "ask",
}
DECISION_NUMBERS = {name: number for number, name in _DECISIONS.items()}


def permission_policy_from_pb(policy: pb.PermissionPolicy) -> PermissionPolicy:
    """UNKNOWN (unset) default_decision means allow; rules are validated (InvalidArgument)."""
    return PermissionPolicy.from_dict(
        {
            "deny": [r.rule for r in policy.deny],
            "allow": [r.rule for r in policy.allow],
            "ask": [r.rule for r in policy.ask],
            "default_decision": _DECISIONS.get(policy.default_decision, "allow"),
            "enabled": policy.enabled,
        }
    )


def permission_policy_to_pb(policy: PermissionPolicy) -> pb.PermissionPolicy:
    return pb.PermissionPolicy(
        deny=[pb.PermissionRule(rule=r) for r in policy.deny],
        allow=[pb.PermissionRule(rule=r) for r in policy.allow],
        ask=[pb.PermissionRule(rule=r) for r in policy.ask],
        default_decision=DECISION_NUMBERS[policy.default_decision],
        enabled=policy.enabled,
    )


def confirmation_policy_from_pb(policy: pb.ConfirmationPolicy) -> ConfirmationPolicy:
    return ConfirmationPolicy(
        enabled=policy.enabled,
        auto_approve_tools=list(policy.auto_approve_tools),
        require_confirm_tools=list(policy.require_confirm_tools),
        default_timeout_ms=policy.default_timeout_ms,
        auto_approve_on_timeout=policy.timeout_action == pb.TIMEOUT_ACTION_AUTO_APPROVE,
        yolo_lanes=yolo_lanes(policy.yolo_lanes),
    )


def confirmation_policy_to_pb(policy: ConfirmationPolicy) -> pb.ConfirmationPolicy:
    return pb.ConfirmationPolicy(
        enabled=policy.enabled,
        auto_approve_tools=policy.auto_approve_tools,
        require_confirm_tools=policy.require_confirm_tools,
        default_timeout_ms=policy.default_timeout_ms,
        timeout_action=pb.TIMEOUT_ACTION_AUTO_APPROVE
        if policy.auto_approve_on_timeout
        else pb.TIMEOUT_ACTION_REJECT,
        yolo_lanes=cast("list[pb.SessionLane]", policy.yolo_lanes),
    )


def lane_handler_from_pb(config: pb.LaneHandlerConfig) -> LaneHandler:
    return lane_handler(config.mode, config.timeout_ms)


def lane_handler_to_pb(handler: LaneHandler) -> pb.LaneHandlerConfig:
    return pb.LaneHandlerConfig(
        mode=cast("pb.TaskHandlerMode", int(handler.mode)), timeout_ms=handler.timeout_ms
    )


def external_task_to_pb(task: PendingTask) -> pb.ExternalTask:
    return pb.ExternalTask(
        task_id=task.task_id,
        session_id=task.session_id,
        lane=cast("pb.SessionLane", int(task.lane)),
        command_type=task.command_type,
        payload=task.payload,
        timeout_ms=task.timeout_ms,
        remaining_ms=task.remaining_ms,
    )
