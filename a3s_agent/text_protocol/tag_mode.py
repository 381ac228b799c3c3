"""Tag tool mode: the CodingAgent text protocol for models without function calling.

`TextToolProvider` wraps a provider. The model is shown no tool schemas but the protocol's
instructions, and answers with command blocks ([CREATE_FILE], [RUN_COMMAND]...). Each block
becomes a tool call the agent loop runs like any other (registry, permissions, confirmation,
events), and the results come back to the model as the protocol's "## Previous Command
Results" text. The relay provider (relay.py) reuses all of this with a person in the middle.
EDIT_FILE calls edit_lines, a built-in tool offered only to such models (tools/line_edits.py).

Nothing is remembered between requests: a reply's raw text is what the loop stores as the
assistant's content, so every request rebuilds the text conversation from the history,
parse errors and rejected paths included (they are found again by parsing the stored reply).

Tool mode is chosen per LLM config: a `+text` suffix on the provider name (`openai+text`)
selects tag mode, `+native` function calling, and a bare name the server default
(A3S_LLM_TOOL_MODE, itself "native" unless set).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..base.jsontext import model_json
from ..base.models import Usage
from ..llm.provider import CompletionRequest, Provider, ProviderEvent, TextDelta, ToolCallReady, TurnEnd
from ..tools.gitignore import walk_tree
from .commands import (
    RUN_COMMAND_TIMEOUT_SECONDS,
    Command,
    CreateFile,
    DeleteFile,
    Done,
    EditFile,
    Message,
    ParseError,
    ReadFile,
    RunCommand,
    check_path,
)
from .parser import parse_response
from .renderer import CONTINUATION_PROMPT, PROTOCOL_INSTRUCTIONS, CommandResult

Chat = dict[str, Any]  # one Chat Completions message


@dataclass(frozen=True)
class TurnScope:
    """Whose model turn a request is: the relay needs both, tag mode lists the workspace when known."""

    session_id: str = ""
    workspace: Path | None = None


def scope_of(request: CompletionRequest) -> TurnScope:
    """The request's session and workspace, as the agent loop sets them."""
    return TurnScope(request.session_id, Path(request.workspace) if request.workspace else None)


def workspace_files(workspace: Path, *, skip: Path | None = None) -> list[tuple[str, int]]:
    """The workspace's files as (path, bytes), as git sees them: hidden and ignored files left out,
    and nothing under `skip` (a relay directory kept inside the workspace)."""
    root = workspace.resolve()
    skipped = skip.resolve() if skip is not None else None
    entries = walk_tree(root, include_hidden=False, descend=lambda entry: entry.path != skipped)
    return [(entry.rel, entry.size()) for entry in entries if entry.kind == "file"]


# Replies to tool calls


@dataclass(frozen=True)
class ToolRequest:
    """A command as the tool call that carries it out."""

    name: str
    arguments: dict[str, Any]


Step = ToolRequest | CommandResult  # a CommandResult is a block refused before anything ran


@dataclass(frozen=True)
class ReplyPlan:
    """What a reply asks for, in order, with its MESSAGE texts and its DONE summary (None without DONE)."""

    steps: list[Step]
    messages: list[str]
    summary: str | None

    @property
    def calls(self) -> list[ToolRequest]:
        return [step for step in self.steps if isinstance(step, ToolRequest)]

    @property
    def refusals(self) -> list[CommandResult]:
        return [step for step in self.steps if isinstance(step, CommandResult)]


def _step(command: Command) -> Step:
    match command:
        case CreateFile(path, content):
            request = ToolRequest("write_file", {"path": path, "content": content})
        case EditFile(path, start_line, end_line, content):
            arguments = {"path": path, "start_line": start_line, "end_line": end_line, "content": content}
            request = ToolRequest("edit_lines", arguments)
        case DeleteFile(path):
            request = ToolRequest("delete_file", {"path": path})
        case ReadFile(path):
            request = ToolRequest("read_file", {"path": path})
        case RunCommand(command_line):
            timeout_ms = RUN_COMMAND_TIMEOUT_SECONDS * 1000
            return ToolRequest("bash", {"command": command_line, "timeout_ms": timeout_ms})
        case _:
            raise TypeError(f"not a tool command: {command!r}")
    rejection = check_path(path)
    return CommandResult(command.tag, False, f"{rejection}: {path}") if rejection else request


def plan_reply(text: str) -> ReplyPlan:
    """A reply's command blocks as tool requests; malformed blocks and rejected paths as failed results.

    The first DONE gives the summary; commands after it still run."""
    steps: list[Step] = []
    messages: list[str] = []
    summary: str | None = None
    for item in parse_response(text):
        match item:
            case ParseError():
                steps.append(CommandResult.from_parse_error(item))
            case Message(body):
                messages.append(body)
            case Done(body):
                summary = body if summary is None else summary
            case _:
                steps.append(_step(item))
    return ReplyPlan(steps, messages, summary)


def _answer(text: str, plan: ReplyPlan, finish_reason: str) -> tuple[str, str]:
    """The final answer and finish reason of a reply without tool calls.

    The DONE summary, else the MESSAGE texts, else the reply itself; a reply with refused
    blocks is kept whole, so that the next request can report them."""
    if plan.refusals:
        return text, finish_reason
    if plan.summary is not None:
        return plan.summary, "stop"
    return "\n\n".join(plan.messages) or text, finish_reason


def _answer_events(text: str, finish_reason: str, usage: Usage | None = None) -> list[ProviderEvent]:
    reason = "stop" if finish_reason == "tool_calls" else finish_reason  # native calls are not ours
    return [*([TextDelta(text)] if text else []), TurnEnd(reason, usage)]


def summary_events(summary: str) -> list[ProviderEvent]:
    """A turn that ends the run with `summary` as its answer."""
    return _answer_events(summary, "stop")


def reply_events(text: str, finish_reason: str = "stop", usage: Usage | None = None) -> list[ProviderEvent]:
    """The provider events of a whole text reply.

    With commands: the raw reply as text (the loop stores it, so it can be given back), one
    tool call per command, and finish "tool_calls". Without: the final answer."""
    plan = plan_reply(text)
    if not plan.calls:
        return _answer_events(*_answer(text, plan, finish_reason), usage)
    calls = [
        ToolCallReady(f"call_{uuid.uuid4().hex[:24]}", call.name, json.dumps(call.arguments))
        for call in plan.calls
    ]
    return [TextDelta(text), *calls, TurnEnd("tool_calls", usage)]


async def _collect_reply(events: AsyncIterator[ProviderEvent]) -> tuple[str, str, Usage | None]:
    """A streamed reply's whole text, finish reason and usage; native tool calls are dropped."""
    parts: list[str] = []
    finish_reason, usage = "stop", None
    async for event in events:
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, TurnEnd):
            finish_reason, usage = event.finish_reason, event.usage
    return "".join(parts), finish_reason, usage


# Tool results to protocol results


def content_text(content: Any) -> str:
    """A message's text: the string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _is_our_reply(plan: ReplyPlan, assistant: Chat) -> bool:
    """Whether the assistant message is a text reply whose commands became its tool calls."""
    return len(plan.calls) == len(assistant.get("tool_calls") or [])


def pending_summary(messages: list[Chat]) -> str | None:
    """The DONE summary of the last reply, when that reply also had commands whose results are in.

    The protocol stops after DONE, so the run then ends with the summary, without asking the model."""
    end = len(messages)
    while end and messages[end - 1].get("role") == "tool":
        end -= 1
    if end in (0, len(messages)) or messages[end - 1].get("role") != "assistant":
        return None
    assistant = messages[end - 1]
    plan = plan_reply(content_text(assistant.get("content")))
    return plan.summary if _is_our_reply(plan, assistant) else None


@dataclass(frozen=True)
class TurnOutcome:
    """How a reply's commands went, and the contents of the files it asked for with READ_FILE."""

    results: list[CommandResult]
    files: list[tuple[str, str]]


_LABELS = {
    "write_file": CreateFile.tag,
    "edit_lines": EditFile.tag,
    "delete_file": DeleteFile.tag,
    "read_file": ReadFile.tag,
    "bash": RunCommand.tag,
}
_FILE_TOOLS = {  # name: (verb for failures, message for success)
    "write_file": ("create", "Created '{path}'"),
    "edit_lines": ("edit", "Replaced lines {start}-{end} of '{path}'"),
    "delete_file": ("delete", "Deleted '{path}'"),
    "read_file": ("read", "Read '{path}'"),
}
_NUMBERED_LINE = re.compile(r" *[0-9]+\t(.*)")
_WHOLE_FILE_FOOTER = re.compile(r"\(lines 1-([0-9]+) of \1\)")


def _split_output(content: str) -> tuple[bool, str, str]:
    """(success, error, output) of a tool message, whose content starts "error: " on failure."""
    if content.startswith("error: "):
        error, _, output = content.removeprefix("error: ").partition("\n")
        return False, error, output
    return True, "", content


def _file_text(output: str) -> tuple[str, str]:
    """The file text in read_file's `cat -n` output, and its footer when not all of the file is shown."""
    text: list[str] = []
    notes: list[str] = []
    for line in output.split("\n"):
        numbered = _NUMBERED_LINE.fullmatch(line)
        if numbered and not notes:
            text.append(numbered.group(1))
        elif line and line != "(empty file)" and not _WHOLE_FILE_FOOTER.fullmatch(line):
            notes.append(line)
    return "".join(f"{line}\n" for line in text), " ".join(notes)


def _arguments(call: Chat) -> dict[str, Any]:
    try:
        arguments = model_json((call.get("function") or {}).get("arguments") or "{}")
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}


def _outcome(call: Chat, content: str | None) -> tuple[CommandResult, tuple[str, str] | None]:
    """The protocol result of one tool call, and (path, text) when it read a file."""
    name = (call.get("function") or {}).get("name", "")
    label = _LABELS.get(name, name.upper())
    if content is None:
        return CommandResult(label, False, "not run: the run stopped before this command"), None
    ok, error, output = _split_output(content)
    arguments = _arguments(call)
    path = arguments.get("path", "")
    if name == "bash":
        command = arguments.get("command", "")
        message = f"Ran '{command}' (exit code 0)" if ok else f"Ran '{command}': {error}"
        return CommandResult(label, ok, message, output), None
    if name not in _FILE_TOOLS:  # not a protocol command: native-mode history
        return CommandResult(label, ok, "succeeded" if ok else f"failed: {error}", output), None
    verb, done = _FILE_TOOLS[name]
    if not ok:
        return CommandResult(label, False, f"Could not {verb} '{path}': {error}", output), None
    message = done.format(path=path, start=arguments.get("start_line"), end=arguments.get("end_line"))
    if name != "read_file":
        return CommandResult(label, True, message), None
    text, note = _file_text(output)
    return CommandResult(label, True, message + (f" ({note})" if note else "")), (path, text)


def _tool_outputs(messages: list[Chat]) -> dict[str, str]:
    return {m["tool_call_id"]: content_text(m.get("content")) for m in messages if m.get("role") == "tool"}


def turn_outcome(assistant: Chat, outputs: Mapping[str, str]) -> TurnOutcome:
    """The results of one assistant turn, in the order of its reply; `outputs` are tool results by call id.

    A turn that is not a text reply of ours (native-mode history, calls a client ran) is
    reported call by call."""
    calls: list[Chat] = assistant.get("tool_calls") or []
    plan = plan_reply(content_text(assistant.get("content")))
    steps: list[Chat | CommandResult] = list(calls)
    if _is_our_reply(plan, assistant):
        pending = iter(calls)
        steps = [next(pending) if isinstance(step, ToolRequest) else step for step in plan.steps]
    results: list[CommandResult] = []
    files: list[tuple[str, str]] = []
    for step in steps:
        if isinstance(step, CommandResult):
            results.append(step)
            continue
        result, file = _outcome(step, outputs.get(step.get("id", "")))
        results.append(result)
        files.extend([file] if file is not None else [])
    return TurnOutcome(results, files)


def last_turn_outcome(messages: list[Chat]) -> TurnOutcome:
    """The outcome of the last assistant turn (nothing before the first one)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return turn_outcome(message, _tool_outputs(messages))
    return TurnOutcome([], [])


# The conversation as a model without function calling sees it


def _listing(files: list[tuple[str, int]]) -> str:
    lines = [f"  {path} ({size} bytes)" for path, size in files] or ["(empty workspace)"]
    return "\n".join(["## Workspace Files", *lines])


def _outcome_text(outcome: TurnOutcome) -> str:
    parts = ["\n".join(["## Previous Command Results", *(result.format() for result in outcome.results)])]
    if outcome.files:
        blocks = [f"--- {path} ---\n{text}--- end {path} ---" for path, text in outcome.files]
        parts.append("\n".join(["## Requested File Contents", *blocks]))
    return "\n\n".join(parts)


def _add_user(conversation: list[Chat], content: Any) -> None:
    """Append a user message, joined to a user message just before it (some chat templates
    insist that roles alternate)."""
    last = conversation[-1]
    if last["role"] == "user" and isinstance(last["content"], str) and isinstance(content, str):
        last["content"] += "\n\n" + content
    else:
        conversation.append({"role": "user", "content": content})


def text_messages(messages: list[Chat], files: list[tuple[str, int]] | None = None) -> list[Chat]:
    """The history in the protocol's terms: the instructions (and `files`, the workspace listing)
    in the system message, replies as plain assistant text, tool results as a results message."""
    system = [content_text(m.get("content")) for m in messages if m.get("role") == "system"]
    system += [PROTOCOL_INSTRUCTIONS, *([_listing(files)] if files is not None else [])]
    outputs = _tool_outputs(messages)
    conversation: list[Chat] = [{"role": "system", "content": "\n\n".join(system)}]
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            calls = ", ".join(c.get("function", {}).get("name", "") for c in message.get("tool_calls") or [])
            text = content_text(message.get("content")) or (f"(ran {calls})" if calls else "(no reply)")
            conversation.append({"role": "assistant", "content": text})
            outcome = turn_outcome(message, outputs)
            if outcome.results:
                _add_user(conversation, _outcome_text(outcome))
        elif role == "user":
            _add_user(conversation, message.get("content"))
    if messages and messages[-1].get("role") == "tool":
        _add_user(conversation, CONTINUATION_PROMPT)
    return conversation


class TextToolProvider:
    """Tag tool mode over `inner`: tool calls are written as CodingAgent command blocks.

    A request without tools (tools off, summaries) passes through unchanged. A reply is
    read whole before anything is emitted, since a block means something only once it
    is closed, and a run that ends with DONE must end with its summary as the answer.
    """

    def __init__(self, inner: Provider) -> None:
        self._inner = inner

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        if not request.tools:
            async for event in self._inner.stream(request):
                yield event
            return
        summary = pending_summary(request.messages)
        if summary is not None:
            for event in summary_events(summary):
                yield event
            return
        workspace = scope_of(request).workspace
        files = await asyncio.to_thread(workspace_files, workspace) if workspace is not None else None
        text_request = replace(request, messages=text_messages(request.messages, files), tools=[])
        for event in reply_events(*await _collect_reply(self._inner.stream(text_request))):
            yield event

    async def close(self) -> None:
        await self._inner.close()
