"""A scripted, OpenAI-compatible Chat Completions server for tests and benchmarks.

It speaks the real wire format (JSON and ``text/event-stream``) on 127.0.0.1 so the real
``openai`` client can talk to it. Each ``POST /v1/chat/completions`` consumes the next scripted
turn; every request is recorded.

Async use (pytest)::

    async with FakeLLM(tool_call("read_file", {"path": "a.txt"}), text("done")) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")
        ...
        assert fake.requests[1].messages[-1]["role"] == "tool"

Sync use (server on its own loop in a background thread)::

    with FakeLLM(fallback=text("ok")) as fake:
        ...

Subprocess use (benchmarks)::

    python tests/fake_llm.py --port 0 --delay-ms 200 --tool-rounds 2
    # prints "FAKE_LLM_READY http://127.0.0.1:<port>/v1" once listening
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = [
    "Error",
    "FakeLLM",
    "Hang",
    "Raw",
    "RecordedRequest",
    "Reply",
    "ToolCall",
    "Turn",
    "TurnLike",
    "broken_stream",
    "call",
    "delayed",
    "error",
    "hang",
    "text",
    "tool_call",
    "tool_calls",
    "tool_loop",
    "turn_from_json",
]

READY_PREFIX = "FAKE_LLM_READY"


@dataclass(frozen=True)
class ToolCall:
    """One function call in an assistant reply; raw-string ``arguments`` are sent verbatim."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        """The ``arguments`` string as it goes on the wire."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """A successful completion: text, tool calls, or both.

    ``finish_reason`` defaults to ``tool_calls`` when there are tool calls, else ``stop``.
    ``delay`` waits before the response starts; ``chunk_delay`` waits between streamed chunks.
    ``break_after`` cuts the connection after that many SSE events (or half the JSON body
    when not streaming), without ``[DONE]``.
    """

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    break_after: int | None = None


@dataclass(frozen=True)
class Error:
    """An HTTP error with an OpenAI-style ``{"error": {...}}`` body."""

    status: int
    message: str
    type: str
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass(frozen=True)
class Hang:
    """Send nothing for ``seconds`` (cut short when the server stops), then answer 504."""

    seconds: float = 3600.0


@dataclass(frozen=True)
class Raw:
    """These exact bytes as the response body, whatever they are (invalid UTF-8, broken framing)."""

    body: bytes
    content_type: str = "text/event-stream"
    status: int = 200
    delay: float = 0.0


Turn = Reply | Error | Hang | Raw | Callable[[dict[str, Any]], "TurnLike"]
"""A scripted turn; a callable gets the parsed request body and returns the turn to play."""
TurnLike = Turn | str
"""A turn, or a plain string meaning ``text(string)``."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request received on the completions endpoint."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names are lower-case."""
    body: dict[str, Any]
    """The parsed JSON body (``{}`` when it was not a JSON object)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's ``messages``."""
        return self.body.get("messages") or []

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The request's ``tools``, if any."""
        return self.body.get("tools")

    @property
    def model(self) -> str | None:
        """The requested model."""
        return self.body.get("model")

    @property
    def stream(self) -> bool:
        """Whether a streamed response was asked for."""
        return bool(self.body.get("stream"))

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header, e.g. ``"Bearer sk-test"``."""
        return self.headers.get("authorization")


# --- turn helpers -------------------------------------------------------------------------------


def text(content: str, *, finish_reason: str = "stop", delay: float = 0.0) -> Reply:
    """A plain text reply."""
    return Reply(content=content, finish_reason=finish_reason, delay=delay)


def call(name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None) -> ToolCall:
    """One tool call for :func:`tool_calls`; a string ``arguments`` is sent as-is (may be malformed)."""
    return ToolCall(name, {} if arguments is None else arguments, id)


def tool_call(
    name: str,
    arguments: Mapping[str, Any] | str | None = None,
    *,
    id: str | None = None,
    content: str | None = None,
    finish_reason: str | None = None,
    delay: float = 0.0,
) -> Reply:
    """A reply with a single tool call (optionally with text before it)."""
    return tool_calls(
        [call(name, arguments, id=id)], content=content, finish_reason=finish_reason, delay=delay
    )


def tool_calls(
    calls: Iterable[ToolCall | tuple[str, Mapping[str, Any] | str]],
    *,
    content: str | None = None,
    finish_reason: str | None = None,
    delay: float = 0.0,
) -> Reply:
    """A reply with several (parallel) tool calls, given as :class:`ToolCall` or ``(name, arguments)``."""
    parsed = tuple(c if isinstance(c, ToolCall) else call(*c) for c in calls)
    return Reply(content=content, tool_calls=parsed, finish_reason=finish_reason, delay=delay)


_ERROR_DEFAULTS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to access this resource.", "invalid_request_error", None),
    404: (
        "The model does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    429: ("Rate limit reached for requests.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def error(
    status: int,
    message: str | None = None,
    *,
    type: str | None = None,
    code: str | None = None,
    retry_after: float | None = None,
    retry_after_ms: float | None = None,
    should_retry: bool | None = None,
    headers: Mapping[str, str] | None = None,
    delay: float = 0.0,
) -> Error:
    """An HTTP error turn with realistic defaults per status.

    ``retry_after`` sets ``Retry-After`` (seconds, floats allowed), ``retry_after_ms`` sets
    ``retry-after-ms``, ``should_retry`` sets ``x-should-retry``. Note the openai client ignores
    a retry delay of 0 and falls back to its own backoff (~0.4-0.5 s); use e.g. 0.01 in tests.
    """
    default_message, default_type, default_code = _ERROR_DEFAULTS.get(
        status, (f"HTTP {status}", "server_error" if status >= 500 else "invalid_request_error", None)
    )
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["Retry-After"] = f"{retry_after:g}"
    if retry_after_ms is not None:
        all_headers["retry-after-ms"] = f"{retry_after_ms:g}"
    if should_retry is not None:
        all_headers["x-should-retry"] = "true" if should_retry else "false"
    return Error(
        status,
        message or default_message,
        type or default_type,
        code if code is not None else default_code,
        all_headers,
        delay,
    )


def hang(seconds: float = 3600.0) -> Hang:
    """A turn that never answers within any sane client timeout."""
    return Hang(seconds)


def broken_stream(
    reply: Reply | str = "This answer is cut off in the mid", *, after_chunks: int = 3
) -> Reply:
    """``reply`` with the connection dropped after ``after_chunks`` SSE events, before ``[DONE]``."""
    return replace(text(reply) if isinstance(reply, str) else reply, break_after=after_chunks)


def delayed(turn: Reply | Error | str, seconds: float) -> Reply | Error:
    """``turn`` answered only after ``seconds``."""
    return replace(text(turn) if isinstance(turn, str) else turn, delay=seconds)


def tool_loop(
    rounds: int = 2,
    name: str = "read_file",
    arguments: Mapping[str, Any] | str | None = None,
    final: str = "Done.",
) -> Callable[[dict[str, Any]], Reply]:
    """A stateless turn: ``rounds`` tool calls, then ``final`` text, per user prompt.

    The round is the number of ``tool`` messages after the last ``user`` message, so it works
    for any number of concurrent conversations without a shared script.
    """
    args = {"path": "README.md"} if arguments is None else arguments

    def play(body: dict[str, Any]) -> Reply:
        done = 0
        for message in reversed(body.get("messages") or []):
            role = message.get("role") if isinstance(message, dict) else None
            if role == "user":
                break
            done += role == "tool"
        return text(final) if done >= rounds else tool_call(name, args)

    return play


def turn_from_json(spec: Any) -> Reply | Error | Hang:
    """Build a turn from JSON (for ``--turns-file``).

    Forms: ``"text"``; ``{"content": str, "tool_calls": [{"name", "arguments", "id"}],
    "finish_reason": str, "delay": float, "break_after": int}``; ``{"error": status, "message",
    "type", "code", "retry_after", "retry_after_ms"}``; ``{"hang": seconds}``.
    """
    if isinstance(spec, str):
        return text(spec)
    if "error" in spec:
        return error(
            int(spec["error"]),
            spec.get("message"),
            type=spec.get("type"),
            code=spec.get("code"),
            retry_after=spec.get("retry_after"),
            retry_after_ms=spec.get("retry_after_ms"),
            delay=spec.get("delay", 0.0),
        )
    if "hang" in spec:
        return hang(float(spec["hang"]))
    return Reply(
        content=spec.get("content"),
        tool_calls=tuple(
            call(c["name"], c.get("arguments"), id=c.get("id")) for c in spec.get("tool_calls", ())
        ),
        finish_reason=spec.get("finish_reason"),
        delay=spec.get("delay", 0.0),
        break_after=spec.get("break_after"),
    )


# --- wire format --------------------------------------------------------------------------------


_dumps = json.JSONEncoder(separators=(",", ":")).encode
"""Compact JSON, with the encoder built once (``json.dumps`` with options builds one per call)."""


def _chars(value: Any) -> int:
    """Characters of text in a message ``content`` (string or list of parts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(p.get("text") or "") for p in value if isinstance(p, dict))
    return 0


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    """Deterministic token counts: characters // 4, at least 1."""
    prompt = 0
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            prompt += _chars(message.get("content"))
            for tc in message.get("tool_calls") or ():
                fn = (tc.get("function") or {}) if isinstance(tc, dict) else {}
                prompt += len(fn.get("name") or "") + len(fn.get("arguments") or "")
    completion = len(reply.content or "") + sum(
        len(c.name) + len(c.arguments_json()) for c in reply.tool_calls
    )
    prompt_tokens, completion_tokens = max(1, prompt // 4), max(1, completion // 4)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _message_problem(messages: list[Any]) -> str | None:
    """What the real API would reject in ``messages`` (roles, tool-call pairing), or None."""
    pending: set[Any] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            return f"Invalid value for 'messages[{i}].role': {role!r}."
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return (
                    f"Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    f"message with 'tool_calls' (messages[{i}].tool_call_id={message.get('tool_call_id')!r})."
                )
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            break
        if role == "assistant":
            pending = {tc.get("id") for tc in message.get("tool_calls") or () if isinstance(tc, dict)}
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {sorted(map(str, pending))}"
        )
    return None


def _pieces(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


class FakeLLM:
    """The fake server. Script turns with :meth:`script`, read :attr:`requests` afterwards.

    ``fallback`` is played once the script is exhausted; without one such a request gets a 500
    "script exhausted" error marked ``x-should-retry: false`` so the test fails loudly and fast.
    ``api_key``, if set, is enforced (401 otherwise). ``delay`` is added before every answer.
    Streams split text into ``text_chunk``-character deltas and tool-call arguments into
    ``args_chunk``-character deltas, round-robin across parallel calls when ``interleave``.
    ``strict`` rejects with 400, like the real API, messages with an unknown role, ``tool``
    messages not answering the preceding assistant ``tool_calls``, or unanswered tool calls.
    Rejected requests (401/400) are recorded but consume no turn.
    """

    def __init__(
        self,
        *turns: TurnLike,
        fallback: TurnLike | None = None,
        api_key: str | None = None,
        delay: float = 0.0,
        models: Iterable[str] = ("fake-model",),
        text_chunk: int = 8,
        args_chunk: int = 3,
        interleave: bool = True,
        strict: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._turns: deque[TurnLike] = deque(turns)
        self.fallback = fallback
        self.api_key = api_key
        self.delay = delay
        self.models = tuple(models)
        self.text_chunk = text_chunk
        self.args_chunk = args_chunk
        self.interleave = interleave
        self.strict = strict
        self.host = host
        self.port = port
        self.requests: list[RecordedRequest] = []
        """Every request to the completions endpoint, in arrival order."""
        self.errors: list[Exception] = []
        """Exceptions raised by callable turns (each also answered with a 500)."""
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- scripting ----------------------------------------------------------------------------

    def script(self, *turns: TurnLike) -> FakeLLM:
        """Append turns to the script; each completions request plays the next one."""
        self._turns.extend(turns)
        return self

    @property
    def remaining(self) -> int:
        """Scripted turns not played yet."""
        return len(self._turns)

    def reset(self) -> None:
        """Forget the remaining script, the recorded requests and errors."""
        self._turns.clear()
        self.requests.clear()
        self.errors.clear()

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, for ``openai.AsyncOpenAI(base_url=...)``."""
        if self._runner is None:
            raise RuntimeError("FakeLLM is not started")
        return f"http://{self.host}:{self.port}/v1"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> FakeLLM:
        """Listen on ``host:port`` (port 0 picks a free one, readable from :attr:`port`)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._completions)
            app.router.add_get(f"{prefix}/models", self._list_models)
        self._closing = asyncio.Event()
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=4096)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        """Stop listening; pending hangs and delays end at once."""
        if self._runner is None:
            return
        assert self._closing is not None
        self._closing.set()
        await self._runner.cleanup()
        self._runner = None

    async def __aenter__(self) -> FakeLLM:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> FakeLLM:
        """Run the server on its own event loop in a daemon thread (for sync callers)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fake-llm", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=10)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        self._loop, self._thread = loop, thread
        return self

    def stop_in_thread(self) -> None:
        """Stop a server started with :meth:`start_in_thread` and join its thread."""
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop_in_thread()

    # -- handlers -----------------------------------------------------------------------------

    async def _list_models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake-llm"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append(
            RecordedRequest(
                request.method,
                request.path,
                {k.lower(): v for k, v in request.headers.items()},
                body if isinstance(body, dict) else {},
            )
        )
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._error_response(error(401))
        if not isinstance(body, dict):
            return self._error_response(error(400, "We could not parse the JSON body of your request."))
        if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
            return self._error_response(error(400, "'model' (string) and 'messages' (array) are required."))
        problem = _message_problem(body["messages"]) if self.strict else None
        if problem:
            return self._error_response(error(400, problem))

        turn = self._next_turn(body)
        if isinstance(turn, Hang):
            await self._wait(turn.seconds)
            return self._error_response(error(504, "fake LLM hang elapsed", should_retry=False))
        await self._wait(self.delay + turn.delay)
        if isinstance(turn, Error):
            return self._error_response(turn)
        if isinstance(turn, Raw):
            return web.Response(
                status=turn.status, body=turn.body, headers={"Content-Type": turn.content_type}
            )
        if body.get("stream"):
            return await self._stream(request, body, turn)
        return await self._complete(request, body, turn)

    def _next_turn(self, body: dict[str, Any]) -> Reply | Error | Hang | Raw:
        """Pop the next turn (or the fallback) and resolve callables and strings."""
        if self._turns:
            turn: TurnLike = self._turns.popleft()
        elif self.fallback is not None:
            turn = self.fallback
        else:
            n = len(self.requests)
            return error(
                500,
                f"fake LLM script exhausted: request #{n} arrived but no turn is left and no fallback is set",
                code="script_exhausted",
                should_retry=False,
            )
        try:
            while callable(turn):
                turn = turn(body)
        except Exception as exc:
            self.errors.append(exc)
            return error(
                500, f"fake LLM turn callable raised {exc!r}", code="turn_failed", should_retry=False
            )
        return text(turn) if isinstance(turn, str) else turn

    async def _wait(self, seconds: float) -> None:
        """Sleep, but wake up when the server stops."""
        if seconds <= 0:
            return
        assert self._closing is not None
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            pass

    def _error_response(self, err: Error) -> web.Response:
        payload = {"error": {"message": err.message, "type": err.type, "param": None, "code": err.code}}
        return web.Response(
            status=err.status,
            text=_dumps(payload),
            content_type="application/json",
            headers={"x-request-id": f"req_{next(self._ids)}", **err.headers},
        )

    def _tool_call_id(self, number: int, index: int, tc: ToolCall) -> str:
        return tc.id or f"call_{number}_{index}"

    async def _complete(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        number = next(self._ids)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": self._tool_call_id(number, i, tc),
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments_json()},
                }
                for i, tc in enumerate(reply.tool_calls)
            ]
        payload = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"),
                }
            ],
            "usage": _usage(body, reply),
        }
        data = _dumps(payload).encode()
        if reply.break_after is None:
            return web.Response(body=data, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        return self._cut(request, response)

    def _chunks(self, body: dict[str, Any], reply: Reply, number: int) -> list[str]:
        """All SSE ``data:`` payloads of a streamed reply, in order, including ``[DONE]``."""
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
        }

        # Serialize the constant envelope once; only the delta varies per chunk.
        envelope = _dumps(base)[:-1] + ',"choices":[{"index":0,"delta":'
        usage_tail = ',"usage":null}' if include_usage else "}"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            finish = "null" if finish_reason is None else _dumps(finish_reason)
            return f'{envelope}{_dumps(delta)},"logprobs":null,"finish_reason":{finish}}}]{usage_tail}'

        out = [chunk({"role": "assistant", "content": "", "refusal": None})]
        if reply.content:
            out += [chunk({"content": piece}) for piece in _pieces(reply.content, self.text_chunk)]

        per_call: list[list[dict[str, Any]]] = []
        for index, tc in enumerate(reply.tool_calls):
            head = {
                "index": index,
                "id": self._tool_call_id(number, index, tc),
                "type": "function",
                "function": {"name": tc.name, "arguments": ""},
            }
            arguments = tc.arguments_json()
            tail = [
                {"index": index, "function": {"arguments": p}} for p in _pieces(arguments, self.args_chunk)
            ]
            per_call.append([head, *tail] if arguments else [head])
        if self.interleave:
            ordered = [d for group in itertools.zip_longest(*per_call) for d in group if d is not None]
        else:
            ordered = [d for deltas in per_call for d in deltas]
        out += [chunk({"tool_calls": [d]}) for d in ordered]

        out.append(chunk({}, reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")))
        if include_usage:
            out.append(_dumps({**base, "choices": [], "usage": _usage(body, reply)}))
        out.append("[DONE]")
        return out

    async def _stream(self, request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
        events = [f"data: {c}\n\n".encode() for c in self._chunks(body, reply, next(self._ids))]
        if reply.break_after is not None:
            events = events[: reply.break_after]
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            if reply.chunk_delay > 0:
                for event in events:
                    await response.write(event)
                    await self._wait(reply.chunk_delay)
            else:
                await response.write(b"".join(events))
        except ConnectionError:
            return response
        if reply.break_after is not None:
            return self._cut(request, response)
        await response.write_eof()
        return response

    @staticmethod
    def _cut(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        """Drop the connection mid-body, so the client sees an incomplete message."""
        assert request.transport is not None
        request.transport.close()
        return response


# --- command line -------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A scripted, OpenAI-compatible Chat Completions server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (see the READY line)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="delay before every answer")
    parser.add_argument("--text", default="Done.", help="the (final) text answer")
    parser.add_argument(
        "--tool-rounds", type=int, default=0, help="tool calls per user prompt before the final text"
    )
    parser.add_argument("--tool-name", default="read_file")
    parser.add_argument(
        "--tool-args", default='{"path": "README.md"}', help="JSON arguments of the tool call"
    )
    parser.add_argument("--turns-file", type=Path, help="JSON list of turns played before the default answer")
    parser.add_argument("--api-key", help="require this bearer token")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    fallback: TurnLike = (
        tool_loop(args.tool_rounds, args.tool_name, json.loads(args.tool_args), args.text)
        if args.tool_rounds > 0
        else text(args.text)
    )
    turns = [turn_from_json(t) for t in json.loads(args.turns_file.read_text())] if args.turns_file else []
    fake = FakeLLM(
        *turns,
        fallback=fallback,
        api_key=args.api_key,
        delay=args.delay_ms / 1000,
        host=args.host,
        port=args.port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with fake:
        print(f"{READY_PREFIX} {fake.base_url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGINT/SIGTERM, printing ``FAKE_LLM_READY <base_url>`` once listening."""
    asyncio.run(_serve(_parse_args(argv)))


if __name__ == "__main__":
    main()
