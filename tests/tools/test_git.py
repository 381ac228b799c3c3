"""The git tools against real repositories made with the git CLI in tmp_path."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools.git import TOOLS
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry

GIT = shutil.which("git") or "git"


@pytest.fixture(autouse=True)
def _isolated_git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the machine's git configuration and identity variables out of every test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(name, raising=False)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def init_repo(path: Path, *, identity: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    if identity:
        git(path, "config", "user.name", "Ada Lovelace")
        git(path, "config", "user.email", "ada@example.com")
    return path


def commit_file(repo: Path, name: str, text: str, message: str) -> None:
    file = repo / name
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with one commit holding keep.txt and old.txt."""
    path = init_repo(tmp_path / "repo")
    (path / "keep.txt").write_text("one\ntwo\n")
    (path / "old.txt").write_text("moving\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "initial")
    return path


async def call(name: str, workspace: Path, env: dict[str, str] | None = None, **args: Any) -> ToolOutput:
    ctx = ToolContext(workspace=workspace, env=env or {})
    return await ToolRegistry(TOOLS).run(name, json.dumps(args), ctx)


def test_tools_are_the_git_family_with_read_only_queries() -> None:
    assert [(t.name, t.family, t.lane) for t in TOOLS] == [
        ("git_status", "git", "query"),
        ("git_diff", "git", "query"),
        ("git_commit", "git", "execute"),
        ("git_log", "git", "query"),
    ]


# --- shared failures ------------------------------------------------------------------------

ANY_CALL = [
    ("git_status", {}),
    ("git_diff", {}),
    ("git_log", {}),
    ("git_commit", {"message": "x", "all": True}),
]


@pytest.mark.parametrize(("name", "args"), ANY_CALL)
async def test_workspace_outside_any_repository_fails_clearly(
    tmp_path: Path, name: str, args: dict[str, Any]
) -> None:
    workspace = tmp_path / "plain"
    workspace.mkdir()
    result = await call(name, workspace, **args)
    assert not result.success
    assert "is not inside a git repository" in result.error
    assert "git init" in result.error


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("git_status", {"path": "../outside"}),
        ("git_diff", {"path": "../outside"}),
        ("git_log", {"path": "/etc"}),
        ("git_commit", {"message": "x", "paths": ["../outside.txt"]}),
    ],
)
async def test_paths_outside_the_workspace_are_refused(repo: Path, name: str, args: dict[str, Any]) -> None:
    (repo.parent / "outside.txt").write_text("secret\n")
    result = await call(name, repo, **args)
    assert not result.success
    assert "outside the workspace" in result.error


# --- git_status -----------------------------------------------------------------------------


async def test_status_groups_changes_by_kind(repo: Path) -> None:
    (repo / "keep.txt").write_text("one\ntwo\nthree\n")
    git(repo, "add", "keep.txt")
    git(repo, "mv", "old.txt", "new.txt")
    (repo / "added.txt").write_text("fresh\n")
    git(repo, "add", "added.txt")
    (repo / "added.txt").write_text("fresh, then edited\n")
    (repo / "scratch.txt").write_text("untracked\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.o").write_text("x")

    result = await call("git_status", repo)

    assert result.success, result.error
    meta = result.metadata
    assert meta["branch"] == "main" and meta["detached"] is False
    assert sorted(meta["staged"], key=lambda c: c["path"]) == [
        {"path": "added.txt", "change": "added"},
        {"path": "keep.txt", "change": "modified"},
        {"path": "new.txt", "change": "renamed", "from": "old.txt"},
    ]
    assert meta["unstaged"] == [{"path": "added.txt", "change": "modified"}]
    assert sorted(meta["untracked"]) == ["build/", "scratch.txt"]
    assert meta["upstream"] is None and meta["ahead"] is None
    assert "On branch main" in result.output
    assert "renamed: old.txt -> new.txt" in result.output
    assert "Untracked:\n" in result.output


async def test_status_of_a_clean_tree_says_so(repo: Path) -> None:
    result = await call("git_status", repo)
    assert result.success
    assert "Nothing to commit, working tree clean" in result.output
    assert result.metadata["staged"] == result.metadata["unstaged"] == result.metadata["untracked"] == []


async def test_status_works_before_the_first_commit(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "fresh")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    (repo / "b.txt").write_text("b\n")

    result = await call("git_status", repo)

    assert result.success, result.error
    assert "On branch main (no commits yet)" in result.output
    assert result.metadata["staged"] == [{"path": "a.txt", "change": "added"}]
    assert result.metadata["untracked"] == ["b.txt"]


async def test_status_shows_detached_head(repo: Path) -> None:
    commit_file(repo, "keep.txt", "changed\n", "second")
    first = git(repo, "rev-parse", "HEAD~1").strip()
    git(repo, "checkout", "-q", "--detach", first)

    result = await call("git_status", repo)

    assert result.metadata["branch"] == f"HEAD detached at {first[:7]}"
    assert result.metadata["detached"] is True
    assert result.output.startswith(f"HEAD detached at {first[:7]}")


async def test_status_counts_commits_ahead_and_behind_the_upstream(tmp_path: Path, repo: Path) -> None:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "-u", "origin", "main")
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(remote), str(other))
    git(other, "config", "user.name", "Bob")
    git(other, "config", "user.email", "bob@example.com")
    commit_file(other, "theirs.txt", "1\n", "their first")
    commit_file(other, "theirs.txt", "2\n", "their second")
    git(other, "push", "-q")
    commit_file(repo, "mine.txt", "mine\n", "my change")
    git(repo, "fetch", "-q")

    result = await call("git_status", repo)

    assert result.metadata["upstream"] == "origin/main"
    assert (result.metadata["ahead"], result.metadata["behind"]) == (1, 2)
    assert "Tracking origin/main: ahead 1, behind 2" in result.output


async def test_status_lists_merge_conflicts(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "topic")
    commit_file(repo, "keep.txt", "theirs\n", "topic edit")
    git(repo, "checkout", "-q", "main")
    commit_file(repo, "keep.txt", "ours\n", "main edit")
    subprocess.run([GIT, "merge", "-q", "topic"], cwd=repo, capture_output=True)

    result = await call("git_status", repo)

    assert result.metadata["conflicted"] == ["keep.txt"]
    assert "Unmerged (conflicts):\n  keep.txt" in result.output


async def test_status_is_limited_to_path(repo: Path) -> None:
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("print()\n")
    (repo / "keep.txt").write_text("edited\n")

    result = await call("git_status", repo, path="src")

    assert result.metadata["untracked"] == ["src/"]
    assert result.metadata["unstaged"] == []
    assert "keep.txt" not in result.output


async def test_workspace_in_a_subdirectory_sees_only_itself(repo: Path) -> None:
    commit_file(repo, "pkg/mod.py", "x = 1\n", "add pkg")
    workspace = repo / "pkg"
    (workspace / "mod.py").write_text("x = 2\n")
    (workspace / "new.py").write_text("y = 1\n")
    (repo / "keep.txt").write_text("edited outside the workspace\n")

    status = await call("git_status", workspace)
    diff = await call("git_diff", workspace)
    commit = await call("git_commit", workspace, message="Bump x", all=True)

    assert status.metadata["unstaged"] == [{"path": "mod.py", "change": "modified"}]
    assert status.metadata["untracked"] == ["new.py"]
    assert "keep.txt" not in status.output
    assert "a/mod.py" in diff.output and "keep.txt" not in diff.output
    assert diff.metadata["files_changed"] == 1
    assert commit.success, commit.error
    assert commit.metadata["files"] == [{"path": "mod.py", "change": "modified"}]
    assert git(repo, "status", "--porcelain") == " M keep.txt\n?? pkg/new.py\n"


# --- git_diff -------------------------------------------------------------------------------


async def test_diff_shows_unstaged_changes_with_counts(repo: Path) -> None:
    (repo / "keep.txt").write_text("one\n2\nthree\n")

    result = await call("git_diff", repo)

    assert result.success, result.error
    assert "--- a/keep.txt" in result.output
    assert "-two\n+2\n+three" in result.output
    meta = result.metadata
    assert (meta["files_changed"], meta["insertions"], meta["deletions"]) == (1, 2, 1)
    assert meta["compared"] == "working tree vs index"


async def test_diff_staged_compares_index_with_head(repo: Path) -> None:
    (repo / "keep.txt").write_text("staged\n")
    git(repo, "add", "keep.txt")
    (repo / "old.txt").write_text("not staged\n")

    unstaged = await call("git_diff", repo)
    staged = await call("git_diff", repo, staged=True)

    assert "+staged" in staged.output and "old.txt" not in staged.output
    assert "+not staged" in unstaged.output and "keep.txt" not in unstaged.output
    assert staged.metadata["compared"] == "index vs HEAD"


async def test_diff_against_a_ref_and_limited_to_a_path(repo: Path) -> None:
    commit_file(repo, "keep.txt", "committed later\n", "second")
    (repo / "old.txt").write_text("edited\n")

    against_first = await call("git_diff", repo, ref="HEAD~1", path="keep.txt")

    assert against_first.success, against_first.error
    assert "+committed later" in against_first.output
    assert "old.txt" not in against_first.output
    assert against_first.metadata["files_changed"] == 1
    assert against_first.metadata["compared"] == "working tree vs HEAD~1"


async def test_diff_without_changes_succeeds_with_a_note(repo: Path) -> None:
    result = await call("git_diff", repo, staged=True)
    assert result.success
    assert result.output == "No changes (index vs HEAD)."
    assert result.metadata["files_changed"] == 0


async def test_diff_with_unknown_ref_fails_clearly(repo: Path) -> None:
    result = await call("git_diff", repo, ref="no-such-branch")
    assert not result.success
    assert "unknown revision 'no-such-branch'" in result.error


async def test_ref_that_looks_like_an_option_is_rejected(repo: Path) -> None:
    with pytest.raises(InvalidArgument, match="ref"):
        await call("git_diff", repo, ref="--output=/tmp/x")


# --- git_log --------------------------------------------------------------------------------


async def test_log_lists_commits_newest_first(repo: Path) -> None:
    commit_file(repo, "keep.txt", "2\n", "Second change")
    commit_file(repo, "other.txt", "3\n", "Third change")

    result = await call("git_log", repo)

    assert result.success, result.error
    commits = result.metadata["commits"]
    assert [c["subject"] for c in commits] == ["Third change", "Second change", "initial"]
    assert commits[0]["author"] == "Ada Lovelace" and commits[0]["email"] == "ada@example.com"
    assert commits[0]["sha"] == git(repo, "rev-parse", "HEAD").strip()
    first_line = result.output.splitlines()[0]
    assert first_line.startswith(commits[0]["sha"][:7])
    assert "Ada Lovelace" in first_line and commits[0]["date"] in first_line
    assert first_line.endswith("Third change")


async def test_log_honours_max_count_path_and_ref(repo: Path) -> None:
    commit_file(repo, "keep.txt", "2\n", "touch keep")
    commit_file(repo, "other.txt", "3\n", "touch other")
    git(repo, "branch", "old", "HEAD~1")

    limited = await call("git_log", repo, max_count=1)
    by_path = await call("git_log", repo, path="keep.txt")
    from_ref = await call("git_log", repo, ref="old")

    assert [c["subject"] for c in limited.metadata["commits"]] == ["touch other"]
    assert [c["subject"] for c in by_path.metadata["commits"]] == ["touch keep", "initial"]
    assert [c["subject"] for c in from_ref.metadata["commits"]] == ["touch keep", "initial"]


async def test_log_of_a_repository_without_commits_is_empty(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "fresh")
    result = await call("git_log", repo)
    assert result.success
    assert result.metadata["commits"] == [] and result.metadata["count"] == 0
    assert "No commits yet" in result.output


async def test_log_failures(repo: Path) -> None:
    bad_ref = await call("git_log", repo, ref="nope")
    assert not bad_ref.success and "unknown revision 'nope'" in bad_ref.error
    with pytest.raises(InvalidArgument, match="max_count"):
        await call("git_log", repo, max_count=0)


# --- git_commit -----------------------------------------------------------------------------


async def test_commit_paths_commits_new_and_deleted_files_only(repo: Path) -> None:
    (repo / "feature.py").write_text("print('hi')\n")
    (repo / "old.txt").unlink()
    (repo / "keep.txt").write_text("staged separately\n")
    git(repo, "add", "keep.txt")

    result = await call("git_commit", repo, message="Add feature", paths=["feature.py", "old.txt"])

    assert result.success, result.error
    assert result.metadata["sha"] == git(repo, "rev-parse", "HEAD").strip()
    assert sorted(result.metadata["files"], key=lambda c: c["path"]) == [
        {"path": "feature.py", "change": "added"},
        {"path": "old.txt", "change": "deleted"},
    ]
    assert git(repo, "show", "--name-status", "--format=%s", "HEAD").split() == [
        "Add",
        "feature",
        "A",
        "feature.py",
        "D",
        "old.txt",
    ]
    assert git(repo, "status", "--porcelain") == "M  keep.txt\n"
    assert result.output.startswith(f"[main {result.metadata['sha'][:7]}] Add feature")


async def test_commit_all_takes_tracked_changes_but_not_new_files(repo: Path) -> None:
    (repo / "keep.txt").write_text("edited\n")
    (repo / "old.txt").unlink()
    (repo / "untracked.txt").write_text("new\n")

    result = await call("git_commit", repo, message="Tidy up", all=True)

    assert result.success, result.error
    assert git(repo, "status", "--porcelain") == "?? untracked.txt\n"
    assert {c["path"] for c in result.metadata["files"]} == {"keep.txt", "old.txt"}


async def test_commit_without_paths_commits_the_index(repo: Path) -> None:
    (repo / "keep.txt").write_text("staged\n")
    git(repo, "add", "keep.txt")
    (repo / "old.txt").write_text("left unstaged\n")

    result = await call("git_commit", repo, message="Commit the index")

    assert result.success, result.error
    assert git(repo, "log", "-1", "--format=%s") == "Commit the index\n"
    assert git(repo, "status", "--porcelain") == " M old.txt\n"


async def test_first_commit_in_an_empty_repository(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "fresh")
    (repo / "README.md").write_text("# hi\n")

    result = await call("git_commit", repo, message="Initial commit", paths=["."])

    assert result.success, result.error
    assert result.metadata["files"] == [{"path": "README.md", "change": "added"}]
    assert git(repo, "rev-parse", "HEAD").strip() == result.metadata["sha"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "nothing is staged"),
        ({"all": True}, "no tracked file in the workspace has changes"),
        ({"paths": ["keep.txt"]}, "no changes in keep.txt"),
        ({"paths": ["ghost.txt"]}, "no changes in ghost.txt"),
    ],
)
async def test_commit_with_nothing_to_commit_is_refused(
    repo: Path, args: dict[str, Any], expected: str
) -> None:
    (repo / "untracked.txt").write_text("new\n")
    head = git(repo, "rev-parse", "HEAD")

    result = await call("git_commit", repo, message="empty", **args)

    assert not result.success
    assert "nothing to commit" in result.error and expected in result.error
    assert git(repo, "rev-parse", "HEAD") == head


async def test_commit_naming_an_unknown_path_fails_with_gits_message(repo: Path) -> None:
    (repo / "keep.txt").write_text("edited\n")
    result = await call("git_commit", repo, message="x", paths=["keep.txt", "ghost.txt"])
    assert not result.success
    assert "git commit failed" in result.error and "ghost.txt" in result.error
    assert git(repo, "log", "--format=%s") == "initial\n"


async def test_commit_paths_after_a_staged_rename(repo: Path) -> None:
    git(repo, "mv", "old.txt", "new.txt")

    result = await call("git_commit", repo, message="Rename", paths=["old.txt", "new.txt"])

    assert result.success, result.error
    assert result.metadata["files"] == [{"path": "new.txt", "change": "renamed", "from": "old.txt"}]
    assert "renamed: old.txt -> new.txt" in result.output
    assert git(repo, "status", "--porcelain") == ""


async def test_commit_of_a_symlink_records_the_link_not_its_target(repo: Path) -> None:
    (repo / "link.txt").symlink_to("keep.txt")
    (repo / "keep.txt").write_text("target edited, not committed\n")

    result = await call("git_commit", repo, message="Add link", paths=["link.txt"])

    assert result.success, result.error
    assert result.metadata["files"] == [{"path": "link.txt", "change": "added"}]
    assert git(repo, "ls-tree", "HEAD", "link.txt").startswith("120000 ")
    assert git(repo, "status", "--porcelain") == " M keep.txt\n"


@pytest.mark.parametrize("message", ["", "   \n"])
async def test_commit_message_must_not_be_empty(repo: Path, message: str) -> None:
    with pytest.raises(InvalidArgument, match="message"):
        await call("git_commit", repo, message=message, all=True)


async def test_commit_author_must_be_name_and_email(repo: Path) -> None:
    with pytest.raises(InvalidArgument, match="author"):
        await call("git_commit", repo, message="x", all=True, author="just a name")


async def test_commit_without_identity_fails_clearly(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "anon", identity=False)
    git(repo, "config", "user.useConfigOnly", "true")  # no guessing from the host name
    (repo / "a.txt").write_text("a\n")

    result = await call("git_commit", repo, message="x", paths=["a.txt"])

    assert not result.success
    assert "no identity" in result.error and "author" in result.error


async def test_commit_without_identity_uses_the_author_given(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "anon", identity=False)
    git(repo, "config", "user.useConfigOnly", "true")
    (repo / "a.txt").write_text("a\n")

    result = await call(
        "git_commit", repo, message="x", paths=["a.txt"], author="Grace Hopper <grace@navy.mil>"
    )

    assert result.success, result.error
    recorded = git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>").strip()
    assert recorded == "Grace Hopper <grace@navy.mil>|Grace Hopper <grace@navy.mil>"


async def test_commit_author_overrides_the_configured_one(repo: Path) -> None:
    (repo / "keep.txt").write_text("x\n")
    result = await call("git_commit", repo, message="x", all=True, author="Grace Hopper <grace@navy.mil>")
    assert result.success, result.error
    recorded = git(repo, "log", "-1", "--format=%an|%cn").strip()
    assert recorded == "Grace Hopper|Ada Lovelace"


async def test_session_environment_reaches_git(repo: Path) -> None:
    (repo / "keep.txt").write_text("x\n")
    env = {"GIT_AUTHOR_NAME": "Env Author", "GIT_AUTHOR_DATE": "2001-02-03T04:05:06+00:00"}

    result = await call("git_commit", repo, env=env, message="from env", all=True)
    log = await call("git_log", repo, max_count=1)

    assert result.success, result.error
    assert log.metadata["commits"][0]["author"] == "Env Author"
    assert log.metadata["commits"][0]["date"] == "2001-02-03T04:05:06+00:00"


async def test_commit_leaves_submodules_alone(tmp_path: Path, repo: Path) -> None:
    """git add and path commits would start git inside a submodule, under its own configuration."""
    upstream = init_repo(tmp_path / "upstream")
    commit_file(upstream, "s.txt", "sub\n", "s")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(upstream), "sm")
    git(repo, "commit", "-q", "-m", "add sm")
    commit_file(upstream, "s.txt", "moved on\n", "s2")
    git(repo / "sm", "pull", "-q", "--ff-only")
    (repo / "keep.txt").write_text("changed\n")

    named = await call("git_commit", repo, message="x", paths=["sm"])
    everything = await call("git_commit", repo, message="x", paths=["."])

    assert not named.success and "sm is a submodule" in named.error
    assert everything.success, everything.error
    assert everything.metadata["files"] == [{"path": "keep.txt", "change": "modified"}]
    status = await call("git_status", repo)
    assert status.metadata["unstaged"] == [{"path": "sm", "change": "modified"}]
