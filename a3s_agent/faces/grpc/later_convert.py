"""The later A3S dialect's messages to and from the Box-era ones CodeAgentService handles
(a3s-string-dialect.md 1.3 and 2.6): a later request becomes the Box request it means, a Box reply
the later reply, so every RPC keeps one implementation. Also what both dialects may send on the
Box-shaped RPCs: SessionConfig #7-10 and the event types 16-20."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from ...app.types import Event, EventType, parse_event_types
from ...base.errors import InvalidArgument
from ...proto import code_agent_later_pb2 as lp
from ...proto import code_agent_pb2 as pb

_ROLES = {
    "user": pb.Message.ROLE_USER,
    "assistant": pb.Message.ROLE_ASSISTANT,
    "system": pb.Message.ROLE_SYSTEM,
    "tool": pb.Message.ROLE_TOOL,
    "function": pb.Message.ROLE_TOOL,  # OpenAI's older name; the TS SDK sends it as "tool" itself
}
_ROLE_NAMES = {number: name for name, number in _ROLES.items() if name != "function"}
_ROLES.update({pb.Message.Role.Name(number).lower(): number for number in _ROLE_NAMES})  # ROLE_USER...
_FINISH_REASONS = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
    pb.FINISH_REASON_CONTENT_FILTER: "content_filter",
    pb.FINISH_REASON_ERROR: "error",
}
_CHUNK_TYPES = {
    pb.GenerateChunk.CHUNK_TYPE_CONTENT: "content",
    pb.GenerateChunk.CHUNK_TYPE_TOOL_CALL: "tool_call",
    pb.GenerateChunk.CHUNK_TYPE_TOOL_RESULT: "tool_result",
    pb.GenerateChunk.CHUNK_TYPE_METADATA: "metadata",
    pb.GenerateChunk.CHUNK_TYPE_DONE: "done",
}
_SERVED_STORAGE = (lp.STORAGE_TYPE_UNSPECIFIED, lp.STORAGE_TYPE_MEMORY, lp.STORAGE_TYPE_FILE)
_LATER_EVENT_TYPES = {
    pb_name.removeprefix("EVENT_TYPE_"): number
    for pb_name, number in lp.AgentEvent.EventType.items()
    if number > max(EventType)
}  # MEMORY_STORED .. CONTEXT_COMPACTED: 16-20


# --- requests ------------------------------------------------------------------------------


def _add_messages(
    given: Sequence[lp.Message], into: RepeatedCompositeFieldContainer[pb.Message], field: str
) -> None:
    """Box messages added to `into` (a repeated field): the role as the enum (user, assistant,
    system, tool in any case, "function" for tool, the Box names ROLE_USER...; anything else is
    InvalidArgument naming it), the later #3 metadata (e.g. OpenAI's "name") as metadata."""
    for index, message in enumerate(given):
        number = _ROLES.get(message.role.lower())
        if number is None:
            raise InvalidArgument(
                f"{field}[{index}].role must be user, assistant, system or tool (or ROLE_USER...),"
                f" not {message.role[:50]!r}"
            )
        added = into.add(role=number, content=message.content)
        if message.metadata:
            added.metadata.update(message.metadata)


def generate_request(request: lp.GenerateRequest) -> pb.GenerateRequest:
    out = pb.GenerateRequest(session_id=request.session_id)
    _add_messages(request.messages, out.messages, "messages")
    return out


def structured_request(request: lp.GenerateStructuredRequest) -> pb.GenerateStructuredRequest:
    out = pb.GenerateStructuredRequest(session_id=request.session_id, schema=request.schema)
    _add_messages(request.messages, out.messages, "messages")
    return out


def create_session_request(request: lp.CreateSessionRequest) -> pb.CreateSessionRequest:
    """The config travels as bytes: #7-10 stay in it (unknown to the Box class) for session_extras."""
    out = pb.CreateSessionRequest(config=pb.SessionConfig.FromString(request.config.SerializeToString()))
    _add_messages(request.initial_context, out.initial_context, "initial_context")
    if request.HasField("session_id"):
        out.session_id = request.session_id
    return out


def initialize_request(request: lp.InitializeRequest) -> pb.InitializeRequest:
    """The later #2 env is Box's #3 env; the later dialect has no AgentConfig."""
    return pb.InitializeRequest(workspace=request.workspace, env=request.env)


def session_extras(config: pb.SessionConfig) -> dict[str, float]:
    """The compaction shares SessionConfig #7-10 ask for (either dialect may send them; a Box
    request keeps them as unknown fields). InvalidArgument for what a3s-agent does not serve."""
    later = lp.SessionConfig.FromString(config.SerializeToString())
    if later.storage_type not in _SERVED_STORAGE:
        raise InvalidArgument(
            f"config.storage_type {_storage_name(later.storage_type)} is not served: a3s-agent keeps"
            " every session in its own durable store (use STORAGE_TYPE_UNSPECIFIED, _MEMORY or _FILE)"
        )
    for name in ("planning_enabled", "goal_tracking"):
        if getattr(later, name):
            raise InvalidArgument(
                f"config.{name}: a3s-agent does not plan or track goals inside a generation; call"
                " CreatePlan, ExtractGoal and CheckGoalAchievement instead"
            )
    threshold = later.auto_compact_threshold
    if threshold == 0:  # unset: the server's threshold (or a3s-compact-threshold)
        return {}
    if not 0 < threshold <= 1:
        raise InvalidArgument(
            f"config.auto_compact_threshold must be a share of the context window above 0 and at"
            f" most 1 (0: the server's), not {threshold:g}"
        )
    return {"threshold": round(threshold, 6)}  # a float32 on the wire: 0.7 arrives as 0.69999999


def _storage_name(number: int) -> str:
    try:
        return lp.StorageType.Name(number)
    except ValueError:
        return str(number)


# --- replies -------------------------------------------------------------------------------


def with_threshold(config: pb.SessionConfig, threshold: float) -> None:
    """Echo the session's own auto_compact_threshold (#8) in a Box SessionConfig, as an unknown
    field the Box class writes back out; nothing for 0 (the server's)."""
    if threshold:
        config.MergeFromString(lp.SessionConfig(auto_compact_threshold=threshold).SerializeToString())


def generate_response(reply: pb.GenerateResponse) -> lp.GenerateResponse:
    """`reply` (which it empties of the Box-only fields) as the later reply: role and
    finish_reason as strings, the message's metadata in #3."""
    role, metadata = reply.message.role, dict(reply.message.metadata)
    finish_reason = reply.finish_reason
    neutral_response(reply)
    out = lp.GenerateResponse.FromString(reply.SerializeToString())
    if reply.HasField("message"):
        out.message.role = _ROLE_NAMES.get(role, "")
        out.message.metadata.update(metadata)
    out.finish_reason = _FINISH_REASONS.get(finish_reason, "")
    return out


def neutral_response(reply: pb.GenerateResponse) -> pb.GenerateResponse:
    """`reply` without what the dialects encode differently (role, finish_reason, the message's
    #3/#4): for a request no one can tell the dialect of, both decode it (2.5)."""
    reply.ClearField("finish_reason")
    if reply.HasField("message"):
        for name in ("role", "attachments", "metadata"):
            reply.message.ClearField(name)
    return reply


def chunk(box: pb.GenerateChunk) -> lp.GenerateChunk:
    """`box` (which it empties of its type) as the later chunk: the type as a string, the done
    chunk's finish_reason in #7."""
    kind = box.type
    box.ClearField("type")
    out = lp.GenerateChunk.FromString(box.SerializeToString())
    out.type = _CHUNK_TYPES.get(kind, "")
    if kind == pb.GenerateChunk.CHUNK_TYPE_DONE:
        out.finish_reason = box.metadata.get("finish_reason") or "stop"
    return out


def structured_chunk(box: pb.GenerateStructuredChunk) -> pb.GenerateStructuredChunk | None:
    """Only the final chunk, with the whole data: later clients (the TypeScript SDK's
    streaming-demo) join every chunk's data, and A3S Code sends just that one."""
    return box if box.done else None


# --- events --------------------------------------------------------------------------------


def later_type(event: Event) -> pb.AgentEvent.EventType | None:
    """The later type (16-20) an INFO event of ours is, by its message named as the type
    (`memory_stored`, `memory_recalled`, `memories_searched`, `memory_cleared`: the memory
    group's; `context_compacted`: compaction's), for a later-dialect client (the enum is open)."""
    if event.type is not EventType.INFO:
        return None
    number = _LATER_EVENT_TYPES.get(event.message.upper())
    return None if number is None else cast("pb.AgentEvent.EventType", number)


@dataclass(frozen=True)
class EventFilter:
    """A SubscribeEvents filter that may name the later types 16-20 too: `names` is what the
    application filters by, `passes` what goes out of that. The later types are INFO events of
    ours (`later_type`), which a filter naming either type gets."""

    names: list[str]
    ours: frozenset[int]
    later: frozenset[int]

    def passes(self, event: Event) -> bool:
        if not self.later:
            return True
        return int(event.type) in self.ours or later_type(event) in self.later


def _later_type(name: str) -> int | None:
    return _LATER_EVENT_TYPES.get(name.strip().upper().removeprefix("EVENT_TYPE_"))


def event_filter(names: Sequence[str]) -> EventFilter:
    later = frozenset(number for number in map(_later_type, names) if number is not None)
    if not later:
        return EventFilter(list(names), frozenset(), later)
    ours = [name for name in names if _later_type(name) is None]
    numbers = frozenset(int(t) for t in parse_event_types(ours))
    return EventFilter([*ours, EventType.INFO.name], numbers, later)
