"""Session RPCs through a real client: success and failure paths."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import LiveServer


async def _status_of(call: Awaitable[object]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code()


def directories(top: Path) -> list[Path]:
    """Every directory below `top`, symlinks not followed."""
    return sorted(path for path in top.rglob("*") if path.is_dir() and not path.is_symlink())


async def test_create_with_generated_id_then_get_and_list(live: LiveServer) -> None:
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(name="first", system_prompt="be brief"))
    )
    assert created.session_id and created.session.session_id == created.session_id
    session = created.session
    assert session.state == pb.SESSION_STATE_ACTIVE
    assert session.config.name == "first" and session.config.system_prompt == "be brief"
    assert session.config.workspace == str(live.workspace.resolve())
    assert session.created_at == session.updated_at > 1_600_000_000_000  # Unix milliseconds
    got = await live.stub.GetSession(pb.GetSessionRequest(session_id=created.session_id))
    assert got.session == session
    listed = await live.stub.ListSessions(pb.ListSessionsRequest())
    assert [s.session_id for s in listed.sessions] == [created.session_id]


async def test_caller_chosen_id_and_duplicate(live: LiveServer) -> None:
    created = await live.stub.CreateSession(pb.CreateSessionRequest(session_id="team.a:task-1_x"))
    assert created.session_id == "team.a:task-1_x"
    code = await _status_of(live.stub.CreateSession(pb.CreateSessionRequest(session_id="team.a:task-1_x")))
    assert code == grpc.StatusCode.ALREADY_EXISTS


@pytest.mark.parametrize("bad_id", ["has space", "slash/no", "x" * 129, "ünïcode", "semi;colon"])
async def test_invalid_session_ids_are_refused(live: LiveServer, bad_id: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.CreateSession(pb.CreateSessionRequest(session_id=bad_id))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "session_id" in err.value.details()


async def test_relative_workspaces_resolve_in_the_server_workspace_and_missing_ones_outside_are_refused(
    live: LiveServer, tmp_path: Path
) -> None:
    (live.workspace / "sub").mkdir()
    created = await live.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(workspace="sub")))
    assert created.session.config.workspace == str((live.workspace / "sub").resolve())
    # Outside the workspace root (here the workspace) a missing directory is refused, not created
    # (inside it is created since issue 18: test_a_missing_workspace_in_the_root_is_created).
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.CreateSession(
            pb.CreateSessionRequest(config=pb.SessionConfig(workspace=str(tmp_path / "missing")))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.workspace" in err.value.details()
    assert not (tmp_path / "missing").exists()


async def test_a_missing_workspace_in_the_root_is_created(live: LiveServer) -> None:
    """As A3S, which stored the path and created the directory on use."""
    root = live.workspace.resolve()
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(workspace="projects/new"))
    )
    assert created.session.config.workspace == str(root / "projects" / "new")
    assert (root / "projects" / "new").is_dir()
    listed = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(session_id=created.session_id, tool_name="list_files", arguments="{}")
    )
    assert listed.result.success
    # ConfigureSession too, an absolute path inside the root as well; a symlink that stays in the
    # root is followed.
    (root / "real").mkdir()
    (root / "inner").symlink_to(root / "real")
    for named, made in ((str(root / "abs" / "x"), root / "abs" / "x"), ("inner/y", root / "real" / "y")):
        configured = await live.stub.ConfigureSession(
            pb.ConfigureSessionRequest(
                session_id=created.session_id, config=pb.SessionConfig(workspace=named)
            )
        )
        assert configured.session.config.workspace == str(made) and made.is_dir()


@pytest.mark.parametrize(
    "named", ["link/new", "link/a/b", "dangling", "dangling/new", "new/../../escape", "link/../escape"]
)
async def test_no_workspace_is_created_through_a_way_out_of_the_root(
    live: LiveServer, tmp_path: Path, named: str
) -> None:
    """A symlink in the workspace leading out of it (to an existing directory or to none), or `..`."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (live.workspace / "link").symlink_to(outside)
    (live.workspace / "dangling").symlink_to(tmp_path / "nowhere")
    before = directories(tmp_path)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(workspace=named)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "config.workspace" in err.value.details()
    assert directories(tmp_path) == before  # nothing created, outside or in the workspace


async def test_a_session_whose_workspace_is_not_here_is_refused_naming_the_shared_volume(
    live: LiveServer,
) -> None:
    """What a replica without the session's workspace answers (replicas share workspaces on one
    volume; the server does not route sessions to the replica that holds them)."""
    (live.workspace / "elsewhere").mkdir()
    llm = pb.LLMConfig(provider="openai", model="never-called", base_url="http://127.0.0.1:9")
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(config=pb.SessionConfig(workspace="elsewhere", llm=llm))
    )
    (live.workspace / "elsewhere").rmdir()
    for call in (
        live.stub.ExecuteTool(
            pb.ExecuteToolRequest(session_id=created.session_id, tool_name="list_files", arguments="{}")
        ),
        live.stub.Generate(
            pb.GenerateRequest(
                session_id=created.session_id, messages=[pb.Message(role=pb.Message.ROLE_USER, content="hi")]
            )
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "is not on this replica" in err.value.details() and "shared volume" in err.value.details()


async def test_initial_context_is_counted_and_bad_roles_refused(live: LiveServer) -> None:
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(
            initial_context=[
                pb.Message(role=pb.Message.ROLE_USER, content="hello"),
                pb.Message(role=pb.Message.ROLE_ASSISTANT, content="hi"),
            ]
        )
    )
    assert created.session.context_usage.message_count == 2
    history = await live.runtime.sessions.history(created.session_id)
    assert [(m.role, m.content) for m in history] == [("user", "hello"), ("assistant", "hi")]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.CreateSession(pb.CreateSessionRequest(initial_context=[pb.Message(content="x")]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "initial_context[0].role" in err.value.details()


async def test_unknown_session_is_not_found_everywhere(live: LiveServer) -> None:
    for call in (
        live.stub.GetSession(pb.GetSessionRequest(session_id="nope")),
        live.stub.DestroySession(pb.DestroySessionRequest(session_id="nope")),
        live.stub.ConfigureSession(pb.ConfigureSessionRequest(session_id="nope")),
    ):
        assert await _status_of(call) == grpc.StatusCode.NOT_FOUND


async def test_destroy_removes_the_session(live: LiveServer) -> None:
    created = await live.stub.CreateSession(pb.CreateSessionRequest())
    reply = await live.stub.DestroySession(pb.DestroySessionRequest(session_id=created.session_id))
    assert reply.success
    assert await _status_of(live.stub.GetSession(pb.GetSessionRequest(session_id=created.session_id))) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert (await live.stub.ListSessions(pb.ListSessionsRequest())).sessions == []


async def test_configure_merges_and_advances_updated_at(live: LiveServer) -> None:
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(
                name="keep-me",
                system_prompt="old prompt",
                llm=pb.LLMConfig(provider="openai", model="m1", base_url="http://llm"),
            )
        )
    )
    reply = await live.stub.ConfigureSession(
        pb.ConfigureSessionRequest(
            session_id=created.session_id,
            config=pb.SessionConfig(
                system_prompt="new prompt", llm=pb.LLMConfig(model="m2"), auto_compact=True
            ),
        )
    )
    config = reply.session.config
    assert config.name == "keep-me"
    assert config.system_prompt == "new prompt"
    assert (config.llm.provider, config.llm.model, config.llm.base_url) == ("openai", "m2", "http://llm")
    assert config.auto_compact
    assert reply.session.updated_at > created.session.updated_at
    assert reply.session.created_at == created.session.created_at


async def test_configure_refuses_a_missing_workspace_and_keeps_the_old_config(live: LiveServer) -> None:
    # Outside the workspace root: a missing one inside is created since issue 18.
    created = await live.stub.CreateSession(pb.CreateSessionRequest(config=pb.SessionConfig(name="n")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.ConfigureSession(
            pb.ConfigureSessionRequest(
                session_id=created.session_id,
                config=pb.SessionConfig(name="changed", workspace="/nonexistent"),
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    got = await live.stub.GetSession(pb.GetSessionRequest(session_id=created.session_id))
    assert got.session.config.name == "n"


async def test_api_keys_are_used_but_never_returned(live: LiveServer) -> None:
    created = await live.stub.CreateSession(
        pb.CreateSessionRequest(
            config=pb.SessionConfig(llm=pb.LLMConfig(model="m", api_key="sk-session-secret"))
        )
    )
    assert created.session.config.llm.api_key == ""
    session_id = created.session_id
    for session in (
        (await live.stub.GetSession(pb.GetSessionRequest(session_id=session_id))).session,
        (await live.stub.ListSessions(pb.ListSessionsRequest())).sessions[0],
        (
            await live.stub.ConfigureSession(
                pb.ConfigureSessionRequest(session_id=session_id, config=pb.SessionConfig(name="x"))
            )
        ).session,
    ):
        assert session.config.llm.model == "m"
        assert session.config.llm.api_key == ""
    assert live.runtime.llm_for(live.runtime.sessions.get(session_id)).api_key == "sk-session-secret"


async def test_max_context_length_beyond_the_server_limit_is_refused(live: LiveServer) -> None:
    too_big = live.runtime.settings.max_context_tokens + 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await live.stub.CreateSession(
            pb.CreateSessionRequest(config=pb.SessionConfig(max_context_length=too_big))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_context_length" in err.value.details()
