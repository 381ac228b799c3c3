"""Every OpenAI-compatible dialect the fake reproduces, through the real gRPC server.

The conformance suite runs the same three conversations against each dialect of
`a3s_agent/testing/fake_llm.py` (DIALECTS): one tool call then an answer, two parallel calls in one
turn, and GenerateStructured; each asserts the tools ran with the right arguments, the answer, and
the usage the server reported. Then focused tests: each error shape surfaces the server's message,
`stream_options` refused once is not sent to that endpoint again, provider state (DeepSeek's
reasoning, Gemini's signatures) goes back to its own endpoint only, from the store too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.base.errors import Unavailable
from a3s_agent.base.jsontext import model_json
from a3s_agent.llm import chunk_template, openai_stream, sse
from a3s_agent.llm.openai_stream import TurnReader
from a3s_agent.llm.provider import ToolCallReady
from a3s_agent.llm.sse import ServerEvent, event_batches
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import DIALECTS, Error, FakeLLM, Raw, call, error, text, tool_call, tool_calls

from .conftest import LiveServer, agent_settings, initialize, new_session, running, user

NOTES = "hello from the notes\n"


@pytest.fixture(params=sorted(DIALECTS))
async def dialect_fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeLLM]:
    async with FakeLLM(dialect=request.param) as fake:
        yield fake


@pytest.fixture
async def server(workspace: Path, tmp_path: Path, dialect_fake: FakeLLM) -> AsyncIterator[LiveServer]:
    (workspace / "notes.txt").write_text(NOTES)
    (workspace / "a.txt").write_text("alpha\n")
    (workspace / "b.txt").write_text("beta\n")
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        await initialize(live, dialect_fake)
        yield live


def assert_usage(usage: pb.Usage, fake: FakeLLM) -> None:
    """The run's usage is the sum of what the server reported for each reply, wherever it put it."""
    assert fake.usages, "the fake played no reply"
    assert usage.prompt_tokens == sum(u["prompt_tokens"] for u in fake.usages)
    assert usage.completion_tokens == sum(u["completion_tokens"] for u in fake.usages)


async def generate(server: LiveServer, session_id: str, prompt: str) -> pb.GenerateResponse:
    return await server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user(prompt)]))


# --- the conformance suite: three conversations per dialect ------------------------------------


async def test_one_tool_call_then_an_answer(server: LiveServer, dialect_fake: FakeLLM) -> None:
    dialect_fake.script(tool_call("read_file", {"path": "notes.txt"}), text("The notes say hello."))
    reply = await generate(server, await new_session(server), "what do the notes say?")

    assert reply.message.content == "The notes say hello."
    assert reply.finish_reason == pb.FINISH_REASON_STOP
    [ran] = reply.tool_calls
    assert ran.name == "read_file" and json.loads(ran.arguments) == {"path": "notes.txt"}
    assert ran.result.success and NOTES.strip() in ran.result.output
    assert_usage(reply.usage, dialect_fake)
    # The call went back under the id the server gave it, answered by its result.
    last = dialect_fake.requests[-1].messages
    assert [c["id"] for c in last[-2]["tool_calls"]] == [ran.id] and last[-1]["tool_call_id"] == ran.id


async def test_two_parallel_calls_in_one_turn(server: LiveServer, dialect_fake: FakeLLM) -> None:
    dialect_fake.script(
        tool_calls([call("read_file", {"path": "a.txt"}), call("read_file", {"path": "b.txt"})]),
        text("Both files read."),
    )
    reply = await generate(server, await new_session(server), "read a and b")

    assert reply.message.content == "Both files read."
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),
    ]
    assert "alpha" in reply.tool_calls[0].result.output and "beta" in reply.tool_calls[1].result.output
    assert len({c.id for c in reply.tool_calls}) == 2
    assert_usage(reply.usage, dialect_fake)


async def test_generate_structured(server: LiveServer, dialect_fake: FakeLLM) -> None:
    dialect_fake.script(text('{"name": "Ada", "age": 36}'))
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    reply = await server.stub.GenerateStructured(
        pb.GenerateStructuredRequest(
            session_id=await new_session(server), messages=[user("Ada, 36")], schema=json.dumps(schema)
        )
    )
    assert json.loads(reply.data) == {"name": "Ada", "age": 36}
    assert_usage(reply.usage, dialect_fake)


async def test_a_file_written_by_a_tool_call_arrives_byte_for_byte(
    server: LiveServer, dialect_fake: FakeLLM, workspace: Path
) -> None:
    """Arguments streamed in pieces of three characters (most chunks alike but for their piece),
    with quotes, backslashes, control characters, non-ASCII and a JSON-looking `","` inside."""
    content = 'say "hi" \\ then\n\ttab, é, 😀, \u2028, "," and {"nested": [1]}\n' * 3
    answer = 'Wrote it: "quoted", é 😀.'
    dialect_fake.script(tool_call("write_file", {"path": "out.txt", "content": content}), text(answer))
    reply = await generate(server, await new_session(server), "write it")
    assert reply.tool_calls[0].result.success, reply.tool_calls[0].result.error
    assert (workspace / "out.txt").read_text() == content
    assert reply.message.content == answer


# --- focused tests -----------------------------------------------------------------------------


@pytest.fixture
async def live_for(workspace: Path, tmp_path: Path) -> AsyncIterator[LiveServer]:
    (workspace / "notes.txt").write_text(NOTES)
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        yield live


@pytest.mark.parametrize(
    ("dialect", "turn", "code", "also"),
    [
        (
            "vllm-error",
            error(400, "temperature must be non-negative"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "",
        ),
        ("vllm-error", error(500, "the engine died", in_stream=True), grpc.StatusCode.UNAVAILABLE, ""),
        (
            "llamacpp-error-field",
            error(500, "slot 0 is busy", in_stream=True),
            grpc.StatusCode.UNAVAILABLE,
            "",
        ),
        ("openai", error(500, "the server had an error", in_stream=True), grpc.StatusCode.UNAVAILABLE, ""),
        (
            "gemini",
            error(400, "API key not valid. Please pass a valid API key."),
            grpc.StatusCode.INVALID_ARGUMENT,
            "",
        ),
        ("mistral", error(400, "Invalid model: mistral-huge"), grpc.StatusCode.INVALID_ARGUMENT, ""),
        ("error-200", error(429, "You exceeded your current quota"), grpc.StatusCode.UNAVAILABLE, ""),
        (
            "llamacpp-error-field",
            error(
                400,
                "the request exceeds the available context size. try increasing the context size",
                in_stream=True,
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "context window",
        ),
    ],
    ids=[
        "vllm-http",
        "vllm-stream",
        "llamacpp-field",
        "openai-stream",
        "gemini-list",
        "mistral",
        "http-200",
        "llamacpp-overflow",
    ],
)
async def test_each_error_shape_surfaces_the_servers_message(
    live_for: LiveServer, dialect: str, turn: Error, code: grpc.StatusCode, also: str
) -> None:
    async with FakeLLM(turn, dialect=dialect) as fake:
        await initialize(live_for, fake)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await generate(live_for, await new_session(live_for), "go")
    assert caught.value.code() == code, caught.value.details()
    assert turn.message in caught.value.details() and also in caught.value.details()


@pytest.mark.parametrize("dialect", ["groq", "mistral-422"])
async def test_refused_stream_options_are_dropped_and_remembered_per_endpoint(
    live_for: LiveServer, dialect: str
) -> None:
    async with FakeLLM(dialect=dialect) as refusing, FakeLLM(text("elsewhere")) as other:
        await initialize(live_for, refusing)
        refusing.script(tool_call("read_file", {"path": "notes.txt"}), text("one"), text("two"))
        session_id = await new_session(live_for)
        first = await generate(live_for, session_id, "go")
        second = await generate(live_for, session_id, "again")
        assert (first.message.content, second.message.content) == ("one", "two")
        # Asked once with stream_options (refused), then never again at that endpoint.
        assert ["stream_options" in r.body for r in refusing.requests] == [True, False, False, False]
        assert_usage_total(first.usage, second.usage, refusing)  # usage came, from where the server put it

        llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=other.base_url)
        elsewhere = await live_for.stub.CreateSession(
            pb.CreateSessionRequest(config=pb.SessionConfig(llm=llm))
        )
        await generate(live_for, elsewhere.session_id, "go")
        assert other.requests[0].body["stream_options"] == {"include_usage": True}  # another endpoint


def assert_usage_total(first: pb.Usage, second: pb.Usage, fake: FakeLLM) -> None:
    assert first.prompt_tokens + second.prompt_tokens == sum(u["prompt_tokens"] for u in fake.usages)
    assert first.completion_tokens + second.completion_tokens == sum(
        u["completion_tokens"] for u in fake.usages
    )
    assert first.completion_tokens > 0


@pytest.mark.parametrize("dialect", ["deepseek-reasoning", "gemini3-signature"])
async def test_provider_state_goes_back_from_the_store_and_never_shows(
    workspace: Path, tmp_path: Path, dialect: str
) -> None:
    (workspace / "notes.txt").write_text(NOTES)
    settings = agent_settings(workspace, tmp_path / "data")
    async with FakeLLM(dialect=dialect) as fake:
        fake.script(tool_call("read_file", {"path": "notes.txt"}), text("Read."), text("Still here."))
        async with running(settings) as live:
            await initialize(live, fake)
            session_id = await new_session(live)
            reply = await generate(live, session_id, "read the notes")
        assert reply.message.content == "Read."
        shown = [
            reply.message.content,
            *reply.message.metadata.values(),
            *(c.arguments for c in reply.tool_calls),
        ]
        assert not any("step by step" in s or "sig-" in s for s in shown)
        # A new server process reads the session back from the store: the state comes with it
        # (the fake refuses, as the real server does, a tool-call message without it).
        async with running(settings) as live:
            await initialize(live, fake)
            again = await generate(live, session_id, "anything else?")
        assert again.message.content == "Still here."
        assistant = next(m for m in fake.requests[-1].messages if m["role"] == "assistant")
        assert "provider_state" not in assistant and all(
            "provider_state" not in c for c in assistant["tool_calls"]
        )


async def test_provider_state_goes_to_its_own_endpoint_only(workspace: Path, tmp_path: Path) -> None:
    (workspace / "notes.txt").write_text(NOTES)
    async with FakeLLM(dialect="deepseek-reasoning") as deepseek, FakeLLM(text("Plain.")) as plain:
        deepseek.script(tool_call("read_file", {"path": "notes.txt"}), text("Read."))
        async with running(agent_settings(workspace, tmp_path / "data")) as live:
            await initialize(live, deepseek)
            session_id = await new_session(live)
            await generate(live, session_id, "read the notes")
            llm = pb.LLMConfig(provider="openai", model="fake-model", base_url=plain.base_url)
            await live.stub.ConfigureSession(
                pb.ConfigureSessionRequest(session_id=session_id, config=pb.SessionConfig(llm=llm))
            )
            # The strict plain server refuses unknown message fields: reasoning_content must not go there.
            assert (await generate(live, session_id, "and now?")).message.content == "Plain."
        sent = [m for m in plain.requests[0].messages if m["role"] == "assistant"]
        assert sent and all("reasoning_content" not in m for m in sent)


async def _reads(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def _batches(*pieces: bytes) -> list[list[ServerEvent]]:
    return [batch async for batch in event_batches(_reads(*pieces))]


async def _events(*pieces: bytes) -> list[ServerEvent]:
    return [event for batch in await _batches(*pieces) for event in batch]


@pytest.mark.parametrize(
    "pieces",
    [
        (b"data: a\r\n\r\ndata: b\r\n\r\n",),
        (b"data: a\r", b"\n\r", b"\ndata: b\r\n", b"\r\n"),  # CRLF split between reads
        (b"data: a\r\rdata: b\r\r",),  # bare CR
        (b"data: a\r", b"\rdata: b\r", b"\r"),
        (
            b": keep-alive\n\ndata:\n\ndata: a\n\nevent: x\nid: 7\ndata: b\n\n",
        ),  # comments, empty data, other fields
        (b"data: a\n\ndata: b",),  # the last event without its blank line
    ],
)
async def test_sse_framing_in_every_legal_form(pieces: tuple[bytes, ...]) -> None:
    data = [event.data for event in await _events(*pieces) if event.data]
    assert data == ["a", "b"]


async def test_sse_multiline_data_utf8_across_reads_and_the_error_field() -> None:
    caf = "café".encode()
    events = await _events(b'data: {"x":\ndata: "' + caf[:4], caf[4:] + b'"}\n\nerror: {"message": "m"}\n\n')
    assert [(e.data, e.error) for e in events] == [('{"x":\n"café"}', ""), ("", '{"message": "m"}')]


def test_the_fake_takes_a_dialect_on_its_command_line() -> None:
    command = [sys.executable, "-m", "a3s_agent.testing.fake_llm", "--port", "0", "--dialect", "bare-cr",
               "--text", "hi"]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            base_url = proc.stdout.readline().split()[-1]
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
            request = urllib.request.Request(
                f"{base_url}/chat/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as reply:
                raw = reply.read()
            assert b"\n" not in raw and raw.endswith(b"data: [DONE]\r\r") and b'"content":"hi"' in raw
        finally:
            proc.terminate()
        assert proc.wait(timeout=5) == 0
    with pytest.raises(ValueError, match="unknown dialect"):
        FakeLLM(dialect="no-such-server")


@pytest.mark.parametrize(
    "odd",
    [
        b'{"x_groq": "y", "choices": []}',
        b'{"choices": {"index": 0}}',
        b'{"choices": [{"index": 0, "delta": "x"}]}',
        b'{"choices": [{"index": 0, "delta": {"tool_calls": 5}}]}',
        b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "f"}]}}]}',
    ],
    ids=["x_groq", "choices", "delta", "tool_calls", "function"],
)
async def test_a_chunk_part_of_the_wrong_type_is_skipped_not_an_internal_error(
    agent: LiveServer, fake: FakeLLM, odd: bytes
) -> None:
    """A server's chunk whose member has the wrong JSON type counts as without it (as a chunk that is
    no object does): the rest of the reply still comes (a fragment whose `function` is no object is
    a call without name or arguments, refused as any such call, and the model answers again)."""
    rest = b'data: {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}\n\n'
    fake.script(Raw(b"data: " + odd + b"\n\n" + rest + b"data: [DONE]\n\n"), text("ok"))
    session_id = await new_session(agent)
    reply = await agent.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("hi")]))
    assert reply.message.content == "ok"


# --- a network read at a time ------------------------------------------------------------------


async def test_sse_events_come_together_a_network_read_at_a_time() -> None:
    """Each read gives every event it completes in one list; a read that completes none gives none;
    the last event, without its blank line, comes when the stream ends."""
    batches = await _batches(b"data: a\n\ndata: b\n\nda", b"ta: c\r", b"\n\r\n: ping\n\n", b"data: d")
    assert [[event.data for event in batch] for batch in batches] == [["a", "b"], ["c"], ["d"]]


async def test_sse_an_event_split_over_many_reads_comes_whole() -> None:
    """A big event in small reads (a hostile server's, or a long tool argument in one chunk): found
    whole, its multi-byte characters intact wherever the reads cut them."""
    data = ("é" * 300_000).encode()
    stream = b"data: " + data + b"\n\ndata: end\n\n"
    [[big, end]] = await _batches(*(stream[i : i + 1000] for i in range(0, len(stream), 1000)))
    assert big.data == "é" * 300_000 and end.data == "end"


async def test_sse_an_event_never_ended_is_refused_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that streams on without ever ending its event (no blank line) is cut off once the
    event passes MAX_EVENT_BYTES, rather than held in memory for as long as it sends."""
    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", 10_000)
    endless = (b"data: " + b"x" * 999 for _ in range(1_000_000))

    async def reads() -> AsyncIterator[bytes]:
        for read in endless:
            yield read

    with pytest.raises(Unavailable, match="without ending an event"):
        [batch async for batch in event_batches(reads())]
    assert next(endless)  # it stopped reading: most of the stream was never asked for
    events = await _events(b"data: " + b"y" * 9_000 + b"\n\n", b"data: " + b"z" * 9_000 + b"\n\n")
    assert [len(event.data) for event in events] == [9_000, 9_000]  # each under the bound: fine


def _fragment_chunk(fragment: dict[str, Any]) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]}


def _args(text: str) -> dict[str, Any]:
    return {"arguments": text}


_FRAGMENTS = {  # each run of fragments, and the calls it makes
    "indexed": (
        [
            {"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}},
            {"index": 0, "function": _args('{"x"')},
            {"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}},
            {"index": 0, "function": _args(": 1}")},  # interleaved with call 1's
            {"index": 1, "function": _args("{}")},
        ],
        [("f", '{"x": 1}'), ("g", "{}")],
    ),
    "index0, no ids": (
        [
            {"index": 0, "function": {"name": "f", "arguments": ""}},
            {"index": 0, "function": _args("{}")},
            {"index": 0, "function": {"name": "g", "arguments": "{}"}},  # a name, whole arguments: a new call
            {"index": 0, "function": _args("")},
        ],
        [("f", "{}"), ("g", "{}")],
    ),
    "late name": (
        [
            {"index": 0, "id": "a", "function": _args('{"p"')},
            {"index": 0, "function": {"name": "f", "arguments": ": 1"}},
            {"index": 0, "function": _args("}")},
        ],
        [("f", '{"p": 1}')],
    ),
    "arguments before any head": ([{"index": 3, "function": _args('{"q": 2}')}], [("", '{"q": 2}')]),
    "a fragment of a call passed on": (
        [
            {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}},
            {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}},
            {"index": 0, "function": _args("stray")},
        ],
        [("f", "{}"), ("g", "{}")],
    ),
    "odd members": (
        [
            {"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}},
            {"index": 0, "function": {"arguments": {"whole": True}}},  # an object where a string belongs
            {"index": 0, "function": {"arguments": None}},
            {"index": True, "function": _args("x")},  # JSON's true is no index 0 or 1
        ],
        [("f", '{"whole": true}'), ("", "x")],
    ),
}


@pytest.mark.parametrize(("fragments", "calls"), list(_FRAGMENTS.values()), ids=list(_FRAGMENTS))
def test_the_fast_path_for_argument_fragments_reads_them_as_the_general_one(
    fragments: list[dict[str, Any]], calls: list[tuple[str, str]]
) -> None:
    """The bare `{"index": i, "function": {"arguments": ...}}` fragment takes a shortcut; with one
    more member (`type`, which nothing reads) every fragment takes the general path: same events."""

    def events(fragments: list[dict[str, Any]]) -> list[Any]:
        reader = TurnReader("endpoint")
        fed = [event for fragment in fragments for event in reader.feed(_fragment_chunk(fragment))]
        reader.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        return fed + reader.finish()

    fast = events(fragments)
    assert fast == events([{**fragment, "type": "function"} for fragment in fragments])
    assert [(e.name, e.arguments) for e in fast if isinstance(e, ToolCallReady)] == calls


def _piece(text: str) -> str:
    """An OpenAI chunk bringing a piece of call 0's arguments, as json writes it."""
    fragment = {"index": 0, "function": {"arguments": text}}
    return json.dumps({**_CHUNK_HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]})


def _text_piece(text: str, **extra: Any) -> str:
    return json.dumps({**_CHUNK_HEAD, "choices": [{"index": 0, "delta": {"content": text}}], **extra})


def _delta_piece(delta: dict[str, Any]) -> str:
    return json.dumps({**_CHUNK_HEAD, "choices": [{"index": 0, "delta": delta}]})


_CHUNK_HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
_HEAD = json.dumps({**_CHUNK_HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [
    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "write_file", "arguments": ""}}
]}}]})  # fmt: skip
_TRICKY = ['{"p', 'ath": "', "m", '", "content": "', '\\"', "\n\t", "é", "😀", '","', "", "\u2028", "'}"]
_ALIKE = {  # streams of chunk texts: each read with templates must come out as each parsed whole
    "tricky pieces": [_HEAD, *map(_piece, _TRICKY)],
    "escaped and raw non-ASCII": [_HEAD, _piece("a"), _piece("é"), _piece("é").replace("\\u00e9", "é")],
    "a lone surrogate": [_HEAD, _piece("a"), _piece("\ud800"), _piece("b")],
    "two tokens where one was": [
        _HEAD,
        _piece("a"),
        _piece("a").replace('"a"', '"b"}}, {"index": 0, "function": {"arguments": "c"'),
    ],
    "no string where one was": [_HEAD, _piece("a"), _piece("a").replace('"a"', "[1]"), _piece("c")],
    "the piece spelled as the model is": [
        _HEAD,
        _piece("m"),
        _piece("m").replace('"model": "m"', '"model": "q"'),
        _piece("x"),
        _piece("m"),
    ],
    "a new call on the same index": [
        _HEAD,
        _piece("{}"),
        _HEAD.replace("call_a", "call_b").replace("write_file", "grep"),
        _piece("{}"),
    ],
    "text, then a call, then text": [
        _text_piece("Le"),
        _text_piece("t me"),
        _HEAD,
        _piece("{}"),
        _text_piece(" see"),
        _text_piece(""),
    ],
    "a different head": [_text_piece("a"), _text_piece("b").replace('"m"', '"n"'), _text_piece("c")],
    "obfuscated": [_text_piece(p, obfuscation="x" * i) for i, p in enumerate("abcdefgh")],
    "long pieces": [_text_piece(p * 5000) for p in "abc"],
    "reasoning": [
        _delta_piece({"content": None, "reasoning_content": p}) for p in ("Hm", "m, ", "", *"so on")
    ],
    "reasoning, then text": [
        *(_delta_piece({"content": None, "reasoning_content": p}) for p in ("Hm", "m, ", "", "so")),
        *(_delta_piece({"reasoning_content": p}) for p in ("a", "b")),
        *(_delta_piece({"reasoning": p}) for p in ("c", "d")),  # shown, not sent back
        *(_delta_piece({"content": None, "reasoning_content": "e", "reasoning": p}) for p in "fg"),
        _text_piece("The"),
        _text_piece(" answer"),
    ],
}


@pytest.mark.parametrize("texts", list(_ALIKE.values()), ids=list(_ALIKE))
def test_chunks_alike_but_for_their_string_are_read_as_when_parsed_whole(
    texts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a chunk that is only a piece of text or arguments was parsed, a chunk alike but for that
    piece is read without a parse: the events are those of parsing every chunk."""
    finish = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    whole, templated = TurnReader("endpoint"), TurnReader("endpoint")
    expected = [event for text in [*texts, finish] for event in whole.feed(model_json(text))]
    parses: list[str] = []

    def counted(text: str) -> Any:
        parses.append(text)
        return model_json(text)

    for module in (openai_stream, chunk_template):
        monkeypatch.setattr(module, "model_json", counted)
    got = [event for text in [*texts, finish] for event in templated.feed_text(text)]
    assert got + templated.finish() == expected + whole.finish()
    if texts is _ALIKE["tricky pieces"] or texts is _ALIKE["reasoning"]:
        assert len(parses) < len(texts) / 2  # the point: most of them are not parsed
    if texts is _ALIKE["obfuscated"]:
        assert len(parses) <= len(texts) + 2 * 2  # a template that fits none is given up after two
    if texts is _ALIKE["long pieces"]:
        assert len(parses) == len(texts) + 1  # each parsed once (the finish too): none made a template


def _sse(*chunks: dict[str, Any]) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
    )


def _said(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


async def _stream(server: LiveServer, prompt: str) -> list[pb.GenerateChunk]:
    session_id = await new_session(server)
    request = pb.GenerateRequest(session_id=session_id, messages=[user(prompt)])
    return [chunk async for chunk in server.stub.StreamGenerate(request)]


def _shown(chunks: list[pb.GenerateChunk]) -> list[tuple[str, str]]:
    """The text and reasoning chunks a client got, in order."""
    shown = []
    for chunk in chunks:
        if chunk.type == pb.GenerateChunk.CHUNK_TYPE_CONTENT:
            shown.append(("text", chunk.content))
        elif (
            chunk.type == pb.GenerateChunk.CHUNK_TYPE_METADATA and chunk.metadata["type"] == "reasoning_delta"
        ):
            shown.append(("reasoning", chunk.metadata["text"]))
    return shown


async def test_text_written_at_once_reaches_a_client_as_one_chunk_and_apart_as_several(
    agent: LiveServer, fake: FakeLLM
) -> None:
    answer = "The notes say: remember the milk, the eggs and the bread."  # eight 8-character deltas
    fake.script(text(answer), replace(text(answer), chunk_delay=0.005))
    assert _shown(await _stream(agent, "notes?")) == [("text", answer)]
    apart = [said for kind, said in _shown(await _stream(agent, "again?"))]
    assert "".join(apart) == answer and len(apart) > 1  # each delta passed on as it came


async def test_deltas_read_together_are_joined_only_with_their_own_kind(
    agent: LiveServer, fake: FakeLLM
) -> None:
    """Text, reasoning, text in one write: each run joined, the order the model's."""
    reasoning = [_said({"content": None, "reasoning_content": piece}) for piece in ("Hmm, ", "milk.")]
    texts = [_said({"content": piece}) for piece in ("The ", "notes ")]
    after = [_said({"content": piece}) for piece in ("say ", "milk.")]
    fake.script(Raw(_sse(*texts, *reasoning, *after, _said({}, "stop"))))
    chunks = await _stream(agent, "notes?")
    assert _shown(chunks) == [("text", "The notes "), ("reasoning", "Hmm, milk."), ("text", "say milk.")]
    assert chunks[-1].type == pb.GenerateChunk.CHUNK_TYPE_DONE and chunks[-1].content == "The notes say milk."


async def test_a_malformed_chunk_ends_the_reply_after_the_text_read_with_it(
    agent: LiveServer, fake: FakeLLM
) -> None:
    """Text, a chunk that is no JSON, in one read: the text still goes first, then UNAVAILABLE; a
    lone surrogate the model's JSON spells arrives as U+FFFD."""
    fake.script(
        Raw(
            _sse(
                _said({"content": "Half "}),
                _said({"content": "an \ud800"}),  # json.dumps spells it as an escape
            ).removesuffix(b"data: [DONE]\n\n")
            + b"data: {not json\n\n"
        )
    )
    session_id = await new_session(agent)
    request = pb.GenerateRequest(session_id=session_id, messages=[user("go")])
    said = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for chunk in agent.stub.StreamGenerate(request):
            if chunk.type == pb.GenerateChunk.CHUNK_TYPE_CONTENT:
                said.append(chunk.content)
    assert said == ["Half an \ufffd"]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE and "malformed chunk" in caught.value.details()
