"""LLM credentials that cannot work are said at once, through the real server: a public model API
named without any key (the README's quick-start Initialize), and a base_url carrying
`user:password@` next to an api_key, which an OpenAI-compatible endpoint would get both as its
Authorization header. Nothing is sent anywhere first: an HTTPS proxy in the server's environment
counts the connections the server tries."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_llm import FakeLLM, text

from ..conftest import LiveServer, agent_settings, running, user
from ..test_http import serving

pytestmark = pytest.mark.security

NO_OPENAI_KEY = "no API key is configured for https://api.openai.com/v1: send config.llm.api_key"
CLASH = (
    "config.llm: base_url carries credentials (user:password@) and api_key is set, and an"
    " OpenAI-compatible endpoint takes each as its Authorization header: give one of them"
)


class CountingProxy:
    """An HTTP proxy that counts the connections made to it and refuses each (407)."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


@pytest.fixture
async def proxy(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CountingProxy]:
    counting = CountingProxy()
    async with counting as url:
        for name in ("NO_PROXY", "no_proxy", "https_proxy", "http_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", url)
        yield counting


@pytest.fixture
async def server(workspace: Path, tmp_path: Path) -> AsyncIterator[LiveServer]:
    """A server with no LLM settings of its own (no key in its environment)."""
    async with running(agent_settings(workspace, tmp_path / "data")) as live:
        yield live


async def failure(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


def generate(server: LiveServer, session_id: str) -> Awaitable[pb.GenerateResponse]:
    return server.stub.Generate(pb.GenerateRequest(session_id=session_id, messages=[user("hi")]))


async def test_the_quick_start_initialize_without_a_key_says_so_at_once(
    server: LiveServer, proxy: CountingProxy
) -> None:
    llm = pb.LLMConfig(provider="openai", model="gpt-4o-mini")
    reply = await server.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=llm)))
    assert reply.success and NO_OPENAI_KEY in reply.message
    session = (await server.stub.CreateSession(pb.CreateSessionRequest())).session_id
    error = await failure(generate(server, session))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert (error.details() or "").startswith(NO_OPENAI_KEY)
    streamed = server.stub.StreamGenerate(pb.GenerateRequest(session_id=session, messages=[user("hi")]))
    error = await failure(streamed.read())
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert (error.details() or "").startswith(NO_OPENAI_KEY)
    # Anthropic's public API, named by a session, the same.
    claude = pb.LLMConfig(provider="anthropic", model="claude-sonnet-4-5")
    other = (
        await server.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(llm=claude)))
    ).session_id
    error = await failure(generate(server, other))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert (error.details() or "").startswith("no API key is configured for https://api.anthropic.com:")
    assert proxy.connections == 0  # nothing was tried
    # With a key the model is called (here: its proxy refuses).
    keyed = pb.SessionConfig(llm=pb.LLMConfig(api_key="sk-test"))
    await server.stub.ConfigureSession(pb.ConfigureSessionRequest(session_id=session, config=keyed))
    error = await failure(generate(server, session))
    assert "refused the request (HTTP 407" in (error.details() or "")
    assert proxy.connections == 1


async def test_url_credentials_with_a_key_are_refused_where_they_cannot_go_together(
    server: LiveServer, fake: FakeLLM
) -> None:
    clashing = pb.LLMConfig(
        provider="openai", model="fake-model", base_url=fake.base_url.replace("//", "//u:p@", 1), api_key="k"
    )
    calls = [
        server.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(llm=clashing))),
        server.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=clashing))),
    ]
    session = (await server.stub.CreateSession(pb.CreateSessionRequest())).session_id
    calls.append(
        server.stub.ConfigureSession(
            pb.ConfigureSessionRequest(session_id=session, config=pb.SessionConfig(llm=clashing))
        )
    )
    for call in calls:
        error = await failure(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details() == CLASH
    async with serving(server) as http:
        body = {
            "config": {
                "llm": {"provider": "openai", "model": "m", "base_url": clashing.base_url, "api_key": "k"}
            }
        }
        answer = await http.client.post("/sessions", json=body)
        assert answer.status == 400, await answer.text()
        assert (await answer.json())["error"]["message"] == CLASH
    # Given in two layers (the URL by Initialize, the key by the session), the clash is said at
    # Generate, before any connection.
    fake.script(text("hello"))
    url_only = pb.LLMConfig(provider="openai", model="fake-model", base_url=clashing.base_url)
    await server.stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(llm=url_only)))
    reply = await generate(server, session)
    assert reply.message.content == "hello"
    assert fake.requests[-1].authorization == "Basic " + base64.b64encode(b"u:p").decode()
    await server.stub.ConfigureSession(
        pb.ConfigureSessionRequest(session_id=session, config=pb.SessionConfig(llm=pb.LLMConfig(api_key="k")))
    )
    error = await failure(generate(server, session))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert error.details() == "the LLM config: " + CLASH.removeprefix("config.llm: ")
    assert len(fake.requests) == 1
    # Anthropic's API takes the key as x-api-key: both go.
    async with FakeAnthropic(api_key="sk-ant-test") as claude:
        claude.script(text("hello"))
        llm = pb.LLMConfig(
            provider="anthropic",
            model="claude-sonnet-4-5",
            base_url=claude.base_url.replace("//", "//u:p@", 1),
            api_key="sk-ant-test",
        )
        other = (
            await server.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(llm=llm)))
        ).session_id
        reply = await generate(server, other)
        assert reply.message.content == "hello"
        [request] = claude.requests
        assert request.headers["x-api-key"] == "sk-ant-test"
        assert request.headers["authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
