"""A `task` tool call's subagent as the editor sees it: the call's content, updated from the
parent's `subagent_start` / `subagent_progress` notices while the child works, lists the child's
steps (the last MAX_STEPS_SHOWN), and ends with the child's answer; a call of the child that needs
confirmation is a tool call of its own (`<child session>/<its call id>`, titled with the agent),
about which the editor is asked as about the parent's."""

from __future__ import annotations

from dataclasses import dataclass, field

from acp.schema import ContentToolCallContent

from .describe import output_content

MAX_STEPS_SHOWN = 20


def child_call_id(child_session_id: str, tool_id: str) -> str:
    """The editor's id of the child's call `tool_id` (a child's call ids may repeat the parent's)."""
    return f"{child_session_id}/{tool_id}"


def notice_call_id(data: dict[str, str]) -> str:
    """The editor's id of the call an event of the parent's log is about: its `tool_id`, a
    child's when the event names the child (`child_session_id`)."""
    child, tool_id = data.get("child_session_id", ""), data.get("tool_id", "")
    return child_call_id(child, tool_id) if child else tool_id


@dataclass
class ChildSteps:
    """What a `task` call's child did so far, as the call's content shows it."""

    agent: str = ""
    session_id: str = ""
    steps: dict[str, tuple[str, str]] = field(default_factory=dict)  # its call id: (tool, state)

    def noted(self, data: dict[str, str]) -> None:
        """Take one `subagent_*` notice's news."""
        self.agent = data.get("agent", self.agent)
        self.session_id = data.get("child_session_id", self.session_id)
        if data.get("type") != "subagent_progress":
            return
        tool_id, tool = data.get("child_tool_id", ""), data.get("tool_name", "")
        if data.get("step") == "tool_call":
            self.steps[tool_id] = (tool, "running")
        else:
            self.steps[tool_id] = (tool, "done" if data.get("tool_success") == "true" else "failed")

    def content(self) -> ContentToolCallContent:
        lines = [f"{self.agent} subagent (session {self.session_id})"]
        shown = list(self.steps.values())
        if len(shown) > MAX_STEPS_SHOWN:
            lines.append(f"… {len(shown) - MAX_STEPS_SHOWN} earlier steps")
            shown = shown[-MAX_STEPS_SHOWN:]
        lines.extend(f"- {tool}: {state}" for tool, state in shown)
        return output_content("\n".join(lines))
