"""A run's log entries as the A3S harness protocol's events (type and payload), bounded in size.

One generation chunk of the run (core/loop/chunks.py) is one event: text → `text_delta`, thinking →
`reasoning_delta`, a tool call → `tool_execution_start`, its result → `tool_end`, a model turn →
`turn_end`, the result → `agent_end`, the entry that ends a run without one → `error`, a notice →
`notice` (the protocol's event types are an open set). `agent_start` and `turn_start` are made
from the run itself, and the run puts `turn_end` after the turn's tools (harness_runs.py).

A subagent's notices (runtime/subagents.py) are the protocol's own subagent events: `subagent_start`
{task_id: the `task` call, session_id: the child's session, parent_session_id, agent, description,
started_ms}, a `subagent_progress` per tool call and result of the child {task_id, session_id,
status: `tool_execution_start` or `tool_end`, metadata: {id, name, and for a result success}}, and
`subagent_end` {task_id, session_id, agent, output: the child's answer as the parent's model got
it, success, finished_ms}, which the run puts right before the `task` call's `tool_end`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..base.jsontext import model_json
from ..core.loop.agent import (
    AgentEvent,
    DoneEvent,
    NoticeEvent,
    TextEvent,
    ThinkingEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from ..core.loop.steering import STEER_APPLIED

SUBAGENT_END = "subagent_end"
MAX_PAYLOAD_BYTES = 64 * 1024 - 1024  # the record's 64 KiB, less its envelope and metadata
TRUNCATED = "\n…[a3s.code.agent-protocol.truncated]"
_MAX_PASSES = 128
_KEPT_KEYS = ("id", "name", "exit_code", "tool_id", "tool_name", "turn")
_SKIPPED = {
    "status": "skipped",
    "report_count": 0,
    "required_check_count": 0,
    "pending_required_check_count": 0,
    "failed_check_count": 0,
    "residual_risk_count": 0,
}


_EVENT_KINDS: dict[type[AgentEvent], str] = {
    TextEvent: "text",
    ThinkingEvent: "thinking",
    ToolCallEvent: "tool_call",
    ToolResultEvent: "tool_result",
    TurnEvent: "turn",
    NoticeEvent: "notice",
    DoneEvent: "done",
}


def entry_kind(body: dict[str, Any]) -> str:
    """What a chunk entry's body records: "failed" (the entry that ends a run without a result),
    SUBAGENT_END (a subagent's end notice), else its chunk's one key ("text", "tool_call",
    "tool_result", "turn", "done"...)."""
    if "failed" in body:
        return "failed"
    if body["chunk"].get("notice", {}).get("type") == SUBAGENT_END:
        return SUBAGENT_END
    return str(next(iter(body["chunk"])))


def entry_call(body: dict[str, Any]) -> str:
    """The call a chunk entry is about: a tool result's, a subagent notice's `task` call."""
    chunk = body.get("chunk", {})
    if "tool_result" in chunk:
        return str(chunk["tool_result"]["call"]["id"])
    return str(chunk.get("notice", {}).get("tool_id", ""))


def event_kind(event: AgentEvent) -> str:
    """The `entry_kind` of the chunk entry that records `event`."""
    if isinstance(event, NoticeEvent) and event.data.get("type") == SUBAGENT_END:
        return SUBAGENT_END
    return _EVENT_KINDS[type(event)]


def event_call(event: AgentEvent) -> str:
    """The `entry_call` of the chunk entry that records `event`."""
    if isinstance(event, ToolResultEvent):
        return event.call.id
    return str(event.data.get("tool_id", "")) if isinstance(event, NoticeEvent) else ""


def token_usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cache_read_tokens": usage.get("cache_read_tokens"),
        "cache_write_tokens": usage.get("cache_write_tokens"),
    }


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = model_json(text)
    except ValueError:
        return {"raw": text}
    return value if isinstance(value, dict) else {"raw": text}


def chunk_event(
    body: dict[str, Any], session_id: str = "", at_ms: int = 0, answer: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The event (type, payload) of a chunk entry's body, written at `at_ms` in the log of
    `session_id`; `answer`: a subagent_end's, the body of its task call's result."""
    if "failed" in body:
        return "error", {"message": body["failed"]["message"]}
    chunk = body["chunk"]
    if "text" in chunk:
        return "text_delta", {"text": chunk["text"]}
    if "thinking" in chunk:
        return "reasoning_delta", {"text": chunk["thinking"]}
    if "tool_call" in chunk:
        call = chunk["tool_call"]
        return "tool_execution_start", {
            "id": call["id"],
            "name": call["name"],
            "args": _arguments(call["arguments"]),
        }
    if "tool_result" in chunk:
        call, output = chunk["tool_result"]["call"], chunk["tool_result"]["output"]
        exit_code = output["metadata"].get("exit_code")
        return "tool_end", {
            "id": call["id"],
            "name": call["name"],
            "output": _output(output),
            "exit_code": exit_code if isinstance(exit_code, int) else (0 if output["success"] else 1),
        }
    if "turn" in chunk:
        turn = chunk["turn"]
        return "turn_end", {"turn": turn["turn"], "usage": token_usage(turn["usage"])}
    if "notice" in chunk:
        return _notice(chunk["notice"], session_id, at_ms, answer)
    done = chunk["done"]
    return "agent_end", {
        "text": done["message"]["content"],
        "usage": token_usage(done["usage"]),
        "verification_summary": dict(_SKIPPED),
    }


def _output(output: dict[str, Any]) -> str:
    return str(output["output"] if output["success"] else output["error"] or output["output"])


def _notice(
    notice: dict[str, str], session_id: str, at_ms: int, answer: dict[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    kind = notice.get("type", "")
    about = {"task_id": notice.get("tool_id", ""), "session_id": notice.get("child_session_id", "")}
    if kind == "subagent_start":
        return kind, {**about, "parent_session_id": session_id, "agent": notice.get("agent", ""),
                      "description": notice.get("description", ""), "started_ms": at_ms}  # fmt: skip
    if kind == "subagent_progress":
        result = notice.get("step") == "tool_result"
        step = {"id": notice.get("child_tool_id", ""), "name": notice.get("tool_name", "")}
        return kind, {**about, "status": "tool_end" if result else "tool_execution_start",
                      "metadata": {**step, **({"success": notice.get("tool_success") == "true"} if result else {})}}  # fmt: skip
    if kind == SUBAGENT_END:
        result = (answer or {}).get("chunk", {}).get("tool_result")
        return kind, {**about, "agent": notice.get("agent", ""),
                      "output": _output(result["output"]) if result else notice.get("error", ""),
                      "success": notice.get("success") == "true", "finished_ms": at_ms}  # fmt: skip
    if kind == STEER_APPLIED:
        return "run_control_applied", {"request_id": notice.get("steer_id", ""), "operation": "steer",
                                       "turn_id": None, "turn_revision": 0, "input": notice.get("content", "")}  # fmt: skip
    return "notice", dict(notice)


def _size(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _longest_string(value: Any, path: tuple[Any, ...] = ()) -> tuple[int, tuple[Any, ...]]:
    if isinstance(value, str):
        return len(value), path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    best: tuple[int, tuple[Any, ...]] = (-1, ())
    for key, item in items:
        best = max(best, _longest_string(item, (*path, key)), key=lambda found: found[0])
    return best


def bounded(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` within MAX_PAYLOAD_BYTES: its longest string halved (with the marker) until it
    fits, or a stub naming the original's digest."""
    if _size(payload) <= MAX_PAYLOAD_BYTES:
        return payload
    shrunk = json.loads(json.dumps(payload))
    for _ in range(_MAX_PASSES):
        length, path = _longest_string(shrunk)
        if length <= len(TRUNCATED) or not path:
            break
        holder = shrunk
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = holder[path[-1]][: length // 2] + TRUNCATED
        if _size(shrunk) <= MAX_PAYLOAD_BYTES:
            return dict(shrunk)
    digest = hashlib.sha256(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())
    stub: dict[str, Any] = {
        "bounded": True,
        "reason": "agent_protocol_event_payload_limit",
        "original_payload_sha256": f"sha256:{digest.hexdigest()}",
    }
    stub.update({k: payload[k] for k in _KEPT_KEYS if k in payload and _size(payload[k]) <= 512})
    return stub
