"""Anthropic's Messages API natively (`provider: "anthropic"` or `"claude"`), through the real gRPC
server against a3s_agent/testing/fake_anthropic.py, a real HTTP server speaking the API's event
stream and refusing what the real API refuses.

The conformance conversations of tests/test_dialects.py (one tool call then an answer, two parallel
calls in one turn, GenerateStructured), then: signed thinking going back (from the store too),
prompt-cache breakpoints and the cache's usage, retries of overloaded and failing replies, errors
surfaced, a context overflow compacted and retried, images in user messages, the key's header,
rejection and redaction.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from a3s_agent.base.models import LLMConfig
from a3s_agent.llm import json_body
from a3s_agent.llm.anthropic_provider import AnthropicProvider, messages_url
from a3s_agent.llm.anthropic_request import request_body
from a3s_agent.llm.json_body import BIG_BODY_CHARS, is_big
from a3s_agent.llm.openai_compat import OpenAICompatibleProvider
from a3s_agent.llm.provider import CompletionRequest, TurnEnd
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_anthropic import (
    FakeAnthropic,
    broken_stream,
    call,
    error,
    midway_error,
    overloaded,
    sse_frames,
    text,
    tool_call,
    tool_calls,
)
from a3s_agent.testing.fake_llm import FakeLLM, Raw, TurnLike

from .conftest import LiveServer, agent_settings, running, user
from .test_proxies import proxying

KEY = "sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0L"
NOTES = "hello from the notes\n"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.fixture
async def claude() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(api_key=KEY) as fake:
        yield fake


@pytest.fixture
def files(workspace: Path) -> Path:
    (workspace / "notes.txt").write_text(NOTES)
    (workspace / "a.txt").write_text("alpha\n")
    (workspace / "b.txt").write_text("beta\n")
    return workspace


@pytest.fixture
async def server(files: Path, tmp_path: Path, claude: FakeAnthropic) -> AsyncIterator[LiveServer]:
    async with running(agent_settings(files, tmp_path / "data")) as live:
        await initialize(live, claude)
        yield live


async def initialize(
    live: LiveServer, fake: FakeAnthropic, provider: str = "anthropic", key: str = KEY
) -> None:
    llm = pb.LLMConfig(provider=provider, model="claude-sonnet-4-5", base_url=fake.base_url, api_key=key)
    await live.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))


async def generate(live: LiveServer, prompt: str | pb.Message, session_id: str = "") -> pb.GenerateResponse:
    if not session_id:
        session_id = (await live.stub.CreateSession(pb.CreateSessionRequest())).session_id
    message = user(prompt) if isinstance(prompt, str) else prompt
    return await live.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[message]))


def assert_usage(usage: pb.Usage, fake: FakeAnthropic) -> None:
    """The run's usage is what the fake reported, in OpenAI's convention: the prompt is every input
    token, cache reads and writes included."""
    assert fake.usages, "the fake played no reply"
    assert usage.prompt_tokens == sum(u["prompt_tokens"] for u in fake.usages)
    assert usage.completion_tokens == sum(u["output_tokens"] for u in fake.usages)


def blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [block for block in message["content"] if block["type"] == kind]


# --- the conformance conversations -------------------------------------------------------------


async def test_one_tool_call_then_an_answer(server: LiveServer, claude: FakeAnthropic) -> None:
    claude.script(tool_call("read_file", {"path": "notes.txt"}), text("The notes say hello."))
    reply = await generate(server, "what do the notes say?")

    assert reply.message.content == "The notes say hello."
    assert reply.finish_reason == pb.FINISH_REASON_STOP
    [ran] = reply.tool_calls
    assert ran.name == "read_file" and json.loads(ran.arguments) == {"path": "notes.txt"}
    assert ran.result.success and NOTES.strip() in ran.result.output
    assert_usage(reply.usage, claude)
    # The call went back as a tool_use block under the API's id, answered by a tool_result block.
    *_, assistant, results = claude.requests[-1].messages
    assert [(b["id"], b["name"], b["input"]) for b in blocks(assistant, "tool_use")] == [
        (ran.id, "read_file", {"path": "notes.txt"})
    ]
    [result] = blocks(results, "tool_result")
    assert result["tool_use_id"] == ran.id and NOTES.strip() in result["content"]
    headers = claude.requests[-1].headers
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers
    assert claude.requests[0].path == "/v1/messages" and claude.refusals == []


async def test_text_read_at_once_is_one_chunk_for_a_client_and_written_apart_several(
    server: LiveServer, claude: FakeAnthropic
) -> None:
    answer = "The notes say hello, and goodbye, and hello again."  # 8-character deltas
    claude.script(text(answer), replace(text(answer), chunk_delay=0.005))
    for prompt in ("once", "apart"):
        session_id = (await server.stub.CreateSession(pb.CreateSessionRequest())).session_id
        request = pb.GenerateRequest(session_id=session_id, messages=[user(prompt)])
        said = [
            c.content
            async for c in server.stub.StreamGenerate(request)
            if c.type == pb.GenerateChunk.CHUNK_TYPE_CONTENT
        ]
        assert "".join(said) == answer
        assert len(said) == 1 if prompt == "once" else len(said) > 1  # each delta on as it came


async def test_a_file_written_by_a_tool_call_arrives_byte_for_byte(
    server: LiveServer, claude: FakeAnthropic, files: Path
) -> None:
    """The input streamed in pieces of five characters, with quotes, backslashes, control
    characters, non-ASCII and a JSON-looking `","` inside."""
    content = 'say "hi" \\ then\n\ttab, é, 😀, \u2028, "," and {"nested": [1]}\n' * 3
    answer = 'Wrote it: "quoted", é 😀.'
    claude.script(tool_call("write_file", {"path": "out.txt", "content": content}), text(answer))
    reply = await generate(server, "write it")
    assert reply.tool_calls[0].result.success, reply.tool_calls[0].result.error
    assert (files / "out.txt").read_text() == content
    assert reply.message.content == answer


async def test_two_parallel_calls_in_one_turn(server: LiveServer, claude: FakeAnthropic) -> None:
    claude.script(
        tool_calls(
            [call("read_file", {"path": "a.txt"}), call("read_file", {"path": "b.txt"})], content="Both."
        ),
        text("Both files read."),
    )
    reply = await generate(server, "read a and b")

    assert reply.message.content == "Both files read."
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),
    ]
    assert "alpha" in reply.tool_calls[0].result.output and "beta" in reply.tool_calls[1].result.output
    assert len({c.id for c in reply.tool_calls}) == 2
    assert_usage(reply.usage, claude)
    *_, assistant, results = claude.requests[-1].messages
    assert [b["type"] for b in assistant["content"]] == ["text", "tool_use", "tool_use"]
    assert [b["tool_use_id"] for b in blocks(results, "tool_result")] == [c.id for c in reply.tool_calls]


async def test_generate_structured_is_asked_in_the_prompt(server: LiveServer, claude: FakeAnthropic) -> None:
    claude.script(text('{"name": "Ada"}'), text('{"name": "Ada", "age": 36}'))
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    schema["required"] = ["name", "age"]
    session_id = (await server.stub.CreateSession(pb.CreateSessionRequest())).session_id
    reply = await server.stub.GenerateStructured(
        pb.GenerateStructuredRequest(
            session_id=session_id, messages=[user("Ada, 36")], schema=json.dumps(schema)
        )
    )
    assert json.loads(reply.data) == {"name": "Ada", "age": 36}
    assert_usage(reply.usage, claude)
    first, repair = (r.body for r in claude.requests)
    # No response_format (the API has none): the schema is in the system prompt, the repair a user turn.
    assert "response_format" not in first and "output_config" not in first
    assert json.dumps(schema) in first["system"][-1]["text"]
    assert "does not validate" in repair["messages"][-1]["content"][-1]["text"]


# --- thinking ----------------------------------------------------------------------------------


async def test_signed_thinking_goes_back_from_the_store_and_never_shows(files: Path, tmp_path: Path) -> None:
    settings = agent_settings(files, tmp_path / "data")
    async with FakeAnthropic(api_key=KEY, redacted=True) as fake:
        fake.script(tool_call("read_file", {"path": "notes.txt"}), text("Read."), text("Still here."))
        async with running(settings) as live:
            await initialize(live, fake, provider="claude+thinking")
            session_id = (await live.stub.CreateSession(pb.CreateSessionRequest())).session_id
            reply = await generate(live, "read the notes", session_id)
        assert reply.message.content == "Read." and fake.refusals == []
        first = fake.requests[0].body
        assert first["thinking"] == {"type": "enabled", "budget_tokens": 4096} and "temperature" not in first
        # The tool-use turn went back starting with its thinking, signature and redacted block intact
        # (the fake refuses a tool-result turn whose assistant turn does not start with its thinking).
        *_, assistant, _ = fake.requests[1].messages
        assert [b["type"] for b in assistant["content"]] == ["thinking", "redacted_thinking", "tool_use"]
        assert assistant["content"][0]["signature"] and "step by step" in assistant["content"][0]["thinking"]
        shown = [
            reply.message.content,
            *reply.message.metadata.values(),
            *(c.arguments for c in reply.tool_calls),
        ]
        assert not any("step by step" in s or "redacted" in s for s in shown)

        async with running(settings) as live:  # a new server reads the session back from the store
            await initialize(live, fake, provider="claude+thinking")
            again = await generate(live, "anything else?", session_id)
        assert again.message.content == "Still here." and fake.refusals == []
        thinking = [b for m in fake.requests[-1].messages for b in m["content"] if b["type"] == "thinking"]
        assert len(thinking) == 2  # both earlier turns' thinking, each as the API signed it
        assert again.usage.completion_tokens == fake.usages[-1]["output_tokens"]


async def test_the_fake_refuses_thinking_that_did_not_come_back(claude: FakeAnthropic) -> None:
    """The control for the test above: the strict fake does refuse what a careless client sends."""
    claude.script(tool_call("read_file", {"path": "notes.txt"}))
    thinking = {"type": "enabled", "budget_tokens": 1024}
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 2048,
        "thinking": thinking,
        "messages": [{"role": "user", "content": "go"}],
    }
    status, raw = await _post(claude, body)
    turn = _events(raw)
    [start] = [
        e for e in turn if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    ]
    use = {
        "type": "tool_use",
        "id": start["content_block"]["id"],
        "name": "read_file",
        "input": {"path": "x"},
    }
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "x"}
    without = [
        *body["messages"],
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    forged = {"type": "thinking", "thinking": "I made this up.", "signature": "c2lnbmF0dXJl"}
    forging = [*without[:1], {"role": "assistant", "content": [forged, use]}, without[2]]
    assert status == 200
    for messages, refusal in (
        (without, "must start with a thinking block"),
        (forging, "Invalid `signature`"),
    ):
        status, raw = await _post(claude, {**body, "messages": messages})
        assert status == 400 and refusal in json.loads(raw)["error"]["message"]


# --- prompt caching and usage ------------------------------------------------------------------


async def test_cache_breakpoints_mark_the_prefix_and_a_long_session_reads_it_back(
    server: LiveServer, claude: FakeAnthropic
) -> None:
    claude.script(tool_call("read_file", {"path": "notes.txt"}), text("Read."), text("Again."))
    session_id = (await server.stub.CreateSession(pb.CreateSessionRequest())).session_id
    first = await generate(server, "read the notes", session_id)
    second = await generate(server, "and again?", session_id)

    # The system prompt, the last tool and the last block of the two latest user turns; nothing else.
    for request in claude.requests:
        body = request.body
        users = [m for m in body["messages"] if m["role"] == "user"]
        expected = [body["system"][-1], body["tools"][-1], *(m["content"][-1] for m in users[-2:])]
        marked = [b for b in [*body["system"], *body["tools"]] if "cache_control" in b]
        marked += [b for m in body["messages"] for b in m["content"] if "cache_control" in b]
        assert marked == expected and all(b["cache_control"] == {"type": "ephemeral"} for b in marked)
    assert len(marked) == 4
    # Each request read from the cache all the prefix the one before wrote.
    assert (
        claude.usages[0]["cache_read_input_tokens"] == 0
        and claude.usages[0]["cache_creation_input_tokens"] > 0
    )
    for earlier, later in zip(claude.usages, claude.usages[1:], strict=False):
        wrote = earlier["cache_read_input_tokens"] + earlier["cache_creation_input_tokens"]
        assert later["cache_read_input_tokens"] == wrote
    # Usage counts every input token, and the cache's share is reported beside it.
    usage = {"prompt_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0}
    for reply in (first, second):
        for name in usage:
            usage[name] += int(reply.metadata[name])
    assert usage == {
        "prompt_tokens": sum(u["prompt_tokens"] for u in claude.usages),
        "cache_read_tokens": sum(u["cache_read_input_tokens"] for u in claude.usages),
        "cache_write_tokens": sum(u["cache_creation_input_tokens"] for u in claude.usages),
    }


async def test_a_turns_usage_has_every_field(claude: FakeAnthropic) -> None:
    claude.script(text("one"), text("two"))
    llm = LLMConfig(provider="claude", model="claude-opus-4", base_url=claude.base_url, api_key=KEY)
    provider = AnthropicProvider(llm, thinking=True)
    messages = [{"role": "system", "content": "Be brief. " * 400}, {"role": "user", "content": "hi"}]
    try:
        for _ in range(2):
            [end] = [
                e async for e in provider.stream(CompletionRequest("m", messages)) if isinstance(e, TurnEnd)
            ]
    finally:
        await provider.close()
    reported = claude.usages[-1]
    assert reported["cache_read_input_tokens"] > 1000 and reported["thinking_tokens"] > 0
    assert end.usage is not None and (
        end.usage.prompt_tokens,
        end.usage.completion_tokens,
        end.usage.cache_read_tokens,
        end.usage.cache_write_tokens,
        end.usage.reasoning_tokens,
    ) == (
        reported["input_tokens"]
        + reported["cache_read_input_tokens"]
        + reported["cache_creation_input_tokens"],
        reported["output_tokens"],
        reported["cache_read_input_tokens"],
        reported["cache_creation_input_tokens"],
        reported["thinking_tokens"],
    )


# --- retries and errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [overloaded(retry_after=0.01), overloaded(in_stream=True), error(429, "rate limited", retry_after=0.01)],
    ids=["overloaded-529", "overloaded-event", "rate-limited-429"],
)
async def test_overloaded_and_rate_limited_replies_are_retried(
    server: LiveServer, claude: FakeAnthropic, failure: Any
) -> None:
    claude.script(failure, text("made it"))
    reply = await generate(server, "go")
    assert reply.message.content == "made it" and len(claude.requests) == 2


async def test_overloaded_for_good_is_unavailable_after_the_retries(
    server: LiveServer, claude: FakeAnthropic
) -> None:
    claude.script(*[overloaded(retry_after=0.01)] * 3)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await generate(server, "go")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Overloaded" in caught.value.details() and "after 3 attempts" in caught.value.details()
    assert len(claude.requests) == 3  # llm_retries=2


@pytest.mark.parametrize(
    ("turn", "code", "said"),
    [
        (
            midway_error("Half an ans", error(500, "Internal server error", type="api_error")),
            grpc.StatusCode.UNAVAILABLE,
            "Internal server error",
        ),
        (
            error(400, "messages.0: something the API dislikes", in_stream=True),
            grpc.StatusCode.UNAVAILABLE,
            "dislikes",
        ),
        (error(400, "max_tokens: 999999 > 64000, the maximum"), grpc.StatusCode.INVALID_ARGUMENT, "64000"),
        (
            broken_stream("This answer is cut off in the mid", after_chunks=5),
            grpc.StatusCode.UNAVAILABLE,
            "broke",
        ),
    ],
    ids=["event-after-text", "event-invalid-request", "http-400", "cut-off"],
)
async def test_errors_are_surfaced_and_not_retried_once_the_reply_began(
    server: LiveServer, claude: FakeAnthropic, turn: Any, code: grpc.StatusCode, said: str
) -> None:
    claude.script(turn, text("never asked for"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await generate(server, "go")
    assert caught.value.code() == code and said in caught.value.details()
    assert len(claude.requests) == 1


async def test_a_rejected_key_is_failed_precondition_and_never_echoed(
    server: LiveServer, claude: FakeAnthropic
) -> None:
    wrong = "sk-ant-api03-WRONGwrongWRONGwrong0123456789"
    async with FakeAnthropic(error(401, f"invalid x-api-key: {wrong}")) as echoing:
        await initialize(server, echoing, key=wrong)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await generate(server, "go")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "rejected the API key" in caught.value.details() and "[redacted]" in caught.value.details()
    assert "WRONGwrong" not in caught.value.details()


async def test_a_context_overflow_is_compacted_and_retried(server: LiveServer, claude: FakeAnthropic) -> None:
    def is_summary(body: dict[str, Any]) -> bool:
        return "Summarise the conversation" in body.get("system", [{}])[0].get("text", "")

    answers: Iterator[TurnLike] = iter(
        [error(400, "prompt is too long: 210000 tokens > 200000 maximum"), text("carried on")]
    )
    claude.fallback = lambda body: text("Goal: the notes.") if is_summary(body) else next(answers)
    context = [user("THE TASK: read the notes")]
    context += [
        pb.Message(
            role=pb.Message.ROLE_ASSISTANT if i % 2 else pb.Message.ROLE_USER, content=f"turn {i} " * 300
        )
        for i in range(12)
    ]
    created = await server.stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(auto_compact=True, max_context_length=200_000), initial_context=context
        )
    )
    reply = await generate(server, "go on", created.session_id)

    assert reply.message.content == "carried on"
    main = [r.body for r in claude.requests if not is_summary(r.body)]
    assert len(main) == 2 and any(is_summary(r.body) for r in claude.requests)
    assert len(json.dumps(main[1]["messages"])) < len(json.dumps(main[0]["messages"])) // 2


# --- images ------------------------------------------------------------------------------------


async def test_an_image_in_a_user_message_is_an_image_block(
    server: LiveServer, claude: FakeAnthropic
) -> None:
    claude.script(text("A single pixel."))
    picture = pb.Attachment(type=pb.Attachment.TYPE_IMAGE, name="dot.png", mime_type="image/png", content=PNG)
    linked = pb.Attachment(type=pb.Attachment.TYPE_IMAGE, name="cat", url="https://example.com/cat.jpg")
    message = pb.Message(role=pb.Message.ROLE_USER, content="what is this?", attachments=[picture, linked])
    reply = await generate(server, message)

    assert reply.message.content == "A single pixel." and claude.refusals == []
    [sent] = claude.requests[-1].messages
    assert sent["content"][0]["text"] == "what is this?"
    assert [b["source"] for b in blocks(sent, "image")] == [
        {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()},
        {"type": "url", "url": "https://example.com/cat.jpg"},
    ]


# --- the endpoint ------------------------------------------------------------------------------


async def test_requests_go_through_the_proxy_the_environment_names(
    files: Path, tmp_path: Path, claude: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    async with proxying({"claude.test": "127.0.0.1"}, credentials="me:pr0xy-pass-word") as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://me:pr0xy-pass-word@127.0.0.1:{proxy.port}")
        async with running(agent_settings(files, tmp_path / "data")) as live:
            llm = pb.LLMConfig(
                provider="anthropic", model="claude-x", base_url=f"http://claude.test:{claude.port}"
            )
            await live.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))
            claude.api_key = None
            claude.script(text("through the proxy"))
            assert (await generate(live, "hi")).message.content == "through the proxy"
    assert [(method, target) for method, target, _ in proxy.requests] == [
        ("POST", f"http://claude.test:{claude.port}/v1/messages")
    ]
    assert all(authorization for _, _, authorization in proxy.requests)


@pytest.mark.parametrize(
    ("base_url", "url"),
    [
        ("", "https://api.anthropic.com/v1/messages"),
        ("https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
        ("https://api.anthropic.com/v1/", "https://api.anthropic.com/v1/messages"),
        ("https://gateway.example/anthropic", "https://gateway.example/anthropic/v1/messages"),
    ],
)
def test_the_messages_url_under_a_base_url_with_or_without_v1(base_url: str, url: str) -> None:
    assert messages_url(base_url) == url


async def test_the_official_client_reads_the_fakes_stream(claude: FakeAnthropic) -> None:
    """The fake's bytes are the API's: the `anthropic` package assembles them into the message."""
    import anthropic

    claude.redacted = True
    claude.script(tool_calls([call("read_file", {"path": "a.txt"}), call("ls")], content="Looking."))
    client = anthropic.AsyncAnthropic(base_url=claude.base_url, api_key=KEY, max_retries=0)
    try:
        async with client.messages.stream(
            model="claude-test",
            max_tokens=4096,
            thinking={"type": "enabled", "budget_tokens": 2048},
            messages=[{"role": "user", "content": "go"}],
            tools=[{"name": "read_file", "input_schema": {"type": "object"}}],
        ) as stream:
            message = await stream.get_final_message()
    finally:
        await client.close()
    assert [block.type for block in message.content] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
        "tool_use",
    ]
    thought = message.content[0]
    assert isinstance(thought, anthropic.types.ThinkingBlock) and thought.signature
    assert message.stop_reason == "tool_use"
    uses = [b for b in message.content[3:] if isinstance(b, anthropic.types.ToolUseBlock)]
    assert [(b.name, b.input) for b in uses] == [("read_file", {"path": "a.txt"}), ("ls", {})]
    assert message.usage.output_tokens == claude.usages[-1]["output_tokens"]


async def test_the_fake_refuses_a_request_without_the_version_header(claude: FakeAnthropic) -> None:
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    status, raw = await _post(claude, body, version="")
    assert status == 400 and b"anthropic-version: header is required" in raw


async def _post(fake: FakeAnthropic, body: dict[str, Any], version: str = "2023-06-01") -> tuple[int, bytes]:
    headers = {"x-api-key": KEY, **({"anthropic-version": version} if version else {})}
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{fake.base_url}/v1/messages", json=body, headers=headers) as reply,
    ):
        return reply.status, await reply.read()


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


async def test_an_image_a_tool_read_is_inside_its_tool_result(
    server: LiveServer, claude: FakeAnthropic, files: Path
) -> None:
    (files / "dot.png").write_bytes(PNG)
    claude.script(tool_call("read_file", {"path": "dot.png"}), text("A single pixel."))
    reply = await generate(server, "what is in dot.png?")

    assert reply.message.content == "A single pixel." and claude.refusals == []
    *_, results = claude.requests[-1].messages
    [result] = blocks(results, "tool_result")
    assert result["tool_use_id"] == reply.tool_calls[0].id
    kinds = [part["type"] for part in result["content"]]
    assert kinds[-1] == "image" and set(kinds[:-1]) == {"text"}
    assert result["content"][-1]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(PNG).decode(),
    }
    assert [m["role"] for m in claude.requests[-1].messages] == ["user", "assistant", "user"]


def test_the_request_alternates_turns_and_keeps_later_system_messages_in_place() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are the agent."},
        {"role": "user", "content": "first"},
        {"role": "user", "content": "   "},  # blank: the API refuses blank text blocks
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "error: bad arguments"},
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "second"},
    ]
    request = CompletionRequest("m", messages, temperature=0.3, max_tokens=1000, stop=["END"])
    body = request_body(request, "anthropic x", thinking=False)
    assert [b["text"] for b in body["system"]] == ["You are the agent."]
    assert [(t["role"], [b["type"] for b in t["content"]]) for t in body["messages"]] == [
        ("user", ["text"]),
        ("assistant", ["tool_use"]),
        ("user", ["tool_result", "text", "text"]),
    ]
    assert body["messages"][1]["content"][0]["input"] == {}  # botched arguments: an empty object
    assert [b.get("text") for b in body["messages"][2]["content"][1:]] == ["Answer in JSON.", "second"]
    assert (body["temperature"], body["max_tokens"], body["stop_sequences"]) == (0.3, 1000, ["END"])
    thinking = request_body(request, "anthropic x", thinking=True)
    assert "temperature" not in thinking and thinking["max_tokens"] == 2048
    assert thinking["thinking"] == {"type": "enabled", "budget_tokens": 1024}


# --- failed tools, big bodies --------------------------------------------------------------------


async def test_a_failed_tools_result_is_marked_is_error_and_only_for_anthropic(
    server: LiveServer, claude: FakeAnthropic, files: Path, tmp_path: Path
) -> None:
    claude.script(
        tool_calls([call("read_file", {"path": "missing.txt"}), call("read_file", {"path": "a.txt"})]),
        text("One was missing."),
    )
    reply = await generate(server, "read missing.txt and a.txt")

    assert reply.message.content == "One was missing." and claude.refusals == []
    missing, found = reply.tool_calls
    assert not missing.result.success and found.result.success
    *_, results = claude.requests[-1].messages
    by_call = {block["tool_use_id"]: block for block in blocks(results, "tool_result")}
    assert by_call[missing.id]["is_error"] is True and "is_error" not in by_call[found.id]
    assert "error" in by_call[missing.id]["content"]

    # The same conversation with an OpenAI-compatible server: the mark never reaches the wire.
    async with FakeLLM() as fake, running(agent_settings(files, tmp_path / "openai")) as live:
        await live.stub.Initialize(
            pb.InitializeRequest(
                config=pb.AgentConfig(
                    llm=pb.LLMConfig(provider="openai", model="gpt-4o", base_url=fake.base_url)
                )
            )
        )
        fake.script(
            tool_calls([call("read_file", {"path": "missing.txt"}), call("read_file", {"path": "a.txt"})]),
            text("One was missing."),
        )
        assert (await generate(live, "read missing.txt and a.txt")).message.content == "One was missing."
    tool_messages = [m for m in fake.requests[-1].messages if m["role"] == "tool"]
    assert len(tool_messages) == 2
    assert all(set(m) == {"role", "tool_call_id", "content"} for m in tool_messages)


async def test_a_big_image_goes_whole_and_is_encoded_off_the_event_loop(
    server: LiveServer, claude: FakeAnthropic, files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3 MB screenshot makes the body big: it is encoded in a worker thread (the size estimate
    counts image blocks inside tool results), and arrives whole."""
    verdicts: list[bool] = []

    def recorded(body: Any) -> bool:
        verdicts.append(is_big(body))
        return verdicts[-1]

    monkeypatch.setattr(json_body, "is_big", recorded)
    shot = PNG + os.urandom(3 * 1024 * 1024)  # what follows the PNG's end is still its bytes
    (files / "shot.png").write_bytes(shot)
    claude.script(tool_call("read_file", {"path": "shot.png"}), text("A screenshot."))
    reply = await generate(server, "what is in shot.png?")

    assert reply.message.content == "A screenshot." and claude.refusals == []
    *_, results = claude.requests[-1].messages
    [result] = blocks(results, "tool_result")
    assert result["content"][-1]["source"]["data"] == base64.b64encode(shot).decode()
    assert verdicts == [False, True]


def test_the_size_estimate_counts_what_each_provider_sends() -> None:
    """Image blocks, tool results and tool arguments count, as much as text does."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * BIG_BODY_CHARS}}
    shapes: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}],
        [
            {"role": "user", "content": "read it"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "a picture"}, image]},
        ],
        [
            {"role": "user", "content": "write it"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "f", "arguments": json.dumps({"text": "x" * BIG_BODY_CHARS})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "written"},
        ],
    ]
    for messages in shapes:
        request = CompletionRequest("m", messages)
        anthropic = request_body(request, "anthropic x", thinking=False)
        openai = OpenAICompatibleProvider(LLMConfig(model="m"))._body(request, with_options=True)
        assert is_big(anthropic) and is_big(openai)
        small = CompletionRequest("m", [{"role": "user", "content": "x" * (BIG_BODY_CHARS - 100)}])
        assert not is_big(request_body(small, "anthropic x", thinking=False))


@pytest.mark.parametrize(
    "odd",
    [
        {"type": "content_block_stop", "index": [0]},
        {"type": "content_block_start", "index": 0, "content_block": "text"},
        {"type": "content_block_delta", "index": 0, "delta": "x"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
        {"type": "message_start", "message": "m"},
    ],
    ids=["index", "content_block", "delta", "text", "message"],
)
async def test_an_event_member_of_the_wrong_type_is_skipped_not_an_internal_error(
    server: LiveServer, claude: FakeAnthropic, odd: dict[str, Any]
) -> None:
    """An event whose member has the wrong JSON type counts as without it: the reply still comes."""
    events = [
        odd,
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]
    claude.script(Raw(b"".join(sse_frames(events))))
    assert (await generate(server, "hi")).message.content == "ok"
