"""What a new user meets first, through the real interfaces: the example skills found without flags
(also from an installed wheel), ROLE_TOOL messages that must say which call they answer, the exit
status of `a3s-agent ops`, and a quiet test run that prints no load figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import grpc
import pytest

from a3s_agent.config import Settings
from a3s_agent.core.skills.catalog import EXAMPLE_SKILLS_DIR
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc
from a3s_agent.testing.fake_llm import FakeLLM

from .conftest import LiveServer, ServerProcess, new_session, running, user, wait_serving

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = {"python-testing", "word-count"}


def _listed(channel: grpc.Channel) -> dict[str, pb.Skill]:
    stub = pb_grpc.CodeAgentServiceStub(channel)
    return {s.name: s for s in stub.ListSkills(pb.ListSkillsRequest(), timeout=10).skills}


# --- the example skills are found without flags -------------------------------------------------


def test_a_fresh_server_lists_and_loads_the_examples(server_process: ServerProcess) -> None:
    server_process.start()
    with server_process.channel() as channel:
        listed = _listed(channel)
        assert set(listed) >= EXAMPLES, sorted(listed)
        assert listed["word-count"].metadata["origin"] == "operator"
        assert listed["word-count"].metadata["loaded"] == "false"
        stub = pb_grpc.CodeAgentServiceStub(channel)
        session_id = stub.CreateSession(pb.CreateSessionRequest(), timeout=10).session_id
        loaded = stub.LoadSkill(
            pb.LoadSkillRequest(session_id=session_id, skill_name="word-count"), timeout=10
        )
        assert list(loaded.tool_names) == ["count_lines"]
        (server_process.workspace / "a.txt").write_text("one two\nthree\n")
        counted = stub.ExecuteTool(
            pb.ExecuteToolRequest(
                session_id=session_id, tool_name="count_lines", arguments='{"path": "a.txt"}'
            ),
            timeout=30,
        ).result
    assert counted.success, counted.error
    assert counted.output.strip() == "a.txt: 2 lines, 3 words, 14 bytes"


async def test_the_operator_and_the_examples_outrank_the_workspace(workspace: Path, tmp_path: Path) -> None:
    """An operator's skill of an example's name wins over the example; a repository's skill of an
    example's name is shadowed (the examples count as the operator's, lowest of them)."""
    operator = tmp_path / "operator-skills"
    (operator / "word-count").mkdir(parents=True)
    (operator / "word-count" / "SKILL.md").write_text(
        "---\nname: word-count\ndescription: the operator's own\n---\nmine\n"
    )
    (workspace / ".a3s" / "skills").mkdir(parents=True)
    (workspace / ".a3s" / "skills" / "python-testing.md").write_text(
        "---\nname: python-testing\ndescription: the repository's\nallowed-tools: Bash(*)\n---\nrun anything\n"
    )
    settings = Settings(listen="127.0.0.1:0", workspace=workspace, data_dir=tmp_path / "data")
    settings.skill_dirs = [operator]
    async with running(settings) as server:
        entries = (await server.stub.ListSkills(pb.ListSkillsRequest())).skills
        session_id = await new_session(server)
        await server.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="python-testing"))
        policy = (
            await server.stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id=session_id))
        ).policy
    by_name = {(s.name, s.metadata["shadowed"]): s for s in entries}
    assert by_name[("word-count", "false")].description == "the operator's own"
    assert by_name[("python-testing", "true")].metadata["origin"] == "workspace"
    example = by_name[("python-testing", "false")]
    assert example.metadata["origin"] == "operator"
    assert example.metadata["source"] == str(EXAMPLE_SKILLS_DIR / "python-testing" / "SKILL.md")
    assert "Bash(*)" not in [r.rule for r in policy.allow]
    assert "Bash(pytest:*)" in [r.rule for r in policy.allow]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip wheel .` builds, from a copy of the source (the checkout stays untouched)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "a3s_agent", source / "a3s_agent", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(root)],
        cwd=source, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (found,) = root.glob("a3s_agent-*.whl")
    return found


def test_the_wheel_carries_the_examples(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for skill in EXAMPLES:
        assert f"a3s_agent/example_skills/{skill}/SKILL.md" in names, sorted(names)


def test_a_server_installed_from_the_wheel_lists_the_examples(
    wheel: Path, tmp_path: Path, workspace: Path
) -> None:
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)  # what `pip install` puts in site-packages
    server = ServerProcess(workspace, tmp_path / "data", env={"PYTHONPATH": str(installed)})
    server.proc = subprocess.Popen(  # from elsewhere, so `python -m` cannot import the checkout
        server.command(),
        env=server.env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_serving(server.address, 30, server.proc)
        with server.channel() as channel:
            listed = _listed(channel)
    finally:
        server.proc.kill()
        server.proc.wait(10)
    assert set(listed) >= EXAMPLES, sorted(listed)
    assert listed["word-count"].metadata["source"].startswith(str(installed / "a3s_agent" / "example_skills"))


# --- ROLE_TOOL messages name the call they answer ---------------------------------------------


def _tool_message(**metadata: str) -> pb.Message:
    return pb.Message(role=pb.Message.ROLE_TOOL, content="42 files", metadata=metadata)


@pytest.mark.parametrize("metadata", [{}, {"tool_call_id": "  "}, {"name": "list_files"}])
async def test_a_tool_message_without_its_call_id_is_refused(
    agent: LiveServer, fake: FakeLLM, metadata: dict[str, str]
) -> None:
    session_id = await new_session(agent)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.Generate(
            pb.GenerateRequest(session_id=session_id, messages=[user("count"), _tool_message(**metadata)])
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[1].metadata.tool_call_id" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.CreateSession(pb.CreateSessionRequest(initial_context=[_tool_message(**metadata)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "initial_context[0].metadata.tool_call_id" in err.value.details()
    assert fake.requests == []
    assert await agent.runtime.sessions.history(session_id) == []


async def test_a_tool_message_with_its_call_id_is_kept_with_it(agent: LiveServer) -> None:
    created = await agent.stub.CreateSession(
        pb.CreateSessionRequest(initial_context=[user("how many?"), _tool_message(tool_call_id="call_1")])
    )
    stored = (await agent.runtime.sessions.history(created.session_id))[-1]
    assert (stored.role, stored.tool_call_id, stored.content) == ("tool", "call_1", "42 files")


# --- `a3s-agent ops` says by its exit status whether every operation succeeded ----------------------


def _ops(tmp_path: Path, message: object, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "ops.json").write_text(message if isinstance(message, str) else json.dumps(message))
    return subprocess.run(
        [sys.executable, "-m", "a3s_agent", "ops", str(tmp_path / "ops.json"), "--workspace", str(tmp_path), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _message(*operations: dict[str, object]) -> dict[str, object]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


def test_ops_exits_0_when_every_operation_succeeded(tmp_path: Path) -> None:
    done = _ops(tmp_path, _message({"id": "w", "type": "createFile", "path": "hello.txt", "content": "hi\n"}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["events"][0]["success"] is True
    assert (tmp_path / "hello.txt").read_text() == "hi\n"


@pytest.mark.parametrize(
    ("operation", "event"),
    [
        ({"id": "r", "type": "readFile", "path": "missing.txt"}, "readFile"),
        ({"id": "s", "type": "shell", "command": "exit 3"}, "shell"),
        ({"id": "x", "type": "createFile"}, "error"),
        ({"id": "k", "type": "readFile", "path": "id_rsa"}, "policyDenied"),
        ({"id": "d", "type": "shell", "command": "rm -rf temp"}, "approvalRequired"),
    ],
)
def test_ops_exits_1_when_an_operation_did_not_succeed(
    tmp_path: Path, operation: dict[str, object], event: str
) -> None:
    (tmp_path / "hello.txt").write_text("hi\n")
    (tmp_path / "id_rsa").write_text("key\n")
    done = _ops(tmp_path, _message({"id": "m", "type": "message", "content": "start"}, operation))
    assert done.returncode == 1, done.stdout
    events = json.loads(done.stdout)["events"]
    assert [e["type"] for e in events] == ["message", event]
    assert "did not succeed" in done.stderr


@pytest.mark.parametrize(
    ("message", "words"),
    [("{nope", "not valid JSON"), ({"protocolVersion": "9.9", "operations": []}, "protocolVersion")],
)
def test_ops_exits_2_when_nothing_could_run(tmp_path: Path, message: object, words: str) -> None:
    done = _ops(tmp_path, message)
    assert done.returncode == 2 and done.stdout == ""
    assert words in done.stderr
    unknown = _ops(tmp_path, _message(), "--policy", "lenient")
    assert unknown.returncode == 2 and "lenient" in unknown.stderr


# --- a quiet test run prints no load figures --------------------------------------------------


def test_a_quiet_load_run_prints_no_figures_but_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "load.json"
    env = {
        **os.environ,
        "A3S_LOAD_SESSIONS": "2",
        "A3S_LOAD_SECONDS": "0.5",
        "A3S_LOAD_SUBSCRIBERS": "1",
        "A3S_LOAD_REPORT": str(report),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/fault/test_load.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    assert "LOAD" not in done.stdout and " ms" not in done.stdout and " MB" not in done.stdout, done.stdout
    figures = json.loads(report.read_text())
    assert figures["sessions"] == 2 and figures["streams"] >= 2
