"""Conversion between the plain form of the wire messages (codec.py: dicts by proto field name,
enums as numbers) and core types, as faces/grpc/convert.py does for protobuf. API keys never
leave through here."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ...app.lifecycle import AgentInfo
from ...app.subagents import ParentLink
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
from .codec import decode
from .schema import ENUMS

Plain = dict[str, Any]
"""A message's plain form."""
Given = Mapping[str, Any]
"""A request's plain form, or part of it: read, never changed."""


def number(enum: str, name: str) -> int:
    """The number of the value `name` of `enum` (`Message.Role`, `ROLE_USER`)."""
    return ENUMS[enum][name]


def _by_number(enum: str, names: Mapping[str, str]) -> dict[int, str]:
    return {number(enum, wire): domain for wire, domain in names.items()}


_ROLES = _by_number(
    "Message.Role",
    {"ROLE_USER": "user", "ROLE_ASSISTANT": "assistant", "ROLE_SYSTEM": "system", "ROLE_TOOL": "tool"},
)
_ROLE_NUMBERS = {name: n for n, name in _ROLES.items()}
_ATTACHMENTS = _by_number(
    "Attachment.Type", {"TYPE_FILE": "file", "TYPE_IMAGE": "image", "TYPE_CODE": "code", "TYPE_DATA": "data"}
)
_ATTACHMENT_NUMBERS = {name: n for n, name in _ATTACHMENTS.items()}
_DECISIONS = _by_number(
    "PermissionDecision",
    {
        "PERMISSION_DECISION_ALLOW": "allow",
        "PERMISSION_DECISION_DENY": "deny",
        "PERMISSION_DECISION_ASK": "ask",
    },
)
DECISION_NUMBERS = {name: n for n, name in _DECISIONS.items()}
LOG_LEVELS = _by_number(
    "LogConfig.Level",
    {"LEVEL_DEBUG": "DEBUG", "LEVEL_INFO": "INFO", "LEVEL_WARN": "WARNING", "LEVEL_ERROR": "ERROR"},
)
FINISH_REASONS = {
    reason: number("FinishReason", f"FINISH_REASON_{reason.upper()}")
    for reason in ("stop", "length", "tool_calls", "content_filter")
}
_CHUNK = ENUMS["GenerateChunk.ChunkType"]
_AUTO_APPROVE = number("TimeoutAction", "TIMEOUT_ACTION_AUTO_APPROVE")
_REJECT = number("TimeoutAction", "TIMEOUT_ACTION_REJECT")


def given(value: Given | None, message: str) -> Given:
    """A singular message field: an absent one reads as its defaults, as in protobuf."""
    return value if value is not None else _defaults(message)


@functools.cache
def _defaults(message: str) -> Given:
    return MappingProxyType(decode(message, {}))


# --- requests -------------------------------------------------------------------------------


def llm_from(llm: Given) -> LLMConfig:
    return LLMConfig(
        provider=llm["provider"],
        model=llm["model"],
        api_key=llm["api_key"],
        base_url=llm["base_url"],
        temperature=llm["temperature"],
        max_tokens=llm["max_tokens"],
    )


def session_config_from(value: Given | None) -> SessionConfig:
    config = given(value, "SessionConfig")
    return SessionConfig(
        name=config["name"],
        workspace=config["workspace"],
        llm=llm_from(config["llm"]) if config["llm"] is not None else None,
        system_prompt=config["system_prompt"],
        max_context_length=config["max_context_length"],
        auto_compact=config["auto_compact"],
    )


def message_from(message: Given, field: str) -> Message:
    """A core message; `field` names where it came from for error messages."""
    role = _ROLES.get(message["role"])
    if role is None:
        raise InvalidArgument(f"{field}.role must be ROLE_USER, ROLE_ASSISTANT, ROLE_SYSTEM or ROLE_TOOL")
    attachments = []
    for index, item in enumerate(message["attachments"]):
        kind = _ATTACHMENTS.get(item["type"])
        if kind is None:
            raise InvalidArgument(f"{field}.attachments[{index}].type must be one of TYPE_FILE..TYPE_DATA")
        attachments.append(
            Attachment(
                kind=kind,
                name=item["name"],
                mime_type=item["mime_type"],
                content=item["content"],
                url=item["url"],
            )
        )
    metadata = dict(message["metadata"])
    return Message(
        role=role,
        content=message["content"],
        attachments=attachments,
        metadata=metadata,
        tool_call_id=tool_call_id(metadata, field) if role == "tool" else "",
    )


def messages_from(messages: Sequence[Given], field: str, max_count: int) -> list[Message]:
    """Core messages: at most `max_count` of them, and MAX_REQUEST_MESSAGE_SIZE in all."""
    check_message_count(len(messages), field, max_count)
    converted = [message_from(m, f"{field}[{i}]") for i, m in enumerate(messages)]
    check_message_size(converted, field)
    return converted


def options_from(request: Given) -> GenerateOptions:
    """Without `options` tools are on; with them, see generate_options."""
    o = request["options"]
    if o is None:
        return GenerateOptions()
    return generate_options(
        enable_tools=o["enable_tools"],
        allowed_tools=list(o["allowed_tools"]),
        max_tool_calls=o["max_tool_calls"],
        temperature=o["temperature"],
        max_tokens=o["max_tokens"],
        stop_sequences=list(o["stop_sequences"]),
        return_intermediate_steps=o["return_intermediate_steps"],
    )


def tool_call_from(call: Given) -> ToolCall:
    return ToolCall(id=call["id"], name=call["name"], arguments=call["arguments"])


def permission_policy_from(value: Given | None) -> PermissionPolicy:
    """UNKNOWN (unset) default_decision means allow; rules are validated (InvalidArgument)."""
    policy = given(value, "PermissionPolicy")
    return PermissionPolicy.from_dict(
        {
            "deny": [r["rule"] for r in policy["deny"]],
            "allow": [r["rule"] for r in policy["allow"]],
            "ask": [r["rule"] for r in policy["ask"]],
            "default_decision": _DECISIONS.get(policy["default_decision"], "allow"),
            "enabled": policy["enabled"],
        }
    )


def confirmation_policy_from(value: Given | None) -> ConfirmationPolicy:
    policy = given(value, "ConfirmationPolicy")
    return ConfirmationPolicy(
        enabled=policy["enabled"],
        auto_approve_tools=list(policy["auto_approve_tools"]),
        require_confirm_tools=list(policy["require_confirm_tools"]),
        default_timeout_ms=policy["default_timeout_ms"],
        auto_approve_on_timeout=policy["timeout_action"] == _AUTO_APPROVE,
        yolo_lanes=yolo_lanes(policy["yolo_lanes"]),
    )


def lane_handler_from(value: Given | None) -> LaneHandler:
    config = given(value, "LaneHandlerConfig")
    return lane_handler(config["mode"], config["timeout_ms"])


# --- replies --------------------------------------------------------------------------------


def info(agent: AgentInfo) -> Plain:
    return {
        "name": agent.name,
        "version": agent.version,
        "description": agent.description,
        "author": agent.author,
        "license": agent.license,
        "homepage": agent.homepage,
    }


def llm(config: LLMConfig) -> Plain:
    """The wire form, always without the API key."""
    return {
        "provider": config.provider,
        "model": config.model,
        "base_url": config.base_url,
        "temperature": config.temperature,
        "max_tokens": config.max_tokens,
    }


def session_config(config: SessionConfig) -> Plain:
    return {
        "name": config.name,
        "workspace": config.workspace,
        "llm": llm(config.llm) if config.llm is not None else None,
        "system_prompt": config.system_prompt,
        "max_context_length": config.max_context_length,
        "auto_compact": config.auto_compact,
    }


def context_usage(usage: ContextUsage) -> Plain:
    return {
        "total_tokens": usage.total_tokens,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "message_count": usage.message_count,
    }


def session(value: Session, usage: ContextUsage | None) -> Plain:
    """The wire session; without `usage` (ListSessions), context_usage carries the message count only."""
    return {
        "session_id": value.id,
        "config": session_config(value.config),
        "state": int(value.state),
        "context_usage": context_usage(usage)
        if usage is not None
        else {"message_count": value.message_count},
        "created_at": value.created_at,
        "updated_at": value.updated_at,
    }


def lineage(parent: ParentLink | None, children: Sequence[Session]) -> Plain:
    """A session's place among subagents, which the REST routes add to the session's JSON (the
    proto's Session has no field for it): what started it, and the sessions of its subagents."""
    return {
        "parent": _link(parent) if parent is not None else None,
        "children": [
            {
                **_link(child.parent),
                "session_id": child.id,
                "name": child.config.name,
                "created_at": child.created_at,
            }
            for child in children
            if child.parent is not None
        ],
    }


def _link(link: ParentLink) -> Plain:
    return {"session_id": link.session_id, "tool_call_id": link.tool_call_id, "agent": link.agent}


def message(value: Message) -> Plain:
    return {
        "role": _ROLE_NUMBERS[value.role],
        "content": value.content,
        "attachments": [
            {
                "type": _ATTACHMENT_NUMBERS[a.kind],
                "name": a.name,
                "mime_type": a.mime_type,
                "content": a.content,
                "url": a.url,
            }
            for a in value.attachments
        ],
        "metadata": value.metadata,
    }


def tool_result(result: ToolOutput) -> Plain:
    return {
        "success": result.success,
        "output": result.output,
        "error": result.error,
        "metadata": result.string_metadata(),
    }


def tool(item: Tool) -> Plain:
    return {
        "name": item.name,
        "description": item.description,
        "parameters_schema": json.dumps(item.parameters_schema),
        "tags": item.tags,
        "async": True,
    }


def tool_capability(item: Tool) -> Plain:
    return {
        "name": item.name,
        "description": item.description,
        "parameters": item.parameter_names,
        "async": True,
    }


def usage(value: Usage) -> Plain:
    return {
        "prompt_tokens": value.prompt_tokens,
        "completion_tokens": value.completion_tokens,
        "total_tokens": value.total_tokens,
    }


def tool_call(call: ToolCall, result: ToolOutput | None = None) -> Plain:
    return {
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "result": tool_result(result) if result is not None else None,
    }


def generate_response(session_id: str, generation: Generation, with_steps: bool) -> Plain:
    return {
        "session_id": session_id,
        "message": message(generation.message),
        "tool_calls": [tool_call(call, result) for call, result in generation.tool_calls],
        "usage": usage(generation.usage),
        "finish_reason": FINISH_REASONS[generation.finish_reason],
        "metadata": generation_metadata(generation, with_steps),
    }


def chunk(session_id: str, event: AgentEvent, with_steps: bool, seq: int) -> Plain:
    """One stream chunk per agent event, its seq in the session's log in `metadata["seq"]`."""
    plain = _chunk(session_id, event, with_steps)
    plain["metadata"] = {**plain.get("metadata", {}), SEQ: str(seq)}
    return plain


def _chunk(session_id: str, event: AgentEvent, with_steps: bool) -> Plain:
    """TOOL_RESULT carries its call's id in tool_call."""
    if isinstance(event, TextEvent):
        return {"type": _CHUNK["CHUNK_TYPE_CONTENT"], "session_id": session_id, "content": event.text}
    if isinstance(event, ToolCallEvent):
        return {
            "type": _CHUNK["CHUNK_TYPE_TOOL_CALL"],
            "session_id": session_id,
            "tool_call": tool_call(event.call),
        }
    if isinstance(event, ToolResultEvent):
        return {
            "type": _CHUNK["CHUNK_TYPE_TOOL_RESULT"],
            "session_id": session_id,
            "tool_call": tool_call(event.call),
            "tool_result": tool_result(event.result),
            "metadata": {"tool_call_id": event.call.id},
        }
    if isinstance(event, NoticeEvent):
        return {"type": _CHUNK["CHUNK_TYPE_METADATA"], "session_id": session_id, "metadata": event.data}
    if isinstance(event, TurnEvent):
        return {
            "type": _CHUNK["CHUNK_TYPE_METADATA"],
            "session_id": session_id,
            "metadata": turn_metadata(event),
        }
    if isinstance(event, ThinkingEvent):
        return {
            "type": _CHUNK["CHUNK_TYPE_METADATA"],
            "session_id": session_id,
            "metadata": thinking_metadata(event),
        }
    assert isinstance(event, DoneEvent)
    generation = event.generation
    return {
        "type": _CHUNK["CHUNK_TYPE_DONE"],
        "session_id": session_id,
        "content": generation.message.content,
        "metadata": generation_metadata(generation, with_steps),
    }


def event(value: Event) -> Plain:
    timestamp, data = event_time(value)
    return {
        "type": int(value.type),
        "session_id": value.session_id,
        "timestamp": timestamp,
        "message": value.message,
        "data": data,
    }


def permission_policy(policy: PermissionPolicy) -> Plain:
    return {
        "deny": [{"rule": r} for r in policy.deny],
        "allow": [{"rule": r} for r in policy.allow],
        "ask": [{"rule": r} for r in policy.ask],
        "default_decision": DECISION_NUMBERS[policy.default_decision],
        "enabled": policy.enabled,
    }


def confirmation_policy(policy: ConfirmationPolicy) -> Plain:
    return {
        "enabled": policy.enabled,
        "auto_approve_tools": policy.auto_approve_tools,
        "require_confirm_tools": policy.require_confirm_tools,
        "default_timeout_ms": policy.default_timeout_ms,
        "timeout_action": _AUTO_APPROVE if policy.auto_approve_on_timeout else _REJECT,
        "yolo_lanes": policy.yolo_lanes,
    }


def lane_handler_config(handler: LaneHandler) -> Plain:
    return {"mode": int(handler.mode), "timeout_ms": handler.timeout_ms}


def external_task(task: PendingTask) -> Plain:
    return {
        "task_id": task.task_id,
        "session_id": task.session_id,
        "lane": int(task.lane),
        "command_type": task.command_type,
        "payload": task.payload,
        "timeout_ms": task.timeout_ms,
        "remaining_ms": task.remaining_ms,
    }
