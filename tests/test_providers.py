"""The provider configuration group (a3s-string-dialect.md 4.4) over a real grpc.aio channel with the
later dialect's stubs, on SQLite and PostgreSQL: entries kept, listed, changed and removed, sessions
naming one reaching its endpoint with its key, the default model serving sessions that name none,
keys never answered nor logged nor stored unless the operator says so, keys and references staying
with their endpoint, and bad input named."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.base.models import LLMConfig
from a3s_agent.base.providers import KeyReference
from a3s_agent.config import ProviderKeySettings, Settings
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_anthropic import FakeAnthropic
from a3s_agent.testing.fake_llm import FakeLLM, text

from .conftest import LiveServer, ServerProcess, agent_settings, eventually, running

Stub = later_grpc.CodeAgentServiceStub
CLAUDE = later.ModelInfo(
    id="claude-sonnet-4-20250514",
    name="Claude Sonnet 4",
    family="claude-sonnet",
    tool_call=True,
    attachment=True,
    cost=later.ModelCostInfo(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75),
    limit=later.ModelLimitInfo(context=200000, output=8192),
    modalities=later.ModelModalitiesInfo(input=["text", "image"], output=["text"]),
)


@pytest.fixture(params=["sqlite", "postgresql"])
def settings_for(request: pytest.FixtureRequest, workspace: Path, tmp_path: Path) -> Callable[..., Settings]:
    """Settings of a server (named, so that two are replicas) on the store under test."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else ""

    def settings(name: str = "a", **fields: Any) -> Settings:
        data = tmp_path / f"data-{name if url else 'a'}"
        return replace(agent_settings(workspace, data), store=url, replica_id=name, **fields)

    return settings


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[LiveServer, Stub]]:
    async with running(settings) as live:
        yield live, later_grpc.CodeAgentServiceStub(live.channel)


def provider(
    name: str, base_url: str | None = None, api_key: str | None = None, *models: str
) -> later.ProviderInfo:
    return later.ProviderInfo(
        name=name, base_url=base_url, api_key=api_key, models=[later.ModelInfo(id=m) for m in models]
    )


async def add(stub: Stub, info: later.ProviderInfo) -> later.AddProviderResponse:
    reply = await stub.AddProvider(later.AddProviderRequest(provider=info))
    assert reply.success and not reply.error
    return reply


async def generate(stub: Stub, llm: later.LLMConfig | None = None) -> str:
    config = later.SessionConfig(llm=llm) if llm is not None else later.SessionConfig()
    session_id = (await stub.CreateSession(later.CreateSessionRequest(config=config))).session_id
    message = later.Message(role="user", content="hello")
    reply = await stub.Generate(later.GenerateRequest(session_id=session_id, messages=[message]))
    return reply.message.content


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


# --- the entries ------------------------------------------------------------------------------


async def test_entries_are_kept_listed_changed_removed_and_shared(
    settings_for: Callable[..., Settings],
) -> None:
    async with serving(settings_for("a")) as (live, stub):
        assert "providers" in (await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())).features
        assert list((await stub.ListProviders(later.ListProvidersRequest())).providers) == []
        added = await add(
            stub, later.ProviderInfo(name="anthropic", base_url="https://api.anthropic.com", models=[CLAUDE])
        )
        assert added.provider == later.ProviderInfo(
            name="anthropic", base_url="https://api.anthropic.com", models=[CLAUDE]
        )
        await add(stub, provider("kimi", "https://kimi.example/v1", None, "kimi-k2", "kimi-k1"))
        listed = await stub.ListProviders(later.ListProvidersRequest())
        assert [p.name for p in listed.providers] == ["anthropic", "kimi"]
        assert not listed.HasField("default_provider") and not listed.HasField("default_model")
        got = (await stub.GetProvider(later.GetProviderRequest(name="kimi"))).provider
        assert [m.id for m in got.models] == ["kimi-k2", "kimi-k1"]

        moved = await stub.UpdateProvider(
            later.UpdateProviderRequest(
                provider=later.ProviderInfo(name="kimi", base_url="https://kimi.example/v2/")
            )
        )
        assert moved.success and moved.provider.base_url == "https://kimi.example/v2"
        assert [m.id for m in moved.provider.models] == ["kimi-k2", "kimi-k1"]  # no models given: kept
        chosen = await stub.SetDefaultModel(later.SetDefaultModelRequest(provider="kimi", model="kimi-k1"))
        assert (chosen.success, chosen.provider, chosen.model) == (True, "kimi", "kimi-k1")
        if live.runtime.store.shared:  # a replica on the same database sees them
            async with serving(settings_for("b")) as (_, replica):
                default = await replica.GetDefaultModel(later.GetDefaultModelRequest())
                assert (default.provider, default.model) == ("kimi", "kimi-k1")
                await replica.RemoveProvider(later.RemoveProviderRequest(name="anthropic"))

                async def gone() -> bool:
                    names = [
                        p.name for p in (await stub.ListProviders(later.ListProvidersRequest())).providers
                    ]
                    return names == ["kimi"] and live.runtime.provider_settings.expand(
                        LLMConfig(provider="anthropic")
                    ) == LLMConfig(provider="anthropic")

                await eventually(gone, "the first replica forgets the entry the second removed")
    async with serving(settings_for("a")) as (live, stub):  # started again on the same store
        listed = await stub.ListProviders(later.ListProvidersRequest())
        names = ["kimi"] if live.runtime.store.shared else ["anthropic", "kimi"]
        assert [p.name for p in listed.providers] == names
        assert (listed.default_provider, listed.default_model) == ("kimi", "kimi-k1")
        removed = await stub.RemoveProvider(later.RemoveProviderRequest(name="kimi"))
        assert removed.success
        default = await stub.GetDefaultModel(later.GetDefaultModelRequest())  # went with its entry
        assert not default.HasField("provider") and not default.HasField("model")


# --- sessions use them ------------------------------------------------------------------------


async def test_a_session_naming_an_entry_reaches_it_with_its_key(
    settings_for: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    """Keys not stored (the default): kept in the memory of the server given them, never answered,
    never logged, not in the store; after a restart the entry is there without its key."""
    caplog.set_level(logging.DEBUG)
    key = "sk-kimi-0123456789abcdef"
    async with FakeLLM(fallback=text("from kimi")) as kimi, serving(settings_for("a")) as (live, stub):
        added = await add(stub, provider("kimi", kimi.base_url, key, "kimi-k2"))
        assert not added.provider.HasField("api_key")
        assert await generate(stub, later.LLMConfig(provider="kimi")) == "from kimi"
        assert kimi.requests[-1].authorization == f"Bearer {key}"
        assert kimi.requests[-1].model == "kimi-k2"  # the entry's first model
        listed = await stub.ListProviders(later.ListProvidersRequest())
        got = await stub.GetProvider(later.GetProviderRequest(name="kimi"))
        assert key not in f"{listed}{got}"
        assert key not in caplog.text
        if not live.runtime.store.shared:
            assert key.encode() not in b"".join(
                p.read_bytes() for p in live.runtime.settings.resolved_data_dir.glob("sessions.db*")
            )
    async with FakeLLM(fallback=text("from kimi")) as kimi, serving(settings_for("a")) as (live, stub):
        await stub.UpdateProvider(
            later.UpdateProviderRequest(provider=later.ProviderInfo(name="kimi", base_url=kimi.base_url))
        )
        assert await generate(stub, later.LLMConfig(provider="kimi", model="kimi-k2")) == "from kimi"
        assert kimi.requests[-1].authorization is None  # its key was not stored


async def test_stored_keys_where_the_operator_allows_it_and_the_anthropic_protocol(
    settings_for: Callable[..., Settings],
) -> None:
    key = "sk-ant-stored-0123456789"
    stored = ProviderKeySettings(stored=True)
    async with FakeAnthropic(fallback=text("from claude"), api_key=key) as claude:
        async with serving(settings_for("a", provider_keys=stored)) as (_, stub):
            info = later.ProviderInfo(
                name="anthropic", base_url=claude.base_url, api_key=key, models=[CLAUDE]
            )
            assert not (await add(stub, info)).provider.HasField("api_key")
        async with serving(settings_for("a", provider_keys=stored)) as (_, stub):  # a restart keeps it
            assert await generate(stub, later.LLMConfig(provider="anthropic")) == "from claude"
        assert claude.requests[-1].headers["x-api-key"] == key
        assert claude.requests[-1].body["model"] == CLAUDE.id


async def test_the_default_model_serves_sessions_naming_none_and_the_operators_model_stays(
    settings_for: Callable[..., Settings],
) -> None:
    async with (
        FakeLLM(fallback=text("from the operator's")) as own,
        FakeLLM(fallback=text("from the default")) as other,
    ):
        operator = LLMConfig(model="own-model", base_url=own.base_url, api_key="sk-operator-0123456789")
        async with serving(settings_for("a", llm=operator)) as (_, stub):
            default = await stub.GetDefaultModel(later.GetDefaultModelRequest())
            assert (default.provider, default.model) == ("openai", "own-model")
            await add(stub, provider("other", other.base_url, "sk-other-0123456789", "m1", "m2"))
            assert await generate(stub) == "from the operator's"  # no default set: the operator's
            await stub.SetDefaultModel(later.SetDefaultModelRequest(provider="other", model="m2"))
            assert await generate(stub) == "from the default"
            assert (other.requests[-1].model, other.requests[-1].authorization) == (
                "m2",
                "Bearer sk-other-0123456789",
            )
            # A session naming its own model takes the default's endpoint with it.
            assert await generate(stub, later.LLMConfig(model="m1")) == "from the default"
            assert other.requests[-1].model == "m1"
            await stub.RemoveProvider(later.RemoveProviderRequest(name="other"))
            assert await generate(stub) == "from the operator's"
            assert own.requests[-1].authorization == "Bearer sk-operator-0123456789"
            assert all(r.authorization != "Bearer sk-operator-0123456789" for r in other.requests)


# --- keys stay with their endpoint --------------------------------------------------------------


async def test_moving_an_entry_or_a_session_elsewhere_takes_no_key_along(
    workspace: Path, tmp_path: Path
) -> None:
    key = "sk-kimi-bound-0123456789"
    settings = replace(
        agent_settings(workspace, tmp_path / "data"), provider_keys=ProviderKeySettings(stored=True)
    )
    async with (
        FakeLLM(fallback=text("kimi")) as kimi,
        FakeLLM(fallback=text("elsewhere")) as elsewhere,
        serving(settings) as (_, stub),
    ):
        await add(stub, provider("kimi", kimi.base_url, key, "kimi-k2"))
        # A session naming the entry but another endpoint gets nothing of the entry's.
        llm = later.LLMConfig(provider="kimi", model="kimi-k2", base_url=elsewhere.base_url)
        assert await generate(stub, llm) == "elsewhere"
        assert elsewhere.requests[-1].authorization is None
        # Moving the entry without giving a key drops its key.
        moved = later.ProviderInfo(name="kimi", base_url=elsewhere.base_url)
        await stub.UpdateProvider(later.UpdateProviderRequest(provider=moved))
        assert await generate(stub, later.LLMConfig(provider="kimi")) == "elsewhere"
        assert elsewhere.requests[-1].authorization is None
        # Moving it back does not bring the key back either.
        back = later.ProviderInfo(name="kimi", base_url=kimi.base_url)
        await stub.UpdateProvider(later.UpdateProviderRequest(provider=back))
        assert await generate(stub, later.LLMConfig(provider="kimi")) == "kimi"
        assert kimi.requests[-1].authorization is None
        assert all(key not in str(r.headers) for r in elsewhere.requests)


async def test_a_key_a_session_or_initialize_brings_stays_where_it_was_given_for(
    workspace: Path, tmp_path: Path
) -> None:
    """Keys given with a config naming an entry go to the entry's endpoint of that moment; keys
    given before an entry of that name existed go where they went then. No entry added or moved
    later takes them elsewhere."""
    async with (
        FakeLLM(fallback=text("own")) as own,
        FakeLLM(fallback=text("kimi")) as kimi,
        FakeLLM(fallback=text("evil")) as evil,
    ):
        operator = LLMConfig(provider="openai", model="own-model", base_url=own.base_url)
        async with serving(replace(agent_settings(workspace, tmp_path / "data"), llm=operator)) as (
            live,
            stub,
        ):
            session_key = "sk-session-0123456789"
            await add(stub, provider("kimi", kimi.base_url, None, "kimi-k2"))
            config = later.SessionConfig(llm=later.LLMConfig(provider="kimi", api_key=session_key))
            for_kimi = (await stub.CreateSession(later.CreateSessionRequest(config=config))).session_id
            config = later.SessionConfig(llm=later.LLMConfig(provider="openai", api_key=session_key))
            for_own = (await stub.CreateSession(later.CreateSessionRequest(config=config))).session_id
            init = pb.InitializeRequest(config=pb.AgentConfig(llm=pb.LLMConfig(api_key="sk-init-0123456789")))
            await live.stub.Initialize(init)
            # A client moves kimi, and adds an entry named as the operator's provider, both to evil.
            moved = later.ProviderInfo(name="kimi", base_url=evil.base_url)
            await stub.UpdateProvider(later.UpdateProviderRequest(provider=moved))
            await add(stub, provider("openai", evil.base_url, None, "gpt"))
            message = later.Message(role="user", content="hello")
            for session_id, answer in [(for_kimi, "kimi"), (for_own, "own")]:
                request = later.GenerateRequest(session_id=session_id, messages=[message])
                assert (await stub.Generate(request)).message.content == answer
            assert kimi.requests[-1].authorization == f"Bearer {session_key}"
            assert own.requests[-1].authorization == f"Bearer {session_key}"
            assert await generate(stub) == "own"  # Initialize's key, for the operator's endpoint
            assert own.requests[-1].authorization == "Bearer sk-init-0123456789"
            assert evil.requests == []


async def test_references_resolve_only_as_the_operator_listed_them(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAM_KIMI_KEY", "sk-from-env-0123456789")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-0123456789")
    key_file = tmp_path / "kimi.key"
    key_file.write_text("sk-from-file-0123456789\n")
    async with FakeLLM(fallback=text("kimi")) as kimi, FakeLLM(fallback=text("evil")) as evil:
        listed = {
            KeyReference("env", "TEAM_KIMI_KEY"): kimi.base_url,
            KeyReference("file", str(key_file)): kimi.base_url,
        }
        settings = replace(
            agent_settings(workspace, tmp_path / "data"), provider_keys=ProviderKeySettings(references=listed)
        )
        async with serving(settings) as (_, stub):
            for url, reference in [
                (evil.base_url, "${env:AWS_SECRET_ACCESS_KEY}"),
                (evil.base_url, "${file:/etc/shadow}"),
                (evil.base_url, "${env:TEAM_KIMI_KEY}"),  # listed, but for another endpoint
                (evil.base_url, f"${{file:{key_file}}}"),
                (evil.base_url, "env:TEAM_KIMI_KEY"),  # not a reference, nor taken for a key
                (evil.base_url, "file:/etc/shadow"),
                (kimi.base_url, "${env:HOME}"),
            ]:
                call = stub.AddProvider(
                    later.AddProviderRequest(provider=provider("evil", url, reference, "m"))
                )
                code, details = await status_of(call)
                assert code == grpc.StatusCode.INVALID_ARGUMENT and "provider.api_key" in details, reference
            assert list((await stub.ListProviders(later.ListProvidersRequest())).providers) == []

            added = await add(stub, provider("kimi", kimi.base_url, "${env:TEAM_KIMI_KEY}", "kimi-k2"))
            assert added.provider.api_key == "${env:TEAM_KIMI_KEY}"  # the reference, never the key
            assert await generate(stub, later.LLMConfig(provider="kimi")) == "kimi"
            assert kimi.requests[-1].authorization == "Bearer sk-from-env-0123456789"
            from_file = later.ProviderInfo(name="kimi", api_key=f"${{file:{key_file}}}")
            await stub.UpdateProvider(later.UpdateProviderRequest(provider=from_file))
            assert await generate(stub, later.LLMConfig(provider="kimi")) == "kimi"
            assert kimi.requests[-1].authorization == "Bearer sk-from-file-0123456789"
            # A client moving the entry elsewhere, or naming it with another endpoint, sends no key.
            moved = later.ProviderInfo(name="kimi", base_url=evil.base_url)
            await stub.UpdateProvider(later.UpdateProviderRequest(provider=moved))
            assert not (await stub.GetProvider(later.GetProviderRequest(name="kimi"))).provider.HasField(
                "api_key"
            )
            assert await generate(stub, later.LLMConfig(provider="kimi")) == "evil"
            assert [r.authorization for r in evil.requests] == [None]


# --- bad input ----------------------------------------------------------------------------------


async def test_bad_input_is_named(settings_for: Callable[..., Settings]) -> None:
    async with serving(settings_for("a")) as (_, stub):
        await add(stub, provider("kimi", "https://kimi.example/v1", None, "kimi-k2"))
        not_found = [
            stub.GetProvider(later.GetProviderRequest(name="nobody")),
            stub.RemoveProvider(later.RemoveProviderRequest(name="nobody")),
            stub.UpdateProvider(
                later.UpdateProviderRequest(provider=provider("nobody", "https://x.example"))
            ),
            stub.SetDefaultModel(later.SetDefaultModelRequest(provider="nobody", model="m")),
        ]
        for call in not_found:
            code, details = await status_of(call)
            assert code == grpc.StatusCode.NOT_FOUND and "nobody" in details
        code, details = await status_of(stub.AddProvider(later.AddProviderRequest(provider=provider("kimi"))))
        assert code == grpc.StatusCode.ALREADY_EXISTS and "kimi" in details
        for call in [
            stub.GetProvider(later.GetProviderRequest()),
            stub.RemoveProvider(later.RemoveProviderRequest()),
            stub.UpdateProvider(
                later.UpdateProviderRequest(provider=later.ProviderInfo(base_url="https://x.example"))
            ),
        ]:
            code, details = await status_of(call)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "name is required" in details, details
        invalid = {
            "provider is required": later.AddProviderRequest(),
            "provider.name": later.AddProviderRequest(provider=provider("two words")),
            "provider.name 'relay'": later.AddProviderRequest(provider=provider("relay")),
            "provider.base_url": later.AddProviderRequest(provider=provider("a", "ftp://files.example")),
            "provider.base_url must not carry credentials": later.AddProviderRequest(
                provider=provider("a", "https://user:pw@llm.example/v1")
            ),
            "provider.models[1].id 'm' is listed twice": later.AddProviderRequest(
                provider=provider("a", None, None, "m", "m")
            ),
            "provider.models[0].api_key": later.AddProviderRequest(
                provider=later.ProviderInfo(name="a", models=[later.ModelInfo(id="m", api_key="sk-x")])
            ),
        }
        for expected, request in invalid.items():
            code, details = await status_of(stub.AddProvider(request))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and expected in details, details
        for request, expected in [
            (
                later.SetDefaultModelRequest(provider="kimi", model="gpt-4"),
                "not one of kimi's models: kimi-k2",
            ),
            (later.SetDefaultModelRequest(provider="kimi"), "model is required"),
            (later.SetDefaultModelRequest(model="m"), "provider is required"),
        ]:
            code, details = await status_of(stub.SetDefaultModel(request))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and expected in details, details
        assert [p.name for p in (await stub.ListProviders(later.ListProvidersRequest())).providers] == [
            "kimi"
        ]


def test_a_served_process_resolves_a_listed_variable_it_withholds_from_its_tools(tmp_path: Path) -> None:
    """`a3s-agent serve` takes the variables A3S_PROVIDER_KEY_REFS names out of its environment (no
    tool inherits them) and still sends their value to the endpoint listed with them."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with FakeLLM(fallback=text("kimi")) as kimi:
        env = {
            "A3S_PROVIDER_KEY_REFS": f"env:TEAM_LLM_KEY={kimi.base_url}",
            "TEAM_LLM_KEY": "sk-team-0123456789",
        }
        server = ServerProcess(workspace, tmp_path / "data", env=env).start()
        try:
            with server.channel() as channel:
                stub = later_grpc.CodeAgentServiceStub(channel)
                info = provider("kimi", kimi.base_url, "${env:TEAM_LLM_KEY}", "kimi-k2")
                assert stub.AddProvider(later.AddProviderRequest(provider=info), timeout=10).success
                config = later.SessionConfig(llm=later.LLMConfig(provider="kimi"))
                session_id = stub.CreateSession(
                    later.CreateSessionRequest(config=config), timeout=10
                ).session_id
                message = later.Message(role="user", content="hello")
                request = later.GenerateRequest(session_id=session_id, messages=[message])
                assert stub.Generate(request, timeout=30).message.content == "kimi"
            assert kimi.requests[-1].authorization == "Bearer sk-team-0123456789"
            assert server.proc is not None
            assert b"sk-team-0123456789" not in Path(f"/proc/{server.proc.pid}/environ").read_bytes()
        finally:
            server.stop()
