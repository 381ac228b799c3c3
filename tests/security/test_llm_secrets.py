"""The operator's LLM key stays with the operator's endpoint; provider errors never carry it on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM, Raw, error, text

from ..conftest import user
from ..fault.conftest import LoggedServer

pytestmark = pytest.mark.security

OPERATOR_KEY = "sk-operator-0123456789abcdefSECRET"


@pytest.fixture
def operator_llm() -> Iterator[FakeLLM]:
    with FakeLLM(fallback=text("from the operator's model"), api_key=OPERATOR_KEY) as fake:
        yield fake


@pytest.fixture
def client_llm() -> Iterator[FakeLLM]:
    """An endpoint a client names: it must never see the operator's key."""
    with FakeLLM(fallback=text("from the client's model")) as fake:
        yield fake


@pytest.fixture
def server(tmp_path: Path, operator_llm: FakeLLM) -> Iterator[LoggedServer]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        "A3S_LLM_BASE_URL": operator_llm.base_url,
        "A3S_LLM_API_KEY": OPERATOR_KEY,
        "A3S_LLM_MODEL": "fake-model",
        "A3S_LLM_RETRIES": "0",
    }
    process = LoggedServer(workspace, tmp_path / "data", tmp_path / "server.log", env=env).start()
    yield process
    process.kill()


def _stub(server: LoggedServer) -> Iterator[pb_grpc.CodeAgentServiceStub]:
    with server.channel() as channel:
        yield pb_grpc.CodeAgentServiceStub(channel)


@pytest.fixture
def stub(server: LoggedServer) -> Iterator[pb_grpc.CodeAgentServiceStub]:
    yield from _stub(server)


def _generate(stub: pb_grpc.CodeAgentServiceStub, llm: pb.LLMConfig | None = None) -> pb.GenerateResponse:
    session = stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(llm=llm))).session_id
    return stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("hi")]), timeout=20)


def _log_once_it_has(server: LoggedServer, needle: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while needle not in (log := server.log()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert needle in log, log[-2000:]
    return log


def _carries_key(fake: FakeLLM) -> bool:
    return any(OPERATOR_KEY in value for request in fake.requests for value in request.headers.values())


def test_a_session_without_its_own_endpoint_uses_the_operators_key(
    stub: pb_grpc.CodeAgentServiceStub, operator_llm: FakeLLM
) -> None:
    reply = _generate(stub, pb.LLMConfig(model="fake-model"))
    assert reply.message.content == "from the operator's model"
    assert operator_llm.requests[-1].authorization == f"Bearer {OPERATOR_KEY}"


def test_a_session_naming_its_own_endpoint_gets_no_key(
    stub: pb_grpc.CodeAgentServiceStub, client_llm: FakeLLM
) -> None:
    reply = _generate(stub, pb.LLMConfig(base_url=client_llm.base_url))
    assert reply.message.content == "from the client's model"
    assert client_llm.requests and not _carries_key(client_llm)
    assert client_llm.requests[-1].authorization is None


def test_initialize_naming_its_own_endpoint_gets_no_key(
    stub: pb_grpc.CodeAgentServiceStub, client_llm: FakeLLM
) -> None:
    stub.Initialize(
        pb.InitializeRequest(config=pb.AgentConfig(llm=pb.LLMConfig(base_url=client_llm.base_url)))
    )
    assert _generate(stub).message.content == "from the client's model"
    assert client_llm.requests and not _carries_key(client_llm)


def test_a_provider_name_alone_does_not_carry_the_key_elsewhere(
    stub: pb_grpc.CodeAgentServiceStub, client_llm: FakeLLM
) -> None:
    """Another provider with the client's endpoint: the key stays home."""
    _generate(stub, pb.LLMConfig(provider="deepseek", model="m", base_url=client_llm.base_url))
    assert client_llm.requests and not _carries_key(client_llm)


def test_another_provider_named_without_an_endpoint_is_not_sent_to_the_operators(
    stub: pb_grpc.CodeAgentServiceStub, operator_llm: FakeLLM
) -> None:
    """`provider: anthropic` with its own key means Anthropic's API: neither the request nor the
    session's key goes to the operator's (OpenAI-compatible) endpoint."""
    session_key = "sk-ant-session-0123456789abcdef"
    with pytest.raises(grpc.RpcError) as caught:  # Anthropic's API is not reachable from here
        _generate(stub, pb.LLMConfig(provider="anthropic", model="claude-x", api_key=session_key))
    assert "api.anthropic.com" in (caught.value.details() or ""), caught.value.details()
    assert not operator_llm.requests


def test_a_reconfigured_endpoint_does_not_take_the_sessions_key_along(
    stub: pb_grpc.CodeAgentServiceStub, operator_llm: FakeLLM, client_llm: FakeLLM
) -> None:
    session = stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(llm=pb.LLMConfig(base_url=operator_llm.base_url, api_key=OPERATOR_KEY))
        )
    ).session_id
    stub.ConfigureSession(
        pb.ConfigureSessionRequest(
            session_id=session, config=pb.SessionConfig(llm=pb.LLMConfig(base_url=client_llm.base_url))
        )
    )
    stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("hi")]), timeout=20)
    assert client_llm.requests and not _carries_key(client_llm)


def test_a_provider_error_quoting_the_key_is_redacted_everywhere(
    server: LoggedServer, stub: pb_grpc.CodeAgentServiceStub, operator_llm: FakeLLM
) -> None:
    operator_llm.script(
        error(401, f"Incorrect API key provided: {OPERATOR_KEY}. Find yours at https://example.invalid.")
    )
    with pytest.raises(grpc.RpcError) as failure:
        _generate(stub, pb.LLMConfig(model="fake-model"))
    assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "rejected the API key" in failure.value.details()
    operator_llm.script(error(400, f"bad request from key {OPERATOR_KEY[:12]}****{OPERATOR_KEY[-8:]}"))
    with pytest.raises(grpc.RpcError) as failure:
        _generate(stub, pb.LLMConfig(model="fake-model"))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = failure.value.details()
    assert "[redacted]" in details and OPERATOR_KEY[-8:] not in details
    log = _log_once_it_has(server, "status=INVALID_ARGUMENT")
    assert OPERATOR_KEY not in log and OPERATOR_KEY[-8:] not in log
    stored = b"".join(path.read_bytes() for path in server.data_dir.rglob("*") if path.is_file())
    assert OPERATOR_KEY.encode() not in stored and OPERATOR_KEY[-8:].encode() not in stored


@pytest.mark.parametrize(
    "reply",
    [
        Raw(
            b'data: {"choices": [{"index": 0, "delta": {"content": "caf\xe9 \xff"}}]}\n\n'
            b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
            b"data: [DONE]\n\n"
        ),
        Raw(
            b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "caf\xe9 \xff"},'
            b' "finish_reason": "stop"}]}',
            content_type="application/json",
        ),
    ],
    ids=["stream", "json"],
)
def test_invalid_utf8_from_the_provider_is_replaced_not_fatal(
    stub: pb_grpc.CodeAgentServiceStub, operator_llm: FakeLLM, reply: Raw
) -> None:
    operator_llm.script(reply)
    answer = _generate(stub, pb.LLMConfig(model="fake-model")).message.content
    assert answer.startswith("caf") and "\ufffd" in answer
