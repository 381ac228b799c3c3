"""grep: real ripgrep over real files in a temporary workspace."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools import code_search
from a3s_agent.tools.code_search import TOOLS
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry

from ..conftest import eventually
from ..fault.conftest import zombie_children


async def grep(workspace: Path, **arguments: object) -> ToolOutput:
    return await ToolRegistry(TOOLS).run("grep", json.dumps(arguments), ToolContext(workspace=workspace))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text(
        "import os\n\ndef load_config(path):\n    return open(path)\n\nconfig = load_config('x')\n"
    )
    (tmp_path / "src" / "util.js").write_text("// Load helpers\nfunction load_config() {}\n")
    (tmp_path / "README.md").write_text("Call LOAD_CONFIG first.\n")
    return tmp_path


def test_grep_is_a_query_tool_in_the_code_family() -> None:
    assert (TOOLS[0].name, TOOLS[0].tags) == ("grep", ["code", "query"])


async def test_matches_are_listed_as_path_line_text_relative_to_the_workspace(workspace: Path) -> None:
    result = await grep(workspace, pattern=r"load_config\(")
    assert result.success
    assert sorted(result.output.splitlines()) == [
        "src/app.py:3:def load_config(path):",
        "src/app.py:6:config = load_config('x')",
        "src/util.js:2:function load_config() {}",
    ]
    assert result.metadata["matches"] == 3
    assert result.metadata["files"] == 2
    assert result.metadata["truncated"] is False


async def test_no_match_is_a_success_with_zero_matches(workspace: Path) -> None:
    result = await grep(workspace, pattern="does_not_occur_anywhere")
    assert result.success
    assert result.metadata["matches"] == 0
    assert "No matches" in result.output


async def test_invalid_regex_is_a_clear_failure(workspace: Path) -> None:
    result = await grep(workspace, pattern="load_config(")
    assert not result.success
    assert "regex parse error" in result.error
    assert "Escape" in result.error


async def test_glob_restricts_the_files_searched(workspace: Path) -> None:
    result = await grep(workspace, pattern="load_config", glob="*.js")
    assert result.output == "src/util.js:2:function load_config() {}"
    excluded = await grep(workspace, pattern="load_config", glob="!*.py")
    assert "src/app.py" not in excluded.output and "src/util.js" in excluded.output


async def test_case_insensitive_finds_other_casings(workspace: Path) -> None:
    sensitive = await grep(workspace, pattern="load_config", glob="*.md")
    insensitive = await grep(workspace, pattern="load_config", glob="*.md", case_insensitive=True)
    assert sensitive.metadata["matches"] == 0
    assert insensitive.output == "README.md:1:Call LOAD_CONFIG first."


async def test_context_lines_use_a_dash_separator(workspace: Path) -> None:
    result = await grep(workspace, pattern="^def ", path="src/app.py", context=1)
    assert result.output.splitlines() == [
        "src/app.py-2-",
        "src/app.py:3:def load_config(path):",
        "src/app.py-4-    return open(path)",
    ]
    assert result.metadata["matches"] == 1


async def test_a_file_path_searches_only_that_file(workspace: Path) -> None:
    result = await grep(workspace, pattern="load", path="src/util.js")
    assert result.output == "src/util.js:2:function load_config() {}"


async def test_max_results_stops_early_and_says_more_exist(tmp_path: Path) -> None:
    (tmp_path / "many.txt").write_text("".join(f"hit {i}\n" for i in range(200_000)))
    result = await grep(tmp_path, pattern="hit", max_results=5)
    lines = result.output.splitlines()
    assert lines[:5] == [f"many.txt:{i + 1}:hit {i}" for i in range(5)]
    assert "stopped after 5 matches" in lines[5] and len(lines) == 6
    assert result.metadata["matches"] == 5
    assert result.metadata["truncated"] is True


async def test_after_context_of_the_last_shown_match_is_kept(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("hit\nplain\nplain\nhit\n")
    result = await grep(tmp_path, pattern="hit", max_results=1, context=1)
    assert result.output.splitlines()[:2] == ["f.txt:1:hit", "f.txt-2-plain"]
    assert result.metadata["truncated"] is True


async def test_exactly_max_results_matches_is_not_truncated(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("hit\nhit\n")
    result = await grep(tmp_path, pattern="hit", max_results=2)
    assert (result.metadata["matches"], result.metadata["truncated"]) == (2, False)
    assert "stopped" not in result.output


async def test_a_binary_file_named_explicitly_is_reported_not_dumped(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(b"needle\0\x01\x02")
    result = await grep(tmp_path, pattern="needle", path="blob.bin")
    assert result.success
    assert "binary file matches" in result.output
    assert result.metadata["matches"] == 0


async def test_gitignored_files_are_skipped(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("build/\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "out.txt").write_text("needle\n")
    (tmp_path / "kept.txt").write_text("needle\n")
    result = await grep(tmp_path, pattern="needle")
    assert result.output == "kept.txt:1:needle"


async def test_a_pattern_starting_with_a_dash_is_a_pattern_not_a_flag(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x --verbose y\n")
    result = await grep(tmp_path, pattern="--verbose")
    assert result.output == "f.txt:1:x --verbose y"


def _processes_in(directory: Path) -> list[int]:
    """Processes whose working directory is `directory` (rg runs in the workspace)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "cwd") == str(directory.resolve()):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


async def test_a_search_that_hangs_is_stopped_at_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(tmp_path / "pipe")  # rg blocks forever opening a FIFO nobody writes to
    monkeypatch.setattr(code_search, "_RG_TIMEOUT_S", 0.3)
    result = await asyncio.wait_for(grep(tmp_path, pattern="x", path="pipe"), 5)
    assert result.success
    assert result.metadata["timed_out"] is True and result.metadata["truncated"] is True
    assert "search stopped" in result.output
    assert _processes_in(tmp_path) == []


async def test_cancelling_a_search_kills_ripgrep(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    task = asyncio.create_task(grep(tmp_path, pattern="x", path="pipe"))
    await eventually(lambda: _processes_in(tmp_path), "rg runs, stuck on the FIFO")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _processes_in(tmp_path) == []


@pytest.mark.parametrize("path", ["..", "../other", "/etc"])
async def test_paths_outside_the_workspace_are_refused(workspace: Path, path: str) -> None:
    result = await grep(workspace, pattern="root", path=path)
    assert not result.success
    assert "outside the workspace" in result.error


async def test_a_missing_path_is_a_failure(workspace: Path) -> None:
    result = await grep(workspace, pattern="x", path="nope")
    assert not result.success
    assert "does not exist" in result.error


@pytest.mark.parametrize(
    "arguments",
    [
        {"pattern": "x", "context": 11},
        {"pattern": "x", "max_results": 0},
        {"pattern": ""},
        {"pattern": "x", "n": 1},
    ],
)
async def test_out_of_range_or_unknown_arguments_are_rejected(
    workspace: Path, arguments: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgument):
        await grep(workspace, **arguments)


async def test_a_glob_no_file_matches_is_zero_matches_not_a_failure(workspace: Path) -> None:
    result = await grep(workspace, pattern="load_config", glob="*.rs")
    assert result.success, result.error
    assert result.metadata["matches"] == 0 and "No matches" in result.output


def _descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("pidfds", [True, False])
async def test_searches_that_end_every_way_leave_no_descriptor_or_zombie_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfds: bool
) -> None:
    if not pidfds:  # as a seccomp filter or Linux < 5.3 would: the exit is awaited in a thread

        def refused(pid: int, flags: int = 0) -> int:
            raise OSError(errno.ENOSYS, "pidfd_open refused")

        monkeypatch.setattr(os, "pidfd_open", refused)
    (tmp_path / "many.txt").write_text("".join(f"hit {i}\n" for i in range(100_000)))
    os.mkfifo(tmp_path / "pipe")
    monkeypatch.setattr(code_search, "_RG_TIMEOUT_S", 0.3)
    before = _descriptors()
    zombies_before = zombie_children(os.getpid())  # left by other tests of this process, whatever they ran
    many = await grep(tmp_path, pattern="hit", path="many.txt", max_results=4000)  # many pipe reads
    assert (many.metadata["matches"], many.metadata["truncated"]) == (4000, True)
    assert many.output.splitlines()[3999] == "many.txt:4000:hit 3999"
    early = await grep(tmp_path, pattern="hit 9", path="many.txt", max_results=3)
    assert early.output.splitlines()[:3] == ["many.txt:10:hit 9", "many.txt:91:hit 90", "many.txt:92:hit 91"]
    assert (await grep(tmp_path, pattern="(", path="many.txt")).error.startswith("invalid regular expression")
    assert (await grep(tmp_path, pattern="x", path="pipe")).metadata["timed_out"] is True
    assert _descriptors() <= before
    await eventually(lambda: not zombie_children(os.getpid()) - zombies_before, "every rg reaped")
    assert _processes_in(tmp_path) == []
