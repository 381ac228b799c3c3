"""A session's record, and what it keeps besides its config (SessionSettings): permission and
confirmation policies, lane handlers, loaded skills, client tools, compaction settings, the
token budget, MCP servers, the todo list, the plan and what its model gets of memories, as one
typed value.

It is stored as the session row's `extras` JSON column, in the shape earlier versions wrote (one key
per setting, a key absent while unset), so stores written by them load unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from ...base.memories import MemorySettings
from ...base.models import SessionConfig, SessionState, Todo, Usage
from ...base.planning import Plan
from ...tools.mcp.config import storable
from ..policy.permissions import PermissionPolicy

DEFAULT_CONFIRMATION_TIMEOUT_MS = 30_000
DEFAULT_EXTERNAL_TIMEOUT_MS = 60_000


class HandlerMode(enum.IntEnum):
    """Numbers match the wire enum TaskHandlerMode."""

    INTERNAL = 1
    EXTERNAL = 2
    HYBRID = 3


@dataclass
class ConfirmationPolicy:
    enabled: bool = False
    auto_approve_tools: list[str] = field(default_factory=list)
    require_confirm_tools: list[str] = field(default_factory=list)
    default_timeout_ms: int = DEFAULT_CONFIRMATION_TIMEOUT_MS
    auto_approve_on_timeout: bool = False
    yolo_lanes: list[int] = field(default_factory=list)

    def needs_confirmation(self, tool: str, lane: int) -> bool:
        """Enabled, not auto-approved, not in a yolo lane, and (when a list is given) listed."""
        if not self.enabled or tool in self.auto_approve_tools or int(lane) in self.yolo_lanes:
            return False
        return not self.require_confirm_tools or tool in self.require_confirm_tools


@dataclass
class LaneHandler:
    mode: HandlerMode = HandlerMode.INTERNAL
    timeout_ms: int = DEFAULT_EXTERNAL_TIMEOUT_MS


@dataclass
class ClientToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    tags: list[str] = field(default_factory=list)


@dataclass
class StoredSkill:
    """A skill loaded in the session: its text, where it was read from and its origin (which
    decides whether its allowed-tools are trusted)."""

    text: str
    source: str
    origin: str = ""  # empty in sessions stored before origins were kept


@dataclass
class SessionSettings:
    # None: the session never had a policy set (the default policy applies).
    permissions: PermissionPolicy | None = None
    # The allow rules in `permissions` that came from loaded trusted skills (not the client's own).
    skill_rules: list[str] = field(default_factory=list)
    confirmation: ConfirmationPolicy | None = None
    lanes: dict[int, LaneHandler] = field(default_factory=dict)
    skills: dict[str, StoredSkill] = field(default_factory=dict)
    client_tools: dict[str, ClientToolSpec] = field(default_factory=dict)
    # The session's own compaction "threshold" and "target" (each absent: the server's).
    compaction: dict[str, float] = field(default_factory=dict)
    # The session's own cap on its total tokens (None: the server's; 0: no cap).
    token_budget: int | None = None
    # The session's own MCP servers, in their JSON form (tools/mcp/config.py; runtime/mcp.py).
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The session's todo list (core/sessions/todos.py), in order.
    todos: list[Todo] = field(default_factory=list)
    # The session's plan, its latest CreatePlan's (core/sessions/plans.py), its steps in the todo list.
    plan: Plan | None = None
    # What the session's model gets of memories (None: the server's --memory).
    memory: MemorySettings | None = None

    @property
    def permission_policy(self) -> PermissionPolicy:
        return self.permissions if self.permissions is not None else PermissionPolicy()

    @property
    def confirmation_policy(self) -> ConfirmationPolicy:
        return self.confirmation if self.confirmation is not None else ConfirmationPolicy()

    def to_json(self) -> dict[str, Any]:
        """The stored shape: a key per setting that is set."""
        data: dict[str, Any] = {}
        if self.permissions is not None:
            data["permissions"] = self.permissions.to_dict()
        if self.skill_rules:
            data["skill_rules"] = list(self.skill_rules)
        if self.confirmation is not None:
            data["confirmation"] = asdict(self.confirmation)
        if self.lanes:
            data["lanes"] = {
                str(lane): {"mode": int(handler.mode), "timeout_ms": handler.timeout_ms}
                for lane, handler in self.lanes.items()
            }
        if self.skills:
            data["skills"] = {name: asdict(skill) for name, skill in self.skills.items()}
        if self.client_tools:
            data["client_tools"] = {name: asdict(spec) for name, spec in self.client_tools.items()}
        if self.compaction:
            data["compaction"] = dict(self.compaction)
        if self.token_budget is not None:
            data["token_budget"] = self.token_budget
        servers, _ = storable(self.mcp_servers)  # those holding credentials live only in memory
        if servers:
            data["mcp_servers"] = servers
        if self.todos:
            data["todos"] = [item.to_json() for item in self.todos]
        if self.plan is not None:
            data["plan"] = self.plan.to_json()
        if self.memory is not None:
            data["memory"] = asdict(self.memory)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionSettings:
        permissions = data.get("permissions")
        confirmation = data.get("confirmation")
        return cls(
            permissions=PermissionPolicy.from_dict(permissions) if permissions else None,
            skill_rules=list(data.get("skill_rules", [])),
            confirmation=ConfirmationPolicy(**confirmation) if confirmation else None,
            lanes={
                int(lane): LaneHandler(HandlerMode(stored["mode"]), stored["timeout_ms"])
                for lane, stored in data.get("lanes", {}).items()
            },
            skills={name: StoredSkill(**stored) for name, stored in data.get("skills", {}).items()},
            client_tools={
                name: ClientToolSpec(**spec) for name, spec in data.get("client_tools", {}).items()
            },
            compaction={key: float(value) for key, value in (data.get("compaction") or {}).items()},
            token_budget=data.get("token_budget"),
            mcp_servers=dict(data.get("mcp_servers", {})),
            todos=[Todo.from_json(item) for item in data.get("todos", [])],
            plan=Plan.from_json(data["plan"]) if "plan" in data else None,
            memory=MemorySettings(**data["memory"]) if "memory" in data else None,
        )


@dataclass(frozen=True)
class ParentLink:
    """What makes a session a subagent's (a child): the session whose model started it, the tool
    call that did, and the agent it runs (core/agents/)."""

    session_id: str
    tool_call_id: str
    agent: str


@dataclass
class Session:
    id: str
    config: SessionConfig
    state: SessionState = SessionState.ACTIVE
    created_at: int = 0
    updated_at: int = 0
    message_count: int = 0
    usage: Usage = field(default_factory=Usage)
    # What the session keeps besides its config: policies, lane handlers, skills, client tools.
    settings: SessionSettings = field(default_factory=SessionSettings)
    parent: ParentLink | None = None  # set for a subagent's session, never changed
