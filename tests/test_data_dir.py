"""The server's data stays out of the user's repository: a real server started in a git repository
without --data-dir keeps its sessions under $XDG_DATA_HOME, a data directory it creates carries a
`.gitignore`, and sessions a server of the old default left in `<workspace>/.a3s` are still served."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .conftest import ServerProcess

TIMEOUT_S = 15.0


class DefaultDataServer(ServerProcess):
    """`a3s-agent serve` without --data-dir (None) or with one, with its own $HOME and $XDG_DATA_HOME."""

    def __init__(self, workspace: Path, home: Path, data_dir: Path | None = None) -> None:
        super().__init__(
            workspace, data_dir or home, env={"HOME": str(home), "XDG_DATA_HOME": str(home / "xdg")}
        )
        self.given_data_dir = data_dir

    def command(self) -> list[str]:
        argv = super().command()
        if self.given_data_dir is None:
            at = argv.index("--data-dir")
            del argv[at : at + 2]
        return argv

    def stub(self) -> tuple[grpc.Channel, pb_grpc.CodeAgentServiceStub]:
        channel = self.channel()
        return channel, pb_grpc.CodeAgentServiceStub(channel)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    git(path, "init", "-q")
    (path / "README.md").write_text("# project\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "first")
    return path


@pytest.fixture
def servers() -> Iterator[list[DefaultDataServer]]:
    started: list[DefaultDataServer] = []
    yield started
    for server in started:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def start(servers: list[DefaultDataServer], server: DefaultDataServer) -> DefaultDataServer:
    servers.append(server)
    return server.start()


def session_ids(server: DefaultDataServer) -> set[str]:
    channel, stub = server.stub()
    with channel:
        return {s.session_id for s in stub.ListSessions(pb.ListSessionsRequest(), timeout=TIMEOUT_S).sessions}


async def test_a_server_in_a_git_repository_leaves_it_clean(
    repo: Path, tmp_path: Path, servers: list[DefaultDataServer]
) -> None:
    home = tmp_path / "home"
    server = start(servers, DefaultDataServer(repo, home))
    channel, stub = server.stub()
    with channel:
        created = stub.CreateSession(
            pb.CreateSessionRequest(config=pb.SessionConfig(name="s")), timeout=TIMEOUT_S
        )
        request = pb.ExecuteToolRequest(
            session_id=created.session_id,
            tool_name="bash",
            arguments=json.dumps({"command": "git log --oneline"}),
        )
        result = stub.ExecuteTool(request, timeout=TIMEOUT_S).result
        assert result.success and "first" in result.output, result
    async with (
        aiohttp.ClientSession(base_url=f"http://127.0.0.1:{server.http_port}") as http,
        http.post("/v1/spaces", json={"spaceId": "own"}) as reply,  # a workspace of its own
    ):
        assert reply.status == 201, await reply.text()
        space = await reply.json()
    assert server.stop() == 0
    assert git(repo, "status", "--porcelain", "--untracked-files=all", "--ignored") == ""
    assert not (repo / ".a3s").exists()
    [data] = (home / "xdg" / "a3s-agent" / "workspaces").iterdir()
    assert data.name.startswith("project-") and (data / "sessions.db").is_file()
    assert (data / ".gitignore").read_text().splitlines()[-1] == "*"
    assert Path(space["workspace"]).is_relative_to(data)
    # The same workspace finds the same directory again.
    again = start(servers, DefaultDataServer(repo, home))
    assert created.session_id in session_ids(again)


async def test_a_data_directory_the_server_creates_in_a_repository_is_ignored_by_git(
    repo: Path, tmp_path: Path, servers: list[DefaultDataServer]
) -> None:
    server = start(servers, DefaultDataServer(repo, tmp_path / "home", data_dir=repo / "state"))
    channel, stub = server.stub()
    with channel:
        stub.CreateSession(pb.CreateSessionRequest(), timeout=TIMEOUT_S)
    assert server.stop() == 0
    assert (repo / "state" / "sessions.db").is_file()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_sessions_in_the_old_default_place_are_still_served_with_a_warning(
    repo: Path, tmp_path: Path, servers: list[DefaultDataServer]
) -> None:
    home = tmp_path / "home"
    legacy = repo / ".a3s"
    old = start(servers, DefaultDataServer(repo, home, data_dir=legacy))  # as the old default put it
    channel, stub = old.stub()
    with channel:
        kept = stub.CreateSession(pb.CreateSessionRequest(), timeout=TIMEOUT_S).session_id
    assert old.stop() == 0
    (legacy / ".gitignore").unlink()  # an old server wrote none
    upgraded = start(servers, DefaultDataServer(repo, home))
    assert kept in session_ids(upgraded)
    assert upgraded.stop() == 0
    log = upgraded.output()
    assert f"WARNING a3s_agent.config: using {legacy.resolve()}, inside the workspace, as the data" in log
    assert log.count("(A3S_DATA_DIR)") == 1
    assert not (home / "xdg").exists()


def test_a_lock_file_planted_as_a_symlink_is_not_followed(
    repo: Path, tmp_path: Path, servers: list[DefaultDataServer]
) -> None:
    """A data directory inside the workspace (the old default) is the model's to write: a
    `server.lock` planted there as a symlink makes the server create, open or lock nothing where it
    points. It serves all the same, saying that it runs without the lock."""
    legacy = repo / ".a3s"
    legacy.mkdir()
    victim = tmp_path / "outside" / "victim"
    victim.parent.mkdir()
    (legacy / "server.lock").symlink_to(victim)
    server = start(servers, DefaultDataServer(repo, tmp_path / "home", data_dir=legacy))
    assert session_ids(server) == set()
    assert server.stop() == 0
    assert not victim.exists()
    assert "could not lock" in server.output()
