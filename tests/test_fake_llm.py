"""The fake OpenAI-compatible server speaks a wire format the real ``openai`` client accepts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import (
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)
from pydantic import BaseModel

from a3s_agent.testing.fake_llm import (
    READY_PREFIX,
    FakeLLM,
    Reply,
    broken_stream,
    call,
    delayed,
    error,
    hang,
    text,
    tool_call,
    tool_calls,
    tool_loop,
)

USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


MakeClient = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def make_client(fake: FakeLLM) -> AsyncIterator[MakeClient]:
    """A factory of real clients pointed at ``fake`` (overridable), closed after the test."""
    made: list[openai.AsyncOpenAI] = []

    def make(
        base_url: str | None = None, api_key: str = "sk-test", max_retries: int = 0
    ) -> openai.AsyncOpenAI:
        made.append(
            openai.AsyncOpenAI(base_url=base_url or fake.base_url, api_key=api_key, max_retries=max_retries)
        )
        return made[-1]

    yield make
    for c in made:
        await c.close()


@pytest.fixture
def client(make_client: MakeClient) -> openai.AsyncOpenAI:
    return make_client()


async def collect(stream: openai.AsyncStream[Any]) -> list[Any]:
    return [chunk async for chunk in stream]


def function_calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    """The message's tool calls, every one a function call (the fake makes no other kind)."""
    calls = message.tool_calls or []
    functions = [c for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]
    assert len(functions) == len(calls), calls
    return functions


def reassemble_tool_calls(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """Merge streamed tool-call deltas by index, as an agent would."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.id or ""
                slot["name"] += (tc.function and tc.function.name) or ""
                slot["arguments"] += (tc.function and tc.function.arguments) or ""
    return calls


async def test_non_streamed_text(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    fake.script(text("Hello from the fake."))
    completion = await client.chat.completions.create(model="gpt-test", messages=USER)
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-test"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello from the fake."
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len("hello there") // 4
    assert completion.usage.completion_tokens == len("Hello from the fake.") // 4
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


async def test_non_streamed_tool_calls_keep_raw_arguments(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    fake.script(tool_calls([("read_file", {"path": "a.txt"}), call("shell", '{"cmd": "ls', id="call_x")]))
    completion = await client.chat.completions.create(model="m", messages=USER)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = function_calls(choice.message)
    assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [
        ("function", "read_file", '{"path": "a.txt"}'),
        ("function", "shell", '{"cmd": "ls'),
    ]
    assert calls[1].id == "call_x"
    assert calls[0].id and calls[0].id != calls[1].id


async def test_streamed_text_is_reassembled(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    answer = "The quick brown fox jumps over the lazy dog."
    fake.script(text(answer, finish_reason="length"))
    chunks = await collect(await client.chat.completions.create(model="m", messages=USER, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert len(contents) > 3
    assert "".join(contents) == answer
    assert chunks[-1].choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert all(c.usage is None for c in chunks)
    assert "stream_options" not in fake.requests[0].body


async def test_streamed_parallel_tool_calls_reassemble_by_index(
    fake: FakeLLM, client: openai.AsyncOpenAI
) -> None:
    first = {"path": "src/main.py", "start_line": 10, "end_line": 42}
    second = {"command": "pytest -q tests/test_x.py", "timeout": 30}
    fake.script(tool_calls([("read_file", first), ("shell", second)], content="Let me look."))
    chunks = await collect(await client.chat.completions.create(model="m", messages=USER, stream=True))

    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Let me look."
    calls = reassemble_tool_calls(chunks)
    assert [calls[i]["name"] for i in (0, 1)] == ["read_file", "shell"]
    assert json.loads(calls[0]["arguments"]) == first
    assert json.loads(calls[1]["arguments"]) == second
    assert calls[0]["id"] and calls[1]["id"] and calls[0]["id"] != calls[1]["id"]

    deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or ()]
    heads = [d for d in deltas if d.id]
    assert [(d.index, d.type, d.function.name, d.function.arguments) for d in heads] == [
        (0, "function", "read_file", ""),
        (1, "function", "shell", ""),
    ]
    argument_deltas = [d for d in deltas if not d.id]
    assert sum(d.index == 0 for d in argument_deltas) > 10
    assert sum(d.index == 1 for d in argument_deltas) > 10
    indexes = [d.index for d in deltas]
    assert indexes[:4] == [0, 1, 0, 1], "parallel calls are interleaved"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_usage_chunk_with_include_usage(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    fake.script(text("Some answer text."))
    chunks = await collect(
        await client.chat.completions.create(
            model="m", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (2, 4)
    assert last.usage.total_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks[:-1])
    assert fake.requests[0].body["stream_options"] == {"include_usage": True}


async def test_rate_limit_then_success_uses_retry_after(fake: FakeLLM, make_client: MakeClient) -> None:
    fake.script(error(429, retry_after=0.01), text("finally"))
    client = make_client(max_retries=2)
    started = time.monotonic()
    completion = await client.chat.completions.create(model="m", messages=USER)
    elapsed = time.monotonic() - started
    assert completion.choices[0].message.content == "finally"
    assert elapsed < 0.3, "the client's own backoff (>= 0.375 s) would mean Retry-After was ignored"
    assert [r.headers["x-stainless-retry-count"] for r in fake.requests] == ["0", "1"]


async def test_rate_limit_exhausts_retries(fake: FakeLLM, make_client: MakeClient) -> None:
    fake.script(*[error(429, retry_after_ms=1)] * 3)
    client = make_client(max_retries=2)
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="m", messages=USER)
    assert info.value.code == "rate_limit_exceeded"
    assert len(fake.requests) == 3
    assert fake.remaining == 0


async def test_unauthorized_raises_authentication_error(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    fake.script(error(401, "Incorrect API key provided: sk-test."))
    with pytest.raises(openai.AuthenticationError) as info:
        await client.chat.completions.create(model="m", messages=USER)
    assert info.value.status_code == 401
    assert "Incorrect API key provided: sk-test." in str(info.value)
    assert info.value.code == "invalid_api_key"
    assert info.value.type == "invalid_request_error"


async def test_api_key_enforced(make_client: MakeClient) -> None:
    async with FakeLLM(fallback="welcome", api_key="sk-right") as server:
        wrong = make_client(server.base_url, api_key="sk-wrong")
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="m", messages=USER)
        right = make_client(server.base_url, api_key="sk-right")
        completion = await right.chat.completions.create(model="m", messages=USER)
        assert completion.choices[0].message.content == "welcome"
        assert [r.authorization for r in server.requests] == ["Bearer sk-wrong", "Bearer sk-right"]


async def test_server_error_and_exhausted_script_fail_without_retries(
    fake: FakeLLM, make_client: MakeClient
) -> None:
    client = make_client(max_retries=2)
    fake.script(error(500, should_retry=False))
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=USER)
    with pytest.raises(openai.InternalServerError, match="script exhausted"):
        await client.chat.completions.create(model="m", messages=USER)
    assert len(fake.requests) == 2


async def test_hang_hits_client_timeout_and_stop_is_prompt(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    fake.script(hang(60))
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="m", messages=USER, timeout=0.5)
    started = time.monotonic()
    await fake.stop()
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("stream", [True, False])
async def test_broken_off_response_raises(fake: FakeLLM, client: openai.AsyncOpenAI, stream: bool) -> None:
    fake.script(broken_stream("A long answer that will never be finished.", after_chunks=3))
    received: list[Any] = []
    with pytest.raises(openai.APIConnectionError):
        response = await client.chat.completions.create(model="m", messages=USER, stream=stream)
        if stream:
            assert isinstance(response, openai.AsyncStream)
            async for chunk in response:
                received.append(chunk)
    if stream:
        assert len(received) == 3


async def test_callable_turn_sees_the_request(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    def echo_tool_result(body: dict[str, Any]) -> Reply:
        tool_message = next(m for m in body["messages"] if m["role"] == "tool")
        return text(f"The file says: {tool_message['content']}")

    fake.script(tool_call("read_file", {"path": "a.txt"}, id="call_1"), echo_tool_result)
    first = await client.chat.completions.create(model="m", messages=USER)
    assistant = first.choices[0].message.model_dump(exclude_none=True)
    messages: list[Any] = [*USER, assistant, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    second = await client.chat.completions.create(model="m", messages=messages)
    assert second.choices[0].message.content == "The file says: 42"


async def test_callable_turn_answers_structured_output(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    class Verdict(BaseModel):
        ok: bool
        reason: str

    def structured(body: dict[str, Any]) -> str:
        schema = body["response_format"]["json_schema"]
        assert schema["name"] == "Verdict"
        return json.dumps({"ok": True, "reason": "looks fine"})

    fake.script(structured)
    completion = await client.chat.completions.parse(model="m", messages=USER, response_format=Verdict)
    assert completion.choices[0].message.parsed == Verdict(ok=True, reason="looks fine")
    assert fake.requests[0].body["response_format"]["type"] == "json_schema"


async def test_failing_callable_is_reported(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    def broken(body: dict[str, Any]) -> str:
        raise KeyError("nope")

    fake.script(broken)
    with pytest.raises(openai.InternalServerError, match="KeyError"):
        await client.chat.completions.create(model="m", messages=USER)
    assert isinstance(fake.errors[0], KeyError)


async def test_requests_are_recorded(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    fake.script("ok")
    tools: list[ChatCompletionToolParam] = [
        {
            "type": "function",
            "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    await client.chat.completions.create(
        model="gpt-x",
        messages=[{"role": "system", "content": "be brief"}, *USER],
        tools=tools,
        tool_choice="auto",
        temperature=0.2,
        max_tokens=64,
        stop=["END"],
        response_format={"type": "json_object"},
    )
    (request,) = fake.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.model == "gpt-x"
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert request.tools == tools
    assert request.stream is False
    assert request.authorization == "Bearer sk-test"
    body = request.body
    assert (body["tool_choice"], body["temperature"], body["max_tokens"], body["stop"]) == (
        "auto",
        0.2,
        64,
        ["END"],
    )
    assert body["response_format"] == {"type": "json_object"}


async def test_invalid_request_is_rejected_without_consuming_a_turn(
    fake: FakeLLM, client: openai.AsyncOpenAI
) -> None:
    fake.script("kept")
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="m", messages=None)  # type: ignore[call-overload]
    assert fake.remaining == 1


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([{"role": "robot", "content": "x"}], "role"),
        ([*USER, {"role": "tool", "tool_call_id": "call_1", "content": "x"}], "must be a response"),
        (
            [
                *USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        for i in ("call_1", "call_2")
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "x"},
                {"role": "user", "content": "go on"},
            ],
            "call_2",
        ),
    ],
)
async def test_strict_rejects_malformed_conversations(
    fake: FakeLLM, client: openai.AsyncOpenAI, messages: list[Any], problem: str
) -> None:
    fake.script("kept")
    with pytest.raises(openai.BadRequestError, match=problem):
        await client.chat.completions.create(model="m", messages=messages)
    assert fake.remaining == 1
    fake.strict = False
    completion = await client.chat.completions.create(model="m", messages=messages)
    assert completion.choices[0].message.content == "kept"


async def test_models_and_unprefixed_path(
    fake: FakeLLM, client: openai.AsyncOpenAI, make_client: MakeClient
) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    bare = make_client(fake.base_url.removesuffix("/v1"))
    fake.script("no prefix")
    completion = await bare.chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].message.content == "no prefix"
    assert fake.requests[0].path == "/chat/completions"


async def test_delays_overlap_across_concurrent_requests(fake: FakeLLM, client: openai.AsyncOpenAI) -> None:
    fake.script(*[delayed(f"answer {i}", 0.2) for i in range(5)])
    started = time.monotonic()
    results = await asyncio.gather(
        *[client.chat.completions.create(model="m", messages=USER) for _ in range(5)]
    )
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 0.6
    assert sorted(r.choices[0].message.content or "" for r in results) == [f"answer {i}" for i in range(5)]


async def test_tool_loop_is_per_conversation(client: openai.AsyncOpenAI, fake: FakeLLM) -> None:
    fake.fallback = tool_loop(rounds=2, name="read_file", arguments={"path": "x"}, final="all done")

    async def conversation() -> list[str]:
        messages: list[Any] = list(USER)
        kinds = []
        while True:
            message = (await client.chat.completions.create(model="m", messages=messages)).choices[0].message
            if not message.tool_calls:
                kinds.append(message.content or "")
                return kinds
            kinds.append(function_calls(message)[0].function.name)
            messages.append(message.model_dump(exclude_none=True))
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "x"} for c in message.tool_calls]

    results = await asyncio.gather(*[conversation() for _ in range(4)])
    assert results == [["read_file", "read_file", "all done"]] * 4


def test_runs_in_a_thread_for_sync_clients() -> None:
    with (
        FakeLLM(text("from a thread"), fallback=text("again")) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as client,
    ):
        answers = [
            client.chat.completions.create(model="m", messages=USER).choices[0].message.content for _ in "ab"
        ]
        assert answers == ["from a thread", "again"]
        assert len(server.requests) == 2


def test_runs_as_a_subprocess(tmp_path: Path) -> None:
    turns = tmp_path / "turns.json"
    turns.write_text(json.dumps([{"error": 429, "retry_after_ms": 1}, "scripted"]))
    command = [sys.executable, "-m", "a3s_agent.testing.fake_llm", "--port", "0", "--tool-rounds", "1",
               "--turns-file", str(turns)]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            prefix, base_url = proc.stdout.readline().split()
            assert prefix == READY_PREFIX
            with openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=1) as client:
                scripted = client.chat.completions.create(model="m", messages=USER).choices[0].message
                assert scripted.content == "scripted", "the 429 was retried, then the file's turn played"
                first = client.chat.completions.create(model="m", messages=USER).choices[0].message
                [read] = function_calls(first)
                assert read.function.name == "read_file"
                answer = {"role": "tool", "tool_call_id": read.id, "content": "text"}
                messages: list[Any] = [*USER, first.model_dump(exclude_none=True), answer]
                final = client.chat.completions.create(model="m", messages=messages).choices[0].message
                assert final.content == "Done."
        finally:
            proc.terminate()
        assert proc.wait(timeout=5) == 0
