"""A scripted Anthropic Messages API server for tests and benchmarks.

It speaks the real wire format on 127.0.0.1: ``POST /v1/messages`` with ``x-api-key`` and
``anthropic-version``, answered with the Messages API's server-sent events (``event:`` and ``data:``
lines: message_start, ping, content_block_start/delta/stop, message_delta, message_stop; ``error``
events mid-stream), so the real ``anthropic`` client can talk to it. Each request consumes the next
scripted turn (the same turn helpers as fake_llm.py: ``text``, ``tool_call``, ``tool_calls``, ``error``,
``broken_stream``; plus ``overloaded`` and ``midway_error``); every request is recorded.
A reply is written at once, or an event at a time ``chunk_delay`` apart (a ``Reply`` field).

It is strict where the real API is: it refuses (HTTP 400 with the API's message, consuming no turn)
a request without ``anthropic-version``, ``system`` as a message role, blank text blocks, unknown
fields in a block (a client's private state leaking onto the wire), ``tool_use`` ids not answered
by ``tool_result`` blocks in the next message, ``tool_result`` blocks answering no call, more than
four ``cache_control`` breakpoints, malformed images; and with thinking on: a budget below 1024 or
not below max_tokens, a temperature other than 1, a tool-use turn sent back without its thinking
block first, and a thinking block whose signature is missing or not the one it was given with.
A wrong key (in ``x-api-key`` or as a bearer token) is 401 ``authentication_error``.

With thinking on (``"thinking": {"type": "enabled", ...}``) every reply streams a signed thinking
block first (and a redacted_thinking block too when ``redacted``). Usage simulates prompt caching:
the prefix up to each ``cache_control`` breakpoint is written to the cache, and a later request
whose prefix up to a breakpoint was written reads it (``cache_read_input_tokens``); tokens are
characters // 4 of the JSON.

Subprocess use (benchmarks)::

    python -m a3s_agent.testing.fake_anthropic --port 0 --tool-rounds 2
    # prints "FAKE_ANTHROPIC_READY http://127.0.0.1:<port>" once listening
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import hashlib
import itertools
import json
import re
import signal
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from a3s_agent.testing.fake_llm import (
    Error,
    Hang,
    Raw,
    RecordedRequest,
    Reply,
    TurnLike,
    broken_stream,
    call,
    delayed,
    error,
    text,
    tool_call,
    tool_calls,
)

__all__ = [
    "READY_PREFIX",
    "Error",
    "FakeAnthropic",
    "Midway",
    "RecordedRequest",
    "Reply",
    "broken_stream",
    "call",
    "delayed",
    "error",
    "midway_error",
    "overloaded",
    "text",
    "tool_call",
    "tool_calls",
    "tool_loop",
]

READY_PREFIX = "FAKE_ANTHROPIC_READY"
MAX_BREAKPOINTS = 4
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_BLOCK_FIELDS = {
    "text": {"type", "text", "cache_control", "citations"},
    "image": {"type", "source", "cache_control"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}
_ROLE_BLOCKS = {
    "user": {"text", "image", "tool_result"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_THINKING_FIRST = (
    "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. When "
    "`thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the "
    "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from "
    "previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def sse_frames(events: list[dict[str, Any]]) -> list[bytes]:
    """The Messages API's stream framing: each event as `event: <type>` and its JSON `data:`."""
    return [f"event: {event['type']}\ndata: {_dumps(event)}\n\n".encode() for event in events]


def overloaded(*, in_stream: bool = False, retry_after: float | None = None) -> Error:
    """HTTP 529 ``overloaded_error`` (or the same as an ``error`` event after message_start)."""
    return error(529, "Overloaded", type="overloaded_error", in_stream=in_stream, retry_after=retry_after)


@dataclass(frozen=True)
class Midway:
    """Some text streamed, then an ``error`` event: a failure after part of the reply was out."""

    text: str
    error: Error


def midway_error(text: str, failure: Error) -> Midway:
    return Midway(text, failure)


def tool_loop(
    rounds: int = 2, name: str = "read_file", arguments: dict[str, Any] | None = None, final: str = "Done."
) -> Callable[[dict[str, Any]], Reply]:
    """A stateless turn: ``rounds`` tool calls, then ``final`` text, per user prompt (the round is the
    number of tool results since the last user message that was not only tool results)."""
    args = {"path": "README.md"} if arguments is None else arguments

    def play(body: dict[str, Any]) -> Reply:
        done = 0
        for message in reversed(body.get("messages") or []):
            if message.get("role") != "user":
                continue
            results = [b for b in _blocks(message) if b.get("type") == "tool_result"]
            if not results:
                break
            done += len(results)
        return text(final) if done >= rounds else tool_call(name, args)

    return play


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content or () if isinstance(block, dict)]


def _strip_cache(value: Any) -> Any:
    return {k: v for k, v in value.items() if k != "cache_control"} if isinstance(value, dict) else value


def _segments(body: dict[str, Any]) -> Iterator[Any]:
    """The prompt in the order the cache reads it: tools, system, then each message's blocks."""
    yield from body.get("tools") or ()
    system = body.get("system")
    yield from [{"type": "text", "text": system}] if isinstance(system, str) else system or ()
    for index, message in enumerate(body["messages"]):
        for block in _blocks(message):
            yield {**block, "_at": [index, message.get("role")]}


class FakeAnthropic:
    """The fake server. Script turns with :meth:`script`, read :attr:`requests` and :attr:`usages`."""

    def __init__(
        self,
        *turns: TurnLike | Midway,
        fallback: TurnLike | None = None,
        api_key: str | None = None,
        redacted: bool = False,
        text_chunk: int = 8,
        args_chunk: int = 5,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._turns: deque[TurnLike | Midway] = deque(turns)
        self.fallback = fallback
        self.api_key = api_key
        self.redacted = redacted
        self.text_chunk = text_chunk
        self.args_chunk = args_chunk
        self.host = host
        self.port = port
        self.requests: list[RecordedRequest] = []
        """Every request to the messages endpoint, refused ones included, in arrival order."""
        self.usages: list[dict[str, int]] = []
        """The usage reported with each reply played: the API's fields, and `prompt_tokens` (input,
        cache reads and writes) and `completion_tokens` as a client in OpenAI's convention adds them."""
        self.refusals: list[str] = []
        """The message of each request refused as the real API would."""
        self._cache: set[str] = set()
        self._signatures: dict[str, str] = {}  # signature -> the thinking it signs
        self._redactions: set[str] = set()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None

    def script(self, *turns: TurnLike | Midway) -> FakeAnthropic:
        self._turns.extend(turns)
        return self

    @property
    def base_url(self) -> str:
        """``http://host:port``: the API's root, as A3S Code configs and the ``anthropic`` client take it."""
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> FakeAnthropic:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        self._closing = asyncio.Event()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, backlog=4096).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None and self._closing is not None
        self._closing.set()
        await self._runner.cleanup()

    # -- the endpoint ---------------------------------------------------------------------------

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(
            RecordedRequest(request.method, request.path, headers, body if isinstance(body, dict) else {})
        )
        # The key in x-api-key, or as a bearer token (what the `anthropic` package sends since 2026).
        given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and given != self.api_key:
            return self._refuse(401, "invalid x-api-key")
        if not headers.get("anthropic-version"):
            return self._refuse(400, "anthropic-version: header is required")
        if not isinstance(body, dict):
            return self._refuse(400, "There was an error parsing the body of your request.")
        problem = self._problem(body)
        if problem:
            return self._refuse(400, problem)
        turn = self._next_turn(body)
        if isinstance(turn, Hang):
            await self._wait(turn.seconds)
            return self._error_response(error(504, "fake hang elapsed", should_retry=False))
        await self._wait(turn.delay if isinstance(turn, Reply | Error) else 0)
        if isinstance(turn, Error) and not turn.in_stream:
            return self._error_response(turn)
        if isinstance(turn, Raw):
            return web.Response(
                status=turn.status, body=turn.body, headers={"Content-Type": turn.content_type}
            )
        return await self._stream(request, body, turn)

    def _next_turn(self, body: dict[str, Any]) -> Reply | Error | Hang | Raw | Midway:
        turn: Any = self._turns.popleft() if self._turns else self.fallback
        if turn is None:
            return error(500, "fake Anthropic script exhausted", should_retry=False)
        while callable(turn):
            turn = turn(body)
        return text(turn) if isinstance(turn, str) else turn

    async def _wait(self, seconds: float) -> None:
        if seconds > 0:
            assert self._closing is not None
            try:
                await asyncio.wait_for(self._closing.wait(), seconds)
            except TimeoutError:
                pass

    def _refuse(self, status: int, message: str) -> web.Response:
        self.refusals.append(message)
        return self._error_response(error(status, message))

    def _error_response(self, err: Error) -> web.Response:
        return web.Response(
            status=err.status,
            text=_dumps(self._error_body(err)),
            content_type="application/json",
            headers={"request-id": f"req_{next(self._ids)}", **err.headers},
        )

    def _error_body(self, err: Error) -> dict[str, Any]:
        # An Anthropic type named in the turn, else the status's (fake_llm's `error` fills in OpenAI's).
        named = err.type in _ERROR_TYPES.values() and err.type != "invalid_request_error"
        kind = err.type if named else _ERROR_TYPES.get(err.status, "api_error")
        return {
            "type": "error",
            "error": {"type": kind, "message": err.message},
            "request_id": f"req_{next(self._ids)}",
        }

    # -- what the real API refuses --------------------------------------------------------------

    def _problem(self, body: dict[str, Any]) -> str | None:
        if not isinstance(body.get("model"), str):
            return "model: Field required"
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
            return "max_tokens: Field required"
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: Field required"
        return (
            self._thinking_problem(body)
            or _cache_problem(body)
            or _tools_problem(body.get("tools") or [])
            or self._messages_problem(messages)
            or _pairing_problem(messages)
            or (self._thinking_first(messages) if _thinking_on(body) else None)
        )

    def _thinking_problem(self, body: dict[str, Any]) -> str | None:
        if not _thinking_on(body):
            return None
        budget = body["thinking"].get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if budget >= body["max_tokens"]:
            return (
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation"
            )
        if body.get("temperature", 1) != 1:
            return "`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation"
        return None

    def _messages_problem(self, messages: list[Any]) -> str | None:
        if messages[0].get("role") != "user":
            return 'messages: first message must use the "user" role'
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in _ROLE_BLOCKS:
                return (
                    f'messages.{i}.role: Unexpected role "{role}". The Messages API accepts a top-level '
                    '`system` parameter, not "system" as an input message role.'
                    if role == "system"
                    else f"messages.{i}.role: Input should be 'user' or 'assistant'"
                )
            content = message.get("content")
            if not content:
                return f"messages.{i}: all messages must have non-empty content except for the optional final assistant message"
            for j, block in enumerate(_blocks(message)):
                problem = self._block_problem(role, block, f"messages.{i}.content.{j}")
                if problem:
                    return problem
        return None

    def _block_problem(self, role: str, block: dict[str, Any], where: str) -> str | None:
        kind = block.get("type")
        if kind not in _ROLE_BLOCKS[role]:
            return f"{where}.type: Input tag '{kind}' found using 'type' does not match any of the expected tags for role {role}"
        extra = sorted(set(block) - _BLOCK_FIELDS[kind])
        if extra:
            return f"{where}.{kind}.{extra[0]}: Extra inputs are not permitted"
        if kind == "text" and not (block.get("text") or "").strip():
            return "messages: text content blocks must contain non-whitespace text"
        if kind == "image":
            return _image_problem(block.get("source") or {}, where)
        if kind == "tool_use" and not isinstance(block.get("input"), dict):
            return f"{where}.tool_use.input: Input should be a valid dictionary"
        if kind == "tool_result":
            return self._result_problem(block, where)
        if kind == "thinking":
            if not block.get("signature"):
                return f"{where}.thinking.signature: Field required"
            if self._signatures.get(block["signature"]) != block.get("thinking"):
                return f"{where}: Invalid `signature` in `thinking` block"
        if kind == "redacted_thinking" and block.get("data") not in self._redactions:
            return f"{where}: Invalid `data` in `redacted_thinking` block"
        return None

    def _result_problem(self, block: dict[str, Any], where: str) -> str | None:
        if "is_error" in block and not isinstance(block["is_error"], bool):
            return f"{where}.tool_result.is_error: Input should be a valid boolean"
        content = block.get("content", "")
        if isinstance(content, str):
            return None
        for k, part in enumerate(content if isinstance(content, list) else [None]):
            if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
                return f"{where}.tool_result.content.{k}: Input should be a text or image block"
            problem = self._block_problem("user", part, f"{where}.tool_result.content.{k}")
            if problem:
                return problem
        return None

    def _thinking_first(self, messages: list[dict[str, Any]]) -> str | None:
        """In a tool-use loop (the last message only tool results), the last assistant turn must
        start with its thinking."""
        last = _blocks(messages[-1])
        if not last or any(block.get("type") != "tool_result" for block in last):
            return None
        i = len(messages) - 2
        if i < 0:
            return None
        first = _blocks(messages[i])[0].get("type")
        if first not in ("thinking", "redacted_thinking"):
            return _THINKING_FIRST.format(i=i, found=first)
        return None

    # -- the streamed reply ---------------------------------------------------------------------

    async def _stream(
        self, request: web.Request, body: dict[str, Any], turn: Reply | Error | Midway
    ) -> web.StreamResponse:
        number = next(self._ids)
        usage = self._prompt_usage(body)
        events: list[dict[str, Any]] = [
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{number:024d}",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
            {"type": "ping"},
        ]
        if isinstance(turn, Error):
            events.append(self._error_body(turn))
        elif isinstance(turn, Midway):
            events += _block(0, {"type": "text", "text": ""}, [{"type": "text_delta", "text": turn.text}])[:2]
            events.append(self._error_body(turn.error))
        else:
            events += self._reply_events(body, turn, number, usage)
        frames = sse_frames(events)
        if isinstance(turn, Reply) and turn.break_after is not None:
            frames = frames[: turn.break_after]
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            if isinstance(turn, Reply) and turn.chunk_delay > 0:  # each event a write of its own
                for frame in frames:
                    await response.write(frame)
                    await self._wait(turn.chunk_delay)
            else:
                await response.write(b"".join(frames))
        except ConnectionError:
            return response
        if isinstance(turn, Reply) and turn.break_after is not None:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    def _reply_events(
        self, body: dict[str, Any], reply: Reply, number: int, usage: dict[str, int]
    ) -> list[dict[str, Any]]:
        blocks: list[list[dict[str, Any]]] = []
        thinking = ""
        if _thinking_on(body):
            thinking = f"The user wants reply {number}; let me think it through step by step."
            signature = base64.b64encode(hashlib.sha256(thinking.encode()).digest() * 3).decode()
            self._signatures[signature] = thinking
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(thinking, self.text_chunk)]
            deltas.append({"type": "signature_delta", "signature": signature})
            blocks.append(_block(len(blocks), {"type": "thinking", "thinking": "", "signature": ""}, deltas))
            if self.redacted:
                data = base64.b64encode(f"redacted-{number}".encode() * 4).decode()
                self._redactions.add(data)
                blocks.append(_block(len(blocks), {"type": "redacted_thinking", "data": data}, []))
        if reply.content:
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(reply.content, self.text_chunk)]
            blocks.append(_block(len(blocks), {"type": "text", "text": ""}, deltas))
        for i, tc in enumerate(reply.tool_calls):
            head = {
                "type": "tool_use",
                "id": tc.id or f"toolu_{number:02d}{i:02d}",
                "name": tc.name,
                "input": {},
            }
            pieces = ["", *_pieces(tc.arguments_json(), self.args_chunk)]
            blocks.append(
                _block(len(blocks), head, [{"type": "input_json_delta", "partial_json": p} for p in pieces])
            )
        output = (
            len(reply.content or "")
            + len(thinking)
            + sum(len(c.name) + len(c.arguments_json()) for c in reply.tool_calls)
        ) // 4
        output = max(1, output)
        delta_usage: dict[str, Any] = {"output_tokens": output}
        if thinking:
            delta_usage["output_tokens_details"] = {"thinking_tokens": len(thinking) // 4}
        self.usages.append(
            {
                **usage,
                "output_tokens": output,
                "thinking_tokens": len(thinking) // 4,
                "prompt_tokens": sum(usage.values()),
                "completion_tokens": output,
            }
        )
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        stop = {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP_REASONS.get(finish, finish), "stop_sequence": None},
            "usage": delta_usage,
        }
        return [*(event for events in blocks for event in events), stop, {"type": "message_stop"}]

    def _prompt_usage(self, body: dict[str, Any]) -> dict[str, int]:
        """input_tokens, cache_creation_input_tokens and cache_read_input_tokens of a request, with
        a prefix cache keyed by the content up to each breakpoint."""
        running = hashlib.sha256(body["model"].encode())
        total = read = written_to = 0
        written: list[str] = []
        for segment in _segments(body):
            marked = isinstance(segment, dict) and "cache_control" in segment
            piece = _dumps(_strip_cache(segment))
            running.update(piece.encode())
            total += max(1, len(piece) // 4)
            if marked:
                key = running.hexdigest()
                if key in self._cache:
                    read = total
                written.append(key)
                written_to = total
        self._cache.update(written)
        creation = max(0, written_to - read)
        return {
            "input_tokens": max(1, total - read - creation),
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
        }


def _thinking_on(body: dict[str, Any]) -> bool:
    return isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled"


def _cache_problem(body: dict[str, Any]) -> str | None:
    found = sum(1 for segment in _segments(body) if isinstance(segment, dict) and "cache_control" in segment)
    if found > MAX_BREAKPOINTS:
        return f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}."
    return None


def _tools_problem(tools: list[Any]) -> str | None:
    for i, tool in enumerate(tools):
        if not _TOOL_NAME.match(str(tool.get("name", ""))):
            return f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
        if (tool.get("input_schema") or {}).get("type") != "object":
            return f"tools.{i}.custom.input_schema.type: Input should be 'object'"
        extra = sorted(set(tool) - {"name", "description", "input_schema", "cache_control", "type"})
        if extra:
            return f"tools.{i}.custom.{extra[0]}: Extra inputs are not permitted"
    return None


def _image_problem(source: dict[str, Any], where: str) -> str | None:
    if source.get("type") == "url":
        return (
            None
            if str(source.get("url", "")).startswith(("http://", "https://"))
            else f"{where}.image.source.url: invalid URL"
        )
    if source.get("type") != "base64":
        return f"{where}.image.source: Input tag '{source.get('type')}' found using 'type' does not match any of the expected tags: 'base64', 'url'"
    if source.get("media_type") not in _IMAGE_TYPES:
        return f"{where}.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"
    try:
        base64.b64decode(source.get("data", ""), validate=True)
    except (binascii.Error, ValueError):
        return f"{where}.image.source.base64.data: The image data is not valid base64"
    return None


def _pairing_problem(messages: list[dict[str, Any]]) -> str | None:
    """Each tool_use answered by a tool_result in the very next message, and no tool_result answering nothing."""
    for i, message in enumerate(messages):
        uses = [b.get("id") for b in _blocks(message) if b.get("type") == "tool_use"]
        results = [b.get("tool_use_id") for b in _blocks(messages[i + 1])] if i + 1 < len(messages) else []
        unanswered = [use for use in uses if use not in results]
        if unanswered:
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(map(str, unanswered))}. Each `tool_use` block must have a corresponding "
                "`tool_result` block in the next message."
            )
        before = [b.get("id") for b in _blocks(messages[i - 1]) if b.get("type") == "tool_use"] if i else []
        for j, block in enumerate(_blocks(message)):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in before:
                return (
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message."
                )
    return None


def _block(index: int, head: dict[str, Any], deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": head},
        *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def _pieces(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


# --- command line -------------------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> None:
    fallback = (
        tool_loop(args.tool_rounds, args.tool_name, json.loads(args.tool_args), args.text)
        if args.tool_rounds > 0
        else text(args.text)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeAnthropic(fallback=fallback, api_key=args.api_key, host=args.host, port=args.port) as fake:
        print(f"{READY_PREFIX} {fake.base_url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A scripted Anthropic Messages API server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free one (see the READY line)")
    parser.add_argument("--text", default="Done.", help="the (final) text answer")
    parser.add_argument("--tool-rounds", type=int, default=0, help="tool calls per prompt before the text")
    parser.add_argument("--tool-name", default="read_file")
    parser.add_argument("--tool-args", default='{"path": "README.md"}')
    parser.add_argument("--api-key", help="require this x-api-key")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
