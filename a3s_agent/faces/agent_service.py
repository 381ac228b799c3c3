"""What the A3S CodeAgentService says the same way in every encoding (gRPC's protobuf, the HTTP
face's JSON): the features it advertises, the strings its replies carry, and the limits and rules
its requests are checked against. Each face converts its own messages; the values come from here."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterable, Mapping, Sequence

from ..app.lifecycle import Capabilities, Health
from ..app.types import (
    DEFAULT_MAX_TOOL_CALLS,
    Event,
    GenerateOptions,
    Generation,
    HandlerMode,
    Lane,
    LaneHandler,
    StructuredDone,
    ThinkingEvent,
    TurnEvent,
)
from ..base.errors import InvalidArgument, NotWaiting, ResourceExhausted
from ..base.models import Message, Usage
from . import later_service

# What GetCapabilities advertises for the Box-era RPCs: every one is served.
FEATURES = [
    "lifecycle", "sessions", "persistent_sessions", "tool_execution", "code_generation", "streaming",
    "structured_output", "custom_tools", "skills", "context_management", "auto_compaction", "events",
    "control", "confirmation", "lanes", "external_tasks", "permissions",
]  # fmt: skip
PROTOCOLS = "grpc,http,websocket"
MODEL_FEATURES = ["chat"]

MAX_PAGE_SIZE = 1000
"""The most sessions one ListSessions reply lists, and what a caller that asks for no page size
gets: the default --max-sessions, so a server with default limits lists everything."""
MAX_REQUEST_MESSAGE_SIZE = 48 * 1024 * 1024
"""The most the messages of one request may hold: characters of text (contents, metadata) plus
bytes of attachments. Below gRPC's 64 MiB message limit, so the refusal names the field; above
the 50 MB the benchmark sends."""
MAX_PAGE_BYTES = MAX_REQUEST_MESSAGE_SIZE
"""The most one GetMessages reply carries (bytes of its messages), the bound a request's messages
have, below gRPC's 64 MiB: a page that would hold more ends early with `has_more` set, and the
client asks again from offset + len(messages). A single message over it has its texts cut."""


def health_message(health: Health) -> str:
    return "shutting down" if health.shutting_down else "ok"


def health_details(health: Health) -> dict[str, str]:
    return {
        "version": health.version,
        "uptime_s": f"{health.uptime_s:.1f}",
        "sessions": str(health.sessions),
        "active_sessions": str(health.active_sessions),
        "histories_in_memory": str(health.histories_in_memory),
        "workspace": str(health.workspace),
        "store": health.store,
        "durability": health.durability,
        **sandbox_details(health.sandbox),
    }


def sandbox_details(sandbox: dict[str, str]) -> dict[str, str]:
    """The sandbox's description as details/metadata entries: sandbox (the mechanism, or
    "unavailable" or "off"), sandbox_network, sandbox_read... (those set only)."""
    return {
        ("sandbox" if key == "mechanism" else f"sandbox_{key}"): value
        for key, value in sandbox.items()
        if value
    }


def features(capabilities: Capabilities) -> list[str]:
    """FEATURES, the served later-only groups' (later_service.served_features: "cron" while scheduling
    is enabled), "sandbox" while tool processes run in an OS sandbox, and "checkpoints" while
    sessions' workspaces are checkpointed (rewind and fork: docs/agent/checkpoints.md)."""
    sandboxed = capabilities.sandbox.get("mechanism") in ("bwrap", "landlock")
    return [
        *FEATURES,
        *later_service.served_features(capabilities.cron),
        *(["sandbox"] if sandboxed else []),
        *(["checkpoints"] if capabilities.checkpoints else []),
    ]


def check_message_count(count: int, field: str, max_count: int) -> None:
    """Before converting them: at most `max_count` messages in one request."""
    if count > max_count:
        raise InvalidArgument(
            f"{field} holds {count} messages; at most {max_count} are accepted in one request"
            " (A3S_MAX_REQUEST_MESSAGES)"
        )


def check_message_size(messages: Sequence[Message], field: str) -> None:
    """After converting them: MAX_REQUEST_MESSAGE_SIZE in all."""
    size = sum(_size(m) for m in messages)
    if size > MAX_REQUEST_MESSAGE_SIZE:
        raise ResourceExhausted(
            f"{field} holds {size} characters and attachment bytes; at most {MAX_REQUEST_MESSAGE_SIZE}"
            " are accepted in one request"
        )


def _size(message: Message) -> int:
    return (
        len(message.content)
        + sum(len(a.content) + len(a.name) + len(a.url) + len(a.mime_type) for a in message.attachments)
        + sum(len(k) + len(v) for k, v in message.metadata.items())
    )


def tool_call_id(metadata: Mapping[str, str], field: str) -> str:
    """The id of the assistant's tool call a ROLE_TOOL message answers: its metadata's tool_call_id."""
    found = metadata.get("tool_call_id", "").strip()
    if not found:
        raise InvalidArgument(
            f"{field}.metadata.tool_call_id is required for a ROLE_TOOL message: the id of the"
            " assistant's tool call it answers"
        )
    return found


def generate_options(
    *,
    enable_tools: bool,
    allowed_tools: list[str],
    max_tool_calls: int,
    temperature: float,
    max_tokens: int,
    stop_sequences: list[str],
    return_intermediate_steps: bool,
) -> GenerateOptions:
    """The request's GenerateOptions (when it has them: without, tools are on): enable_tools or a
    non-empty allowed_tools turns tools on; zero values mean the provider's (or the LLM config's)
    defaults."""
    return GenerateOptions(
        enable_tools=enable_tools or bool(allowed_tools),
        allowed_tools=allowed_tools,
        max_tool_calls=max_tool_calls or DEFAULT_MAX_TOOL_CALLS,
        temperature=temperature or None,
        max_tokens=max_tokens or None,
        stop_sequences=stop_sequences,
        return_intermediate_steps=return_intermediate_steps,
    )


def lane(number: int) -> Lane:
    """A SessionLane number as a Lane (its numbers are the wire's)."""
    if number not in _LANES:
        raise InvalidArgument("lane must be SESSION_LANE_CONTROL, _QUERY, _EXECUTE or _GENERATE")
    return Lane(number)


def yolo_lanes(numbers: Iterable[int]) -> list[int]:
    """A ConfirmationPolicy's yolo_lanes, checked."""
    lanes = [int(number) for number in numbers]
    if any(number not in _LANES for number in lanes):
        raise InvalidArgument(
            "policy.yolo_lanes must hold SESSION_LANE_CONTROL, _QUERY, _EXECUTE or _GENERATE"
        )
    return lanes


def lane_handler(mode: int, timeout_ms: int) -> LaneHandler:
    """A LaneHandlerConfig as a LaneHandler: mode TASK_HANDLER_MODE_UNKNOWN (unset) is INTERNAL."""
    if mode not in {0, *_MODES}:
        raise InvalidArgument("config.mode must be TASK_HANDLER_MODE_INTERNAL, _EXTERNAL or _HYBRID")
    return LaneHandler(HandlerMode(mode or HandlerMode.INTERNAL), timeout_ms)


_LANES = frozenset(int(item) for item in Lane)
_MODES = frozenset(int(item) for item in HandlerMode)


def usage_metadata(usage: Usage) -> dict[str, str]:
    """Usage as metadata: the proto's Usage has the first three only."""
    return {
        "prompt_tokens": str(usage.prompt_tokens),
        "completion_tokens": str(usage.completion_tokens),
        "total_tokens": str(usage.total_tokens),
        "cache_read_tokens": str(usage.cache_read_tokens),
        "cache_write_tokens": str(usage.cache_write_tokens),
        "reasoning_tokens": str(usage.reasoning_tokens),
    }


def generation_metadata(generation: Generation, with_steps: bool) -> dict[str, str]:
    """Generate's metadata, and a stream's DONE chunk's: the run's usage (all of it: see usage_metadata) and, when the session's
    token budget stopped it, `token_budget` and `token_budget_used` (the session's total)."""
    metadata = {
        "model": generation.model,
        "turns": str(generation.turns),
        "duration_ms": f"{generation.duration_ms:.1f}",
        "finish_reason": generation.finish_reason,
        **usage_metadata(generation.usage),
    }
    if generation.budget_spent is not None:
        metadata.update(generation.budget_spent.metadata())
    if with_steps:
        metadata["intermediate_steps"] = json.dumps(
            [
                {
                    "content": m.content,
                    "tool_calls": [
                        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
                    ],
                }
                for m in generation.intermediate
            ]
        )
    return metadata


def turn_metadata(event: TurnEvent) -> dict[str, str]:
    """A stream's METADATA chunk after each model turn."""
    return {"type": "usage", "turn": str(event.turn), **usage_metadata(event.usage)}


def thinking_metadata(event: ThinkingEvent) -> dict[str, str]:
    """A stream's METADATA chunk for a piece of the model's reasoning (never a CONTENT chunk:
    the proto has no chunk type for it, and it is not the answer)."""
    return {"type": "reasoning_delta", "text": event.text}


def structured_metadata(done: StructuredDone) -> dict[str, str]:
    return {"model": done.model, "attempts": str(done.attempts)}


async def answered_in_band(answer: Awaitable[None]) -> str:
    """The error of ConfirmToolExecution and CompleteExternalTask: "" when `answer` (confirming a
    tool call, completing an external task) succeeds, what is unknown when no such call or task
    waits. A3S answers that with `success=false` and this message, not an error status; an
    unknown session stays an error (NOT_FOUND)."""
    try:
        await answer
    except NotWaiting as exc:
        return str(exc)
    return ""


def event_time(event: Event) -> tuple[int, dict[str, str]]:
    """AgentEvent's `timestamp` and `data`: Unix seconds, as A3S means it, and the data with the
    milliseconds the log keeps in `timestamp_ms`."""
    return event.timestamp // 1000, {**event.data, "timestamp_ms": str(event.timestamp)}


def steer_text(messages: Sequence[Message]) -> str:
    """The text of the one user message that steers a running generation (Generate with
    `a3s-steer`); InvalidArgument when the request holds anything else."""
    if len(messages) != 1 or messages[0].role != "user" or messages[0].attachments:
        raise InvalidArgument(
            "messages: a steer (a3s-steer: true) takes exactly one user message of text, no attachments"
        )
    return messages[0].content
