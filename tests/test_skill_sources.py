"""Skills from more places (a3s-string-dialect.md 4.2) over a real grpc.aio channel with the later
dialect's stubs: GetSkill's whole definitions, GetClaudeCodeSkills from Claude Code's places,
LoadSkillsFromDir beneath the workspace or an operator directory only (stored with the session,
on SQLite and PostgreSQL), and SearchSkills / InstallSkill against the operator's sources, a local
git repository cloned by real git and a plain directory, with the attacks a source or a client
can try."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.base.skill_sources import parse_skill_sources
from a3s_agent.config import Settings
from a3s_agent.core.skills import sources
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb

from .conftest import LiveServer, ServerProcess, agent_settings, running

Stub = later_grpc.CodeAgentServiceStub


def skill_text(name: str, description: str = "", body: str = "Do the thing.", **fields: str) -> str:
    extra = "".join(f"{key}: {value}\n" for key, value in fields.items())
    return f"---\nname: {name}\ndescription: {description or name + ' skill'}\n{extra}---\n{body}\n"


def write_skill(directory: Path, name: str, text: str | None = None) -> Path:
    (directory / name).mkdir(parents=True, exist_ok=True)
    (directory / name / "SKILL.md").write_text(text or skill_text(name))
    return directory / name


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        [
            "git",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "init.defaultBranch=main",
            *args,
        ],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def git_source(repo: Path, skills: dict[str, str]) -> str:
    """A local git repository holding `skills/<name>/SKILL.md` for each, committed; its file:// URL."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q")
    (repo / "README.md").write_text("# skills\nnot a skill\n")
    for name, text in skills.items():
        write_skill(repo / "skills", name, text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "skills")
    return f"file://{repo}"


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[LiveServer, Stub]]:
    async with running(settings) as live:
        yield live, later_grpc.CodeAgentServiceStub(live.channel)


def with_sources(settings: Settings, *texts: str) -> Settings:
    return replace(settings, skill_sources=parse_skill_sources(list(texts)))


async def failure(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def a_session(live: LiveServer) -> str:
    return (await live.stub.CreateSession(pb.CreateSessionRequest())).session_id


async def listed(live: LiveServer, session_id: str) -> dict[str, dict[str, str]]:
    reply = await live.stub.ListSkills(pb.ListSkillsRequest(session_id=session_id))
    return {s.name: dict(s.metadata) for s in reply.skills if s.metadata["shadowed"] == "false"}


def globally(source: str) -> later.InstallSkillRequest:
    """InstallSkill into the operator's directory (`global` is a keyword in Python)."""
    request = later.InstallSkillRequest(source=source)
    setattr(request, "global", True)
    return request


def leftovers(pattern: str) -> list[str]:
    return glob.glob(pattern)


async def allowed(live: LiveServer, session_id: str) -> set[str]:
    policy = await live.stub.GetPermissionPolicy(pb.GetPermissionPolicyRequest(session_id=session_id))
    return {rule.rule for rule in policy.policy.allow}


@pytest.fixture
def settings(workspace: Path, tmp_path: Path) -> Settings:
    return agent_settings(workspace, tmp_path / "data")


# --- GetSkill and GetClaudeCodeSkills --------------------------------------------------------


async def test_get_skill_gives_a_skills_whole_definition(settings: Settings, tmp_path: Path) -> None:
    operator = tmp_path / "operator-skills"
    write_skill(
        operator,
        "release",
        skill_text(
            "release",
            "Cut a release.",
            "Run the release checklist, step by step.",
            **{"allowed-tools": "Bash(git tag:*), Read", "disable-model-invocation": "true", "kind": "agent"},
        ),
    )
    async with serving(replace(settings, skill_dirs=[operator])) as (_, stub):
        reply = await stub.GetSkill(later.GetSkillRequest(name="release"))
        assert len(reply.skills) == 1
        skill = reply.skills[0]
        assert (skill.name, skill.description, skill.content) == (
            "release",
            "Cut a release.",
            "Run the release checklist, step by step.",
        )
        assert skill.allowed_tools == "Bash(git tag:*), Read"
        assert skill.disable_model_invocation and skill.kind == "agent"
        assert skill.metadata["origin"] == "operator" and skill.metadata["trusted"] == "true"
        assert skill.metadata["source"] == str(operator / "release" / "SKILL.md")

        everything = await stub.GetSkill(later.GetSkillRequest())
        names = {s.name for s in everything.skills}
        assert {"release", "word-count", "python-testing"} <= names  # with the packaged examples
        assert next(s for s in everything.skills if s.name == "word-count").kind == "instruction"
        assert not (await stub.GetSkill(later.GetSkillRequest(name="no-such-skill"))).skills


async def test_claude_code_skills_come_from_the_workspace_and_the_users_home(
    settings: Settings, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    write_skill(
        home / ".claude" / "skills",
        "pdf",
        skill_text("pdf", "Read PDFs.", "Use pdftotext.", **{"allowed-tools": "Bash(pdftotext:*)"}),
    )
    write_skill(workspace / ".claude" / "skills", "house-style", skill_text("house-style", "Our style."))
    (workspace / ".claude" / "skills" / "broken").mkdir()
    (workspace / ".claude" / "skills" / "broken" / "SKILL.md").write_text("no frontmatter here\n")
    monkeypatch.setenv("HOME", str(home))
    async with serving(settings) as (_, stub):
        reply = await stub.GetClaudeCodeSkills(later.GetClaudeCodeSkillsRequest())
        assert [s.name for s in reply.skills] == ["house-style", "pdf"]  # the workspace's, then the user's
        pdf = reply.skills[1]
        assert (pdf.description, pdf.content, pdf.allowed_tools) == (
            "Read PDFs.",
            "Use pdftotext.",
            "Bash(pdftotext:*)",
        )
        assert not pdf.disable_model_invocation
        assert not reply.skills[0].HasField("allowed_tools")
        named = await stub.GetClaudeCodeSkills(later.GetClaudeCodeSkillsRequest(name="pdf"))
        assert [s.name for s in named.skills] == ["pdf"]


# --- LoadSkillsFromDir ------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def store_settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else ""
    return replace(settings, store=url)


async def test_load_skills_from_dir_loads_into_the_session_and_outlives_the_server(
    store_settings: Settings, workspace: Path
) -> None:
    team = workspace / "team-skills"
    write_skill(team, "lint", skill_text("lint", "Lint it.", **{"allowed-tools": "Bash(ruff:*)"}))
    write_skill(team, "docs")
    (team / "single.md").write_text(skill_text("single"))
    write_skill(team, "bad", "---\nname: bad\ntools: 3\n---\nbody\n")
    write_skill(team / "nested" / "deeper", "buried")
    async with serving(store_settings) as (live, stub):
        session_id = await a_session(live)
        reply = await stub.LoadSkillsFromDir(
            later.LoadSkillsFromDirRequest(session_id=session_id, directory="team-skills")
        )
        assert sorted(reply.loaded_skills) == ["docs", "lint", "single"]
        assert not reply.success and len(reply.errors) == 1
        assert "bad/SKILL.md" in reply.errors[0] and "tools" in reply.errors[0]
        skills = await listed(live, session_id)
        assert skills["lint"]["loaded"] == "true" and skills["lint"]["origin"] == "workspace"
        assert skills["lint"]["trusted"] == "false"  # a workspace's skills grant nothing untrusted
        assert "Bash(ruff:*)" not in await allowed(live, session_id)

        deep = await stub.LoadSkillsFromDir(
            later.LoadSkillsFromDirRequest(
                session_id=session_id, directory=str(team / "nested"), recursive=True
            )
        )
        assert list(deep.loaded_skills) == ["buried"] and deep.success
    async with serving(store_settings) as (live, _):  # the same store, a new server
        skills = await listed(live, session_id)
        assert {name for name, meta in skills.items() if meta["loaded"] == "true"} >= {
            "lint",
            "docs",
            "buried",
        }


async def test_a_trusted_workspace_and_an_operator_directory_grant_their_rules(
    settings: Settings, workspace: Path, tmp_path: Path
) -> None:
    write_skill(workspace / "skills", "lint", skill_text("lint", **{"allowed-tools": "Bash(ruff:*)"}))
    operator = tmp_path / "operator"
    write_skill(operator / "extra", "deploy", skill_text("deploy", **{"allowed-tools": "Bash(kubectl:*)"}))
    async with serving(replace(settings, skill_dirs=[operator], trust_workspace_skills=True)) as (live, stub):
        session_id = await a_session(live)
        for directory in ("skills", str(operator / "extra")):
            reply = await stub.LoadSkillsFromDir(
                later.LoadSkillsFromDirRequest(session_id=session_id, directory=directory)
            )
            assert reply.success, reply.errors
        skills = await listed(live, session_id)
        assert skills["deploy"]["origin"] == "operator" and skills["lint"]["trusted"] == "true"
        assert {"Bash(ruff:*)", "Bash(kubectl:*)"} <= await allowed(live, session_id)


async def test_load_skills_from_dir_refuses_every_way_out(
    settings: Settings, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    write_skill(outside, "evil", skill_text("evil", **{"allowed-tools": "Bash(*)"}))
    (workspace / "escape").symlink_to(outside)
    inside = workspace / "inside"
    write_skill(inside, "fine")
    (inside / "linked").symlink_to(outside / "evil")  # a skill directory leading out
    (inside / "linked.md").symlink_to(outside / "evil" / "SKILL.md")
    async with serving(settings) as (live, stub):
        session_id = await a_session(live)
        for directory in ("..", "../outside", str(outside), "/etc", "escape", "inside/../../outside"):
            error = await failure(
                stub.LoadSkillsFromDir(
                    later.LoadSkillsFromDirRequest(session_id=session_id, directory=directory)
                )
            )
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, directory
            assert "directory" in (error.details() or "") and "outside" in (error.details() or "")
        reply = await stub.LoadSkillsFromDir(
            later.LoadSkillsFromDirRequest(session_id=session_id, directory="inside")
        )
        assert list(reply.loaded_skills) == ["fine"]
        assert len(reply.errors) == 2 and all(
            "out of the directory" in e or "link" in e for e in reply.errors
        )
        assert "evil" not in await listed(live, session_id)

        missing = await failure(
            stub.LoadSkillsFromDir(later.LoadSkillsFromDirRequest(session_id=session_id, directory="nowhere"))
        )
        assert missing.code() == grpc.StatusCode.NOT_FOUND and "nowhere" in (missing.details() or "")
        empty = await failure(stub.LoadSkillsFromDir(later.LoadSkillsFromDirRequest(session_id=session_id)))
        assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT and "directory" in (empty.details() or "")
        unknown = await failure(
            stub.LoadSkillsFromDir(later.LoadSkillsFromDirRequest(session_id="no-such", directory="inside"))
        )
        assert unknown.code() == grpc.StatusCode.NOT_FOUND


# --- SearchSkills and InstallSkill ------------------------------------------------------------

MARKER_SCRIPT = """---
name: pdf-tools
description: Extract text and tables from PDF files.
tools:
  - name: pdf_text
    description: The text of a PDF.
    parameters: {type: object, properties: {}}
    script: |
      #!/bin/sh
      touch "%s"
---
Use pdf_text on PDFs.
"""


async def test_search_and_install_from_a_git_source(
    settings: Settings, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    url = git_source(
        tmp_path / "acme" / "skills.git",
        {
            "pdf-tools": MARKER_SCRIPT % marker,
            "csv": skill_text("csv", "Work with CSV tables."),
            "web": skill_text("web", "Fetch web pages."),
        },
    )
    repo = tmp_path / "acme" / "skills.git"
    (repo / "skills" / "pdf-tools" / "passwd").symlink_to("/etc/passwd")  # a link in the source
    (repo / "skills" / "pdf-tools" / "helper.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "skills" / "pdf-tools" / "helper.sh").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "more")
    async with serving(with_sources(settings, url)) as (live, stub):
        found = await stub.SearchSkills(later.SearchSkillsRequest(query="tables"))
        assert [r.name for r in found.results] == ["csv", "pdf-tools"] and found.total_count == 2
        pdf = found.results[1]
        assert pdf.install_source == "acme/skills@pdf-tools" and pdf.description.startswith("Extract")
        assert pdf.url == f"{url}#skills/pdf-tools"
        best = await stub.SearchSkills(later.SearchSkillsRequest(query="PDF"))
        assert best.results[0].name == "pdf-tools"
        limited = await stub.SearchSkills(later.SearchSkillsRequest(query="skill acme", limit=1))
        assert len(limited.results) == 1 and limited.total_count == 3  # every skill names its source

        done = await stub.InstallSkill(later.InstallSkillRequest(source=pdf.install_source))
        assert done.success, done.message
        installed = workspace / ".a3s" / "skills" / "pdf-tools"
        assert (done.skill_name, done.installed_path) == ("pdf-tools", str(installed))
        assert (installed / "SKILL.md").read_text() == MARKER_SCRIPT % marker
        assert os.access(installed / "helper.sh", os.X_OK)
        assert not (installed / "passwd").is_symlink()  # checked out as a file naming the target
        assert (installed / "passwd").read_text() == "/etc/passwd"
        assert not marker.exists()  # installing ran nothing
        assert not list((workspace / ".a3s" / "skills").glob(".installing-*"))

        session_id = await a_session(live)
        assert (await listed(live, session_id))["pdf-tools"]["origin"] == "workspace"
        loaded = await live.stub.LoadSkill(pb.LoadSkillRequest(session_id=session_id, skill_name="pdf-tools"))
        assert list(loaded.tool_names) == ["pdf_text"]

        again = await stub.InstallSkill(later.InstallSkillRequest(source="acme/skills@pdf-tools"))
        assert not again.success and "already installed" in again.message


async def test_install_globally_into_the_operators_directory(
    settings: Settings, workspace: Path, tmp_path: Path
) -> None:
    source = tmp_path / "shared"
    write_skill(source, "only-one", skill_text("only-one", "The one skill."))
    operator = tmp_path / "operator"
    operator.mkdir()
    async with serving(with_sources(settings, f"team={source}")) as (_, stub):
        refused = await failure(stub.InstallSkill(globally("team")))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "--skills-dir" in (
            refused.details() or ""
        )
    async with serving(with_sources(replace(settings, skill_dirs=[operator]), f"team={source}")) as (_, stub):
        done = await stub.InstallSkill(globally("team"))
        assert done.success and done.installed_path == str(operator / "only-one")
        got = await stub.GetSkill(later.GetSkillRequest(name="only-one"))
        assert got.skills[0].metadata["origin"] == "operator"
    assert not (workspace / ".a3s").exists()


async def test_skill_sources_need_the_operator(settings: Settings) -> None:
    async with serving(settings) as (_, stub):
        for call in (
            stub.SearchSkills(later.SearchSkillsRequest(query="pdf")),
            stub.InstallSkill(later.InstallSkillRequest(source="acme/skills@pdf")),
        ):
            error = await failure(call)
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "--skill-source" in (error.details() or "")


async def test_bad_install_requests_are_named(settings: Settings, tmp_path: Path) -> None:
    url = git_source(
        tmp_path / "acme" / "skills",
        {
            "ok": skill_text("ok"),
            "broken": "---\nname: broken\ntools:\n  - name: t\n    script: x\n    binary: [y]\n---\nbody\n",
            "huge": skill_text("huge", body="x" * (sources.MAX_SKILL_FILE_BYTES + 10)),
        },
    )
    async with serving(with_sources(settings, url)) as (_, stub):
        empty = await failure(stub.SearchSkills(later.SearchSkillsRequest(query="  ")))
        assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT and "query" in (empty.details() or "")
        for source in (
            "",
            "https://github.com/evil/skills",
            "ext::sh -c touch% /tmp/pwned",
            "file:///etc",
            "/etc/passwd",
            "acme/skills@../../x",
            "a/b/c@ok",
        ):
            error = await failure(stub.InstallSkill(later.InstallSkillRequest(source=source)))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, source
            assert "source" in (error.details() or "")
        for source, words in (
            ("other/repo@ok", "no skill source"),
            ("acme/skills@missing", "no skill named"),
        ):
            error = await failure(stub.InstallSkill(later.InstallSkillRequest(source=source)))
            assert error.code() == grpc.StatusCode.NOT_FOUND and words in (error.details() or "")
        several = await failure(stub.InstallSkill(later.InstallSkillRequest(source="acme/skills")))
        assert several.code() == grpc.StatusCode.INVALID_ARGUMENT and "acme/skills@<skill>" in (
            several.details() or ""
        )
        broken = await stub.InstallSkill(later.InstallSkillRequest(source="acme/skills@broken"))
        assert not broken.success and "tools[0]" in broken.message and "backend" in broken.message
        huge = await stub.InstallSkill(later.InstallSkillRequest(source="acme/skills@huge"))
        assert not huge.success and "larger than" in huge.message
    assert not leftovers("/tmp/pwned")


async def test_a_source_too_large_is_refused(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "big"
    url = git_source(repo, {"ok": skill_text("ok")})
    (repo / "blob.bin").write_bytes(os.urandom(4 * 1024 * 1024))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "big")
    monkeypatch.setattr(sources, "MAX_SOURCE_BYTES", 1024 * 1024)
    async with serving(with_sources(settings, f"big={url}")) as (_, stub):
        error = await failure(stub.SearchSkills(later.SearchSkillsRequest(query="ok")))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "big" in (error.details() or "") and "1 MiB" in (error.details() or "")
        done = await stub.InstallSkill(later.InstallSkillRequest(source="big@ok"))
        assert not done.success and "more than 1 MiB" in done.message
    assert not leftovers(os.path.join(tempfile.gettempdir(), "a3s-skill-source-*", "checkout"))


async def test_links_neither_move_an_install_nor_come_along(
    settings: Settings, workspace: Path, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    write_skill(source, "one")
    (write_skill(source, "leaky") / "key").symlink_to(tmp_path / "secret")  # a directory source's link
    (tmp_path / "secret").write_text("the operator's key")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / ".a3s").symlink_to(elsewhere)  # the repository's content is untrusted
    async with serving(with_sources(settings, f"src={source}")) as (live, stub):
        done = await stub.InstallSkill(later.InstallSkillRequest(source="src@one"))
        assert not done.success and "leads out" in done.message
        (workspace / ".a3s").unlink()
        leaky = await stub.InstallSkill(later.InstallSkillRequest(source="src@leaky"))
        assert not leaky.success and "key is not a regular file" in leaky.message
        assert not (workspace / ".a3s" / "skills" / "leaky").exists()
        unknown = await failure(
            stub.InstallSkill(later.InstallSkillRequest(source="src@one", session_id="nope"))
        )
        assert unknown.code() == grpc.StatusCode.NOT_FOUND and "nope" in (unknown.details() or "")
        session_id = await a_session(live)
        done = await stub.InstallSkill(later.InstallSkillRequest(source="src@one", session_id=session_id))
        assert done.success and done.installed_path == str(workspace / ".a3s" / "skills" / "one")
    assert not list(elsewhere.iterdir())


def test_serve_takes_skill_sources_from_its_flag(server_process: ServerProcess, tmp_path: Path) -> None:
    url = git_source(tmp_path / "flagged" / "repo", {"notes": skill_text("notes", "Keep notes.")})
    server_process.command = lambda: [*ServerProcess.command(server_process), "--skill-source", f"mine={url}"]  # type: ignore[method-assign]
    server_process.start()
    with server_process.channel() as channel:
        stub = later_grpc.CodeAgentServiceStub(channel)
        found = stub.SearchSkills(later.SearchSkillsRequest(query="notes"), timeout=60)
        assert [r.install_source for r in found.results] == ["mine@notes"]
        done = stub.InstallSkill(later.InstallSkillRequest(source="mine@notes"), timeout=60)
        assert (
            done.success
            and Path(done.installed_path) == server_process.workspace / ".a3s" / "skills" / "notes"
        )
        features = later_grpc.CodeAgentServiceStub(channel).GetCapabilities(later.GetCapabilitiesRequest())
        assert "skill_sources" in features.features


@pytest.mark.parametrize(
    ("sources_given", "words"),
    [
        (["ext::sh -c id"], "absolute directory"),
        (["ssh://host/repo.git"], "https://, http:// or file://"),
        (["relative/dir"], "absolute directory"),
        (["https://x/y.git", "https://z/y.git"], "two skill sources are named 'y'"),
        (["https://host/a b/../..=x"], "name"),
    ],
)
def test_bad_skill_sources_stop_the_start(sources_given: list[str], words: str, tmp_path: Path) -> None:
    flags = [arg for source in sources_given for arg in ("--skill-source", source)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "a3s_agent",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "--skill-source" in done.stderr and words in done.stderr, done.stderr
