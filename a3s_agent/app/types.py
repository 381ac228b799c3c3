"""The domain types a face converts its wire format to and from, and the parsers of domain values
it checks requests with: what the application layer takes and gives.

Faces import these from here (and the operations from `Application`), never from the layers below
(the contract "Faces see only the application layer" in pyproject.toml), so how core and the tools
are laid out is not the faces' API.
"""

from __future__ import annotations

from ..config import A3S_DIALECTS, Settings
from ..core.loop.agent import (
    DEFAULT_MAX_TOOL_CALLS,
    AgentEvent,
    DoneEvent,
    GenerateOptions,
    Generation,
    NoticeEvent,
    TextEvent,
    ThinkingEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from ..core.loop.budget import parse_budget
from ..core.loop.chunks import entry_chunk
from ..core.loop.context import ContextUsage
from ..core.loop.steering import STEER_APPLIED
from ..core.loop.structured import StructuredDone
from ..core.loop.tool_runner import tool_message
from ..core.policy.permissions import PermissionPolicy
from ..core.sessions.control import Lane, PendingTask
from ..core.sessions.manager import SESSION_ID_PATTERN
from ..core.store.a2a_tasks import A2aTaskRecord, A2aTaskTable
from ..core.store.events import Event, EventType, Resync, parse_event_types
from ..core.store.protocol import LogEntry
from ..core.store.session import ConfirmationPolicy, HandlerMode, LaneHandler, Session
from ..tools.registry import Tool, ToolFailure, ToolOutput

__all__ = [
    "A3S_DIALECTS",
    "DEFAULT_MAX_TOOL_CALLS",
    "SESSION_ID_PATTERN",
    "STEER_APPLIED",
    "A2aTaskRecord",
    "A2aTaskTable",
    "AgentEvent",
    "ConfirmationPolicy",
    "ContextUsage",
    "DoneEvent",
    "Event",
    "EventType",
    "GenerateOptions",
    "Generation",
    "HandlerMode",
    "Lane",
    "LaneHandler",
    "LogEntry",
    "NoticeEvent",
    "PendingTask",
    "PermissionPolicy",
    "Resync",
    "Session",
    "Settings",
    "StructuredDone",
    "TextEvent",
    "ThinkingEvent",
    "Tool",
    "ToolCallEvent",
    "ToolFailure",
    "ToolOutput",
    "ToolResultEvent",
    "TurnEvent",
    "entry_chunk",
    "parse_budget",
    "parse_event_types",
    "tool_message",
]
