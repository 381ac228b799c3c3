"""The file tools, called as the server calls them: through the registry, on real files."""

from __future__ import annotations

import asyncio
import base64
import difflib
import errno
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools import beneath
from a3s_agent.tools.edit_diff import replacement_diff
from a3s_agent.tools.files import TOOLS
from a3s_agent.tools.gitignore import walk_tree
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry

REGISTRY = ToolRegistry(TOOLS)


async def call(workspace: Path, name: str, max_output_bytes: int = 100_000, **arguments: Any) -> ToolOutput:
    ctx = ToolContext(workspace=workspace, max_output_bytes=max_output_bytes)
    return await REGISTRY.run(name, json.dumps(arguments), ctx)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace, with a file the tools must never touch."""
    path = tmp_path / "outside"
    write(path / "secret.txt", "top secret\n")
    return path


def test_tools_are_in_the_file_family_with_strict_schemas() -> None:
    lanes = {tool.name: tool.lane for tool in TOOLS}
    assert lanes == {
        "read_file": "query",
        "write_file": "execute",
        "edit_file": "execute",
        "delete_file": "execute",
        "list_files": "query",
        "search_files": "query",
    }
    for tool in TOOLS:
        assert tool.family == "file"
        assert tool.parameters_schema["additionalProperties"] is False
        assert all(
            "type" in prop or "anyOf" in prop for prop in tool.parameters_schema["properties"].values()
        )


# read_file


async def test_read_file_numbers_lines_like_cat_n(workspace: Path) -> None:
    write(workspace / "a.py", "import os\n\nprint(os.getcwd())\n")
    result = await call(workspace, "read_file", path="a.py")
    assert result.success
    assert result.output.splitlines() == [
        "     1\timport os",
        "     2\t",
        "     3\tprint(os.getcwd())",
        "(lines 1-3 of 3)",
    ]
    assert result.metadata["total_lines"] == 3
    assert result.metadata["lines"] == 3
    assert result.metadata["bytes"] == 30
    assert result.metadata["truncated"] is False


async def test_read_file_window_says_how_to_read_more(workspace: Path) -> None:
    write(workspace / "big.txt", "".join(f"line {n}\n" for n in range(1, 101)))
    result = await call(workspace, "read_file", path="big.txt", offset=10, limit=5)
    lines = result.output.splitlines()
    assert lines[0] == "    11\tline 11"
    assert lines[4] == "    15\tline 15"
    assert lines[5] == "(lines 11-15 of 100; use offset=15 to read more)"
    assert result.metadata == result.metadata | {"total_lines": 100, "lines": 5, "truncated": True}
    follow = await call(workspace, "read_file", path="big.txt", offset=15, limit=1)
    assert follow.output.splitlines()[0] == "    16\tline 16"


async def test_read_file_last_line_without_newline_and_crlf(workspace: Path) -> None:
    write(workspace / "w.txt", b"one\r\ntwo\r\nthree")
    result = await call(workspace, "read_file", path="w.txt")
    assert result.output.splitlines()[:3] == ["     1\tone", "     2\ttwo", "     3\tthree"]
    assert result.metadata["total_lines"] == 3


async def test_read_file_offset_past_the_end_and_empty_file(workspace: Path) -> None:
    write(workspace / "short.txt", "a\nb\n")
    past = await call(workspace, "read_file", path="short.txt", offset=2)
    assert not past.success
    assert "past the end" in past.error and "2 lines" in past.error
    write(workspace / "empty.txt", "")
    empty = await call(workspace, "read_file", path="empty.txt")
    assert empty.success and empty.output == "(empty file)"
    assert empty.metadata["total_lines"] == 0


async def test_read_file_cuts_long_lines(workspace: Path) -> None:
    write(workspace / "min.js", "x" * 5000 + "\nshort\n")
    result = await call(workspace, "read_file", path="min.js")
    first = result.output.splitlines()[0]
    assert first.startswith("     1\t" + "x" * 2000 + "...")
    assert "5000 characters" in first
    assert "x" * 2001 not in result.output
    assert "1 line(s) longer than 2000 characters were cut" in result.output
    assert result.metadata["truncated"] is True


async def test_read_file_stops_within_the_output_budget_with_an_accurate_footer(workspace: Path) -> None:
    write(workspace / "wide.txt", "".join(f"{n:04} " + "y" * 95 + "\n" for n in range(1000)))
    result = await call(workspace, "read_file", max_output_bytes=5000, path="wide.txt")
    assert len(result.output.encode()) <= 5000
    shown = result.metadata["lines"]
    assert 0 < shown < 1000
    assert result.output.endswith(f"(lines 1-{shown} of 1000; use offset={shown} to read more)")


async def test_read_file_refuses_binary_and_undecodable_files(workspace: Path) -> None:
    write(workspace / "img.bin", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    binary = await call(workspace, "read_file", path="img.bin")
    assert not binary.success
    assert "binary" in binary.error and 'encoding="base64"' in binary.error
    write(workspace / "latin1.txt", "caf\xe9\n".encode("latin-1"))
    latin = await call(workspace, "read_file", path="latin1.txt")
    assert not latin.success
    assert "not utf-8 text" in latin.error and "base64" in latin.error
    write(workspace / "utf8.txt", "café\n")
    ascii_only = await call(workspace, "read_file", path="utf8.txt", encoding="ascii")
    assert not ascii_only.success and "not ascii text" in ascii_only.error


async def test_read_file_base64_returns_the_raw_bytes(workspace: Path) -> None:
    data = bytes(range(256)) * 4
    write(workspace / "blob.bin", data)
    result = await call(workspace, "read_file", path="blob.bin", encoding="base64")
    assert result.success
    assert base64.b64decode(result.output) == data
    assert result.metadata["bytes"] == 1024
    too_big = await call(workspace, "read_file", max_output_bytes=1000, path="blob.bin", encoding="base64")
    assert not too_big.success
    assert "1024 bytes" in too_big.error and "limited to 750 bytes" in too_big.error


async def test_read_file_missing_file_directory_and_bad_arguments(workspace: Path) -> None:
    missing = await call(workspace, "read_file", path="nope.txt")
    assert not missing.success and "nope.txt does not exist" in missing.error
    (workspace / "src").mkdir()
    directory = await call(workspace, "read_file", path="src")
    assert not directory.success and "is a directory" in directory.error and "list_files" in directory.error
    os.mkfifo(workspace / "pipe")
    fifo = await call(workspace, "read_file", path="pipe")
    assert not fifo.success and "not a regular file" in fifo.error
    with pytest.raises(InvalidArgument, match="offset"):
        await call(workspace, "read_file", path="a", offset=-1)
    with pytest.raises(InvalidArgument, match="encoding"):
        await call(workspace, "read_file", path="a", encoding="latin-1")
    with pytest.raises(InvalidArgument, match="lines"):
        await call(workspace, "read_file", path="a", lines=3)


async def test_read_file_large_file_goes_through_the_worker_path(workspace: Path) -> None:
    write(workspace / "huge.log", "".join(f"entry {n}\n" for n in range(200_000)))
    result = await call(workspace, "read_file", path="huge.log", offset=199_998)
    assert result.output.splitlines() == [
        "199999\tentry 199998",
        "200000\tentry 199999",
        "(lines 199999-200000 of 200000)",
    ]


async def test_read_file_bounds_memory_on_huge_lines(workspace: Path) -> None:
    write(workspace / "blob.min.js", b"".join(bytes([97 + n]) * 3_000_000 + b"\n" for n in range(5)))
    result = await call(workspace, "read_file", path="blob.min.js")
    assert result.metadata == result.metadata | {"total_lines": 5, "lines": 2, "truncated": True}
    assert result.output.splitlines()[1].startswith("     2\t" + "b" * 2000 + "...")
    assert "(lines 1-2 of 5; use offset=2 to read more)" in result.output


# write_file


async def test_write_file_creates_parents_and_reports_bytes(workspace: Path) -> None:
    result = await call(workspace, "write_file", path="pkg/sub/mod.py", content="x = 'é'\n")
    assert result.success
    assert (workspace / "pkg/sub/mod.py").read_text() == "x = 'é'\n"
    assert result.metadata == result.metadata | {"bytes": 9, "created": True, "path": "pkg/sub/mod.py"}
    assert result.output == "Created pkg/sub/mod.py (9 bytes)"


async def test_write_file_overwrites_keeping_mode_and_leaves_no_temp_files(workspace: Path) -> None:
    script = write(workspace / "run.sh", "echo old\n")
    script.chmod(0o751)
    result = await call(workspace, "write_file", path="run.sh", content="echo new\n")
    assert result.success and result.metadata["created"] is False
    assert script.read_text() == "echo new\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o751
    assert names(workspace) == ["run.sh"]


async def test_write_file_new_file_gets_default_permissions(workspace: Path) -> None:
    await call(workspace, "write_file", path="new.txt", content="hi")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((workspace / "new.txt").stat().st_mode) == 0o666 & ~umask


async def test_write_file_refuses_to_overwrite_when_told_not_to(workspace: Path) -> None:
    original = write(workspace / "keep.txt", "original\n")
    refused = await call(workspace, "write_file", path="keep.txt", content="new", overwrite=False)
    assert not refused.success and "already exists" in refused.error and "overwrite=true" in refused.error
    assert original.read_text() == "original\n"


async def test_write_file_failing_midway_keeps_the_original_and_cleans_up(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = write(workspace / "keep.txt", "original\n")

    def disk_full(src: str, dst: str, **dir_fds: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    result = await call(workspace, "write_file", path="keep.txt", content="new content")
    assert not result.success and result.error == "cannot write keep.txt: No space left on device"
    assert original.read_text() == "original\n"
    assert names(workspace) == ["keep.txt"]


@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
async def test_a_slow_disk_does_not_stall_the_event_loop(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """Each write is synced twice; a busy disk makes a sync take long, and the event loop serves
    every other session meanwhile: it must keep turning while a small file is written."""
    write(workspace / "a.txt", "old\n")
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.2)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    arguments: dict[str, Any] = (
        {"content": "new\n"} if tool == "write_file" else {"old_string": "old", "new_string": "new"}
    )
    result = await call(workspace, tool, path="a.txt", **arguments)
    ticker.cancel()
    assert result.success and (workspace / "a.txt").read_text() == "new\n"
    assert ticks >= 10, f"the event loop turned {ticks} times in 0.4 s of syncing"


async def test_write_file_base64_and_its_errors(workspace: Path) -> None:
    data = b"\x00\x01\xffbinary"
    encoded = base64.b64encode(data).decode()
    result = await call(
        workspace, "write_file", path="b.bin", content=f"{encoded[:8]}\n{encoded[8:]}", encoding="base64"
    )
    assert result.success and (workspace / "b.bin").read_bytes() == data
    assert result.metadata["bytes"] == len(data)
    bad = await call(workspace, "write_file", path="c.bin", content="not base64!", encoding="base64")
    assert not bad.success and "not valid base64" in bad.error
    assert not (workspace / "c.bin").exists()


async def test_write_file_refuses_a_directory_target(workspace: Path) -> None:
    (workspace / "dir").mkdir()
    result = await call(workspace, "write_file", path="dir", content="x")
    assert not result.success and "is a directory" in result.error
    blocked = write(workspace / "file.txt", "x")
    under_file = await call(workspace, "write_file", path="file.txt/child.txt", content="x")
    assert not under_file.success and "file.txt/child.txt" in under_file.error
    assert blocked.read_text() == "x"


# edit_file


SOURCE = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


async def test_edit_file_replaces_once_and_returns_a_diff(workspace: Path) -> None:
    target = write(workspace / "calc.py", "def add(a, b):\n    return a - b\n")
    target.chmod(0o640)
    result = await call(workspace, "edit_file", path="calc.py", old_string="a - b", new_string="a + b")
    assert result.success
    assert target.read_text() == "def add(a, b):\n    return a + b\n"
    assert result.metadata["replacements"] == 1
    assert "--- a/calc.py\n+++ b/calc.py\n" in result.output
    assert "-    return a - b\n+    return a + b\n" in result.output
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert names(workspace) == ["calc.py"]


async def test_edit_file_ambiguous_match_names_the_lines(workspace: Path) -> None:
    target = write(workspace / "calc.py", SOURCE)
    result = await call(
        workspace, "edit_file", path="calc.py", old_string="return a - b", new_string="return 0"
    )
    assert not result.success
    assert "occurs 2 times" in result.error and "lines 2, 6" in result.error and "replace_all" in result.error
    assert result.metadata["occurrences"] == 2
    assert target.read_text() == SOURCE


async def test_edit_file_replace_all(workspace: Path) -> None:
    target = write(workspace / "calc.py", SOURCE)
    result = await call(
        workspace, "edit_file", path="calc.py", old_string="a - b", new_string="b - a", replace_all=True
    )
    assert result.success and result.metadata["replacements"] == 2
    assert target.read_text() == SOURCE.replace("a - b", "b - a")


async def test_edit_file_missing_text_empty_and_identical_strings(workspace: Path) -> None:
    target = write(workspace / "calc.py", SOURCE)
    absent = await call(workspace, "edit_file", path="calc.py", old_string="return a * b", new_string="x")
    assert not absent.success and "not found" in absent.error and "read_file" in absent.error
    empty = await call(workspace, "edit_file", path="calc.py", old_string="", new_string="x")
    assert not empty.success and "old_string is empty" in empty.error
    same = await call(workspace, "edit_file", path="calc.py", old_string="add", new_string="add")
    assert not same.success and "identical" in same.error
    missing = await call(workspace, "edit_file", path="other.py", old_string="a", new_string="b")
    assert not missing.success and "does not exist" in missing.error
    assert target.read_text() == SOURCE


async def test_edit_file_matches_lf_text_in_a_crlf_file(workspace: Path) -> None:
    target = write(workspace / "win.txt", b"first\r\nsecond\r\nthird\r\n")
    result = await call(
        workspace, "edit_file", path="win.txt", old_string="first\nsecond", new_string="one\ntwo"
    )
    assert result.success
    assert target.read_bytes() == b"one\r\ntwo\r\nthird\r\n"


async def test_edit_file_refuses_binary_files(workspace: Path) -> None:
    target = write(workspace / "data.bin", b"\xff\xfe\x00abc")
    result = await call(workspace, "edit_file", path="data.bin", old_string="abc", new_string="xyz")
    assert not result.success and "not utf-8 text" in result.error
    assert target.read_bytes() == b"\xff\xfe\x00abc"


# delete_file


async def test_delete_file_removes_a_file(workspace: Path) -> None:
    write(workspace / "tmp/old.txt", "12345")
    result = await call(workspace, "delete_file", path="tmp/old.txt")
    assert result.success and result.output == "Deleted tmp/old.txt"
    assert result.metadata == result.metadata | {"kind": "file", "bytes": 5}
    assert not (workspace / "tmp/old.txt").exists()
    assert (workspace / "tmp").is_dir()


async def test_delete_file_refuses_directories_and_missing_files(workspace: Path) -> None:
    (workspace / "src").mkdir()
    directory = await call(workspace, "delete_file", path="src")
    assert not directory.success and "is a directory" in directory.error
    assert (workspace / "src").is_dir()
    workspace_itself = await call(workspace, "delete_file", path=".")
    assert not workspace_itself.success and "is a directory" in workspace_itself.error
    missing = await call(workspace, "delete_file", path="ghost.txt")
    assert not missing.success and "does not exist" in missing.error


async def test_delete_file_removes_symlinks_not_their_targets(workspace: Path, outside: Path) -> None:
    real = write(workspace / "real.txt", "keep me")
    (workspace / "inner_link").symlink_to(real)
    (workspace / "outer_link").symlink_to(outside)
    inner = await call(workspace, "delete_file", path="inner_link")
    assert inner.success and inner.metadata["kind"] == "symlink"
    outer = await call(workspace, "delete_file", path="outer_link")
    assert outer.success
    assert real.read_text() == "keep me"
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert names(workspace) == ["real.txt"]


# the sandbox


ESCAPES = ["../outside/secret.txt", "/etc/passwd", "link/secret.txt", "sub/../../outside/secret.txt"]


@pytest.mark.parametrize("raw", ESCAPES)
async def test_no_path_tool_reaches_outside_the_workspace(workspace: Path, outside: Path, raw: str) -> None:
    (workspace / "link").symlink_to(outside)
    (workspace / "sub").mkdir()
    attempts: list[tuple[str, dict[str, Any]]] = [
        ("read_file", {"path": raw}),
        ("read_file", {"path": raw, "encoding": "base64"}),
        ("write_file", {"path": raw, "content": "pwned"}),
        ("edit_file", {"path": raw, "old_string": "top", "new_string": "pwned"}),
        ("delete_file", {"path": raw}),
        ("list_files", {"path": os.path.dirname(raw)}),
        ("search_files", {"pattern": "*", "path": os.path.dirname(raw)}),
    ]
    for name, arguments in attempts:
        result = await call(workspace, name, **arguments)
        assert not result.success, (name, raw)
        assert "outside the workspace" in result.error, (name, raw, result.error)
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert names(outside) == ["secret.txt"]


async def test_a_link_inside_pointing_out_is_neither_read_nor_written(workspace: Path, outside: Path) -> None:
    (workspace / "alias.txt").symlink_to(outside / "secret.txt")
    (workspace / "dangling.txt").symlink_to(outside / "new.txt")
    attempts: list[tuple[str, dict[str, Any]]] = [
        ("read_file", {"path": "alias.txt"}),
        ("write_file", {"path": "alias.txt", "content": "pwned"}),
        ("write_file", {"path": "dangling.txt", "content": "pwned"}),
    ]
    for name, arguments in attempts:
        result = await call(workspace, name, **arguments)
        assert not result.success and "outside the workspace" in result.error
    assert not (outside / "new.txt").exists()
    assert (outside / "secret.txt").read_text() == "top secret\n"


async def test_search_and_list_do_not_follow_a_link_out(workspace: Path, outside: Path) -> None:
    (workspace / "link").symlink_to(outside)
    found = await call(workspace, "search_files", pattern="**/*.txt")
    assert found.metadata["count"] == 0
    listing = await call(workspace, "list_files", recursive=True)
    assert "secret" not in listing.output
    assert listing.output.splitlines()[0] == f"symlink           -  link -> {outside}"


@pytest.fixture(params=["openat2", "portable-walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once with the kernel's openat2 (where there is one) and once with the portable walk."""
    if request.param == "openat2" and not beneath.openat2_enabled:
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(beneath, "openat2_enabled", request.param == "openat2")
    return request.param


async def test_symlinks_that_stay_inside_keep_working(workspace: Path, resolver: str) -> None:
    write(workspace / "src/real.txt", "real\n")
    (workspace / "absolute.txt").symlink_to(workspace / "src/real.txt")  # openat2 refuses these: the walk
    (workspace / "relative").symlink_to("src")
    (workspace / "src/up").symlink_to("../src")
    for raw in ("absolute.txt", "relative/real.txt", "src/up/up/real.txt", "relative/../src/real.txt"):
        result = await call(workspace, "read_file", path=raw)
        assert result.success and "real" in result.output, (raw, result.error)
    written = await call(workspace, "write_file", path="absolute.txt", content="new\n")
    assert written.output == "Overwrote src/real.txt (4 bytes)"
    assert (workspace / "absolute.txt").is_symlink() and (workspace / "src/real.txt").read_text() == "new\n"
    (workspace / "later.txt").symlink_to("src/made/later.txt")  # dangling: writing creates the target
    created = await call(workspace, "write_file", path="later.txt", content="x")
    assert created.output == "Created src/made/later.txt (1 bytes)"
    edited = await call(
        workspace, "edit_file", path="relative/up/real.txt", old_string="new", new_string="old"
    )
    assert edited.success and edited.metadata["path"] == "src/real.txt"
    listed = await call(workspace, "list_files", path="relative/up", recursive=True)
    assert "src/made/later.txt" in listed.output


async def test_a_symlink_leading_out_through_dotdot_or_a_loop_is_refused(
    workspace: Path, outside: Path, resolver: str
) -> None:
    (workspace / "sub").mkdir()
    (workspace / "sub/up2").symlink_to("../..")  # the workspace's parent
    (workspace / "sub/sneaky").symlink_to(f"../../{outside.name}/secret.txt")
    (workspace / "loop").symlink_to("loop")
    for raw in ("sub/up2/outside/secret.txt", "sub/sneaky"):
        attempts: list[tuple[str, dict[str, Any]]] = [
            ("read_file", {"path": raw}),
            ("write_file", {"path": raw, "content": "pwned"}),
            ("edit_file", {"path": raw, "old_string": "top", "new_string": "pwned"}),
        ]
        for name, arguments in attempts:
            result = await call(workspace, name, **arguments)
            assert not result.success and "outside the workspace" in result.error, (name, raw, result.error)
    looped = await call(workspace, "read_file", path="loop/x")
    assert not looped.success and "symbolic links" in looped.error
    assert (outside / "secret.txt").read_text() == "top secret\n"


# list_files


@pytest.fixture
def project(workspace: Path) -> Path:
    write(workspace / ".gitignore", "*.log\nbuild/\n!keep.log\n")
    write(workspace / ".env", "SECRET=1\n")
    write(workspace / ".git/HEAD", "ref: refs/heads/main\n")
    write(workspace / "README.md", "# demo\n")
    write(workspace / "debug.log", "noise\n")
    write(workspace / "keep.log", "kept\n")
    write(workspace / "build/out.js", "x\n")
    write(workspace / "src/app.py", "print('hi')\n")
    write(workspace / "src/util.ts", "export {}\n")
    write(workspace / "src/ui/view.tsx", "<div/>\n")
    write(workspace / "src/ui/.gitignore", "generated/\n/local.tsx\n")
    write(workspace / "src/ui/generated/gen.tsx", "gen\n")
    write(workspace / "src/ui/local.tsx", "local\n")
    write(workspace / "src/ui/deep/local.tsx", "not the root one\n")
    write(workspace / "docs/guide.md", "guide\n")
    return workspace


async def test_list_files_shows_types_sizes_and_skips_hidden_and_ignored(project: Path) -> None:
    result = await call(project, "list_files")
    assert result.success
    assert result.output.splitlines() == [
        "file              7  README.md",
        "dir               -  docs/",
        "file              5  keep.log",
        "dir               -  src/",
        "(4 entries, 2 of them directories)",
    ]
    assert result.metadata == result.metadata | {"count": 4, "dirs": 2, "truncated": False}


async def test_list_files_include_hidden_never_shows_dot_git(project: Path) -> None:
    result = await call(project, "list_files", include_hidden=True)
    names = [line.split()[-1] for line in result.output.splitlines()[:-1]]
    assert names == [".env", ".gitignore", "README.md", "docs/", "keep.log", "src/"]


async def test_list_files_recursive_honours_nested_gitignores(project: Path) -> None:
    result = await call(project, "list_files", recursive=True)
    paths = [line.split()[-1] for line in result.output.splitlines()[:-1]]
    assert paths == [
        "README.md",
        "docs/",
        "docs/guide.md",
        "keep.log",
        "src/",
        "src/app.py",
        "src/ui/",
        "src/ui/deep/",
        "src/ui/deep/local.tsx",
        "src/ui/view.tsx",
        "src/util.ts",
    ]


async def test_list_files_subdirectory_applies_parent_gitignores(project: Path) -> None:
    write(project / "src/ui/trace.log", "ignored by the root .gitignore\n")
    result = await call(project, "list_files", path="src/ui")
    paths = [line.split()[-1] for line in result.output.splitlines()[:-1]]
    assert paths == ["src/ui/deep/", "src/ui/view.tsx"]


async def test_list_files_max_depth(project: Path) -> None:
    result = await call(project, "list_files", path="src", max_depth=2)
    paths = [line.split()[-1] for line in result.output.splitlines()[:-1]]
    assert paths == ["src/app.py", "src/ui/", "src/ui/deep/", "src/ui/view.tsx", "src/util.ts"]
    with pytest.raises(InvalidArgument, match="max_depth"):
        await call(project, "list_files", max_depth=0)


async def test_list_files_caps_entries(workspace: Path) -> None:
    for n in range(1005):
        (workspace / f"f{n:04}.txt").touch()
    result = await call(workspace, "list_files")
    assert result.metadata["count"] == 1000 and result.metadata["truncated"] is True
    assert "f0999.txt" in result.output and "f1000.txt" not in result.output
    assert "stopped at 1000 entries" in result.output and "max_depth" in result.output


async def test_list_files_errors_and_empty_directory(workspace: Path) -> None:
    write(workspace / "file.txt", "x")
    on_file = await call(workspace, "list_files", path="file.txt")
    assert not on_file.success and "not a directory" in on_file.error
    missing = await call(workspace, "list_files", path="nope")
    assert not missing.success and "does not exist" in missing.error
    write(workspace / "only_hidden/.hidden", "x")
    empty = await call(workspace, "list_files", path="only_hidden")
    assert empty.success and empty.metadata["count"] == 0
    assert "include_hidden=true" in empty.output


# search_files


async def test_search_files_recursive_glob_with_braces(project: Path) -> None:
    result = await call(project, "search_files", pattern="**/*.{ts,tsx}")
    assert result.success
    assert result.output.splitlines() == ["src/ui/deep/local.tsx", "src/ui/view.tsx", "src/util.ts"]
    assert result.metadata["count"] == 3


async def test_search_files_is_anchored_at_path_and_reports_workspace_paths(project: Path) -> None:
    top = await call(project, "search_files", pattern="*.md")
    assert top.output.splitlines() == ["README.md"]
    under = await call(project, "search_files", pattern="*.py", path="src")
    assert under.output.splitlines() == ["src/app.py"]
    nested = await call(project, "search_files", pattern="ui/*/*.tsx", path="./src")
    assert nested.output.splitlines() == ["src/ui/deep/local.tsx"]
    everything = await call(project, "search_files", pattern="src/**")
    assert everything.metadata["count"] == 4


async def test_search_files_hidden_only_when_the_pattern_names_the_dot(project: Path) -> None:
    write(project / ".github/workflows/ci.yml", "on: push\n")
    assert (await call(project, "search_files", pattern="**/*.yml")).metadata["count"] == 0
    found = await call(project, "search_files", pattern=".github/**/*.yml")
    assert found.output.splitlines() == [".github/workflows/ci.yml"]
    dotfiles = await call(project, "search_files", pattern=".*")
    assert dotfiles.output.splitlines() == [".env", ".gitignore"]


async def test_search_files_nested_braces_respect_anchored_gitignore(project: Path) -> None:
    result = await call(project, "search_files", pattern="src/{app.py,ui/{view,local}.tsx,**/local.tsx}")
    # src/ui/.gitignore has "/local.tsx": only the one directly in src/ui is ignored
    assert result.output.splitlines() == ["src/app.py", "src/ui/deep/local.tsx", "src/ui/view.tsx"]


async def test_search_files_refuses_explosive_brace_patterns(workspace: Path) -> None:
    result = await call(workspace, "search_files", pattern="{a,b}" * 9)
    assert not result.success and "more than 256 alternatives" in result.error


async def test_search_files_no_match_is_success_with_a_hint(project: Path) -> None:
    result = await call(project, "search_files", pattern="*.rs")
    assert result.success and result.metadata["count"] == 0
    assert "No files match '*.rs' under ." in result.output
    assert "'**/*.rs'" in result.output


async def test_search_files_caps_results(workspace: Path) -> None:
    for n in range(1003):
        (workspace / f"m{n:04}.py").touch()
    result = await call(workspace, "search_files", pattern="*.py")
    assert result.metadata == result.metadata | {"count": 1000, "truncated": True}
    assert "stopped at 1000 files" in result.output


async def test_search_files_refuses_escaping_patterns(workspace: Path) -> None:
    for pattern in ["../*", "/etc/*", "src/../../*"]:
        result = await call(workspace, "search_files", pattern=pattern)
        assert not result.success and "pattern" in result.error
    with pytest.raises(InvalidArgument, match="pattern"):
        await call(workspace, "search_files", pattern="")


# the gitignore walker


def test_walk_tree_prunes_with_descend_and_never_enters_ignored_dirs(project: Path) -> None:
    seen = [e.rel for e in walk_tree(project, include_hidden=False, descend=lambda entry: entry.rel != "src")]
    assert seen == ["README.md", "docs", "docs/guide.md", "keep.log", "src"]
    # git cannot re-include a file whose directory is ignored, and neither can the walk
    write(project / ".gitignore", "build/\n!build/out.js\n")
    assert "build/out.js" not in [e.rel for e in walk_tree(project)]


def test_walk_tree_ignores_a_symlinked_gitignore(workspace: Path, outside: Path) -> None:
    write(outside / "rules", "*.py\n")
    (workspace / ".gitignore").symlink_to(outside / "rules")
    write(workspace / "main.py", "pass\n")
    assert [e.rel for e in walk_tree(workspace, include_hidden=False)] == ["main.py"]


async def test_write_file_refuses_content_beyond_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from a3s_agent.tools.files import write

    monkeypatch.setattr(write, "MAX_WRITE_BYTES", 10)
    result = await ToolRegistry(TOOLS).run(
        "write_file", json.dumps({"path": "big.txt", "content": "x" * 11}), ToolContext(workspace=tmp_path)
    )
    assert not result.success and "at most 10 bytes" in result.error
    assert not (tmp_path / "big.txt").exists()


async def test_a_name_the_file_system_refuses_is_a_failed_call(tmp_path: Path) -> None:
    # 200 characters pass the tools' own check, but 400 bytes are more than a file name may have
    result = await ToolRegistry(TOOLS).run(
        "delete_file", json.dumps({"path": "é" * 200}), ToolContext(workspace=tmp_path)
    )
    assert not result.success and "too long" in result.error.lower()


def _difflib_diff(before: str, after: str, name: str) -> str:
    """What edit_file showed before it made its diff from the replacements (difflib over both texts)."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{name}", f"b/{name}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _patched(before: str, diff: str) -> list[str]:
    """The lines of `before` (splitlines, each ending in one added LF when it had none) with the
    hunks of `diff` applied, checking every context and removed line against them."""
    lines = [line if line.endswith("\n") else line + "\n" for line in before.splitlines(keepends=True)]
    out: list[str] = []
    done = 0
    for line in diff.splitlines(keepends=True)[2:]:
        if line.startswith("@@"):
            start = int(line.split()[1].lstrip("-").split(",")[0])
            length = line.split()[1].split(",")
            at = start - 1 if len(length) == 1 or length[1] != "0" else start
            out += lines[done:at]
            done = at
        elif line[0] == "+":
            out.append(line[1:])
        else:
            assert lines[done] == line[1:], (done, line)
            if line[0] == " ":
                out.append(line[1:])
            done += 1
    return out + lines[done:]


_LINES = st.lists(
    st.sampled_from(["a\n", "b\n", "ab\n", "x = 1\n", "\n", "a b a\n"]), min_size=1, max_size=30
)


@settings(max_examples=300, deadline=None)
@given(lines=_LINES, data=st.data())
def test_the_edit_diff_applied_to_the_file_gives_the_edited_file(
    lines: list[str], data: st.DataObject
) -> None:
    before = "".join(lines)
    start = data.draw(st.integers(0, len(before) - 1))
    old = before[start : start + data.draw(st.integers(1, 8))]
    new = data.draw(st.text(alphabet="ab\n x", max_size=8).filter(lambda text: text != old))
    count = before.count(old) if data.draw(st.booleans()) else 1
    after = before.replace(old, new, count)
    diff = replacement_diff(before, old, new, count, "f.txt")
    assert diff.startswith("--- a/f.txt\n+++ b/f.txt\n@@ ")
    wanted = [line if line.endswith("\n") else line + "\n" for line in after.splitlines(keepends=True)]
    assert _patched(before, diff) == wanted


@pytest.mark.parametrize(
    ("before", "old", "new"),
    [
        ("def f():\n    return 1\n", "return 1", "return 2"),  # one line
        ("a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n", "b", "B"),  # context cut at the start
        ("a\r\nb\r\nc\r\n", "b\r\n", "B"),  # the replacement joins a line to the next
        ("a\rb\rc\r", "b", "\nb"),  # a leading LF after a CR line end
        ("one\ntwo\nthree", "three", "3"),  # the last line without a line end
        ("ab\nab\nab\nzz\n", "b\na", "-"),  # occurrences that meet on a line
        ("k1\nk2\nk3\nk4\nk5\n", "2\nk3", "X\nY\nZ"),  # lines split and joined
    ],
)
def test_the_edit_diff_is_the_diff_difflib_makes(before: str, old: str, new: str) -> None:
    for count in {1, before.count(old)}:
        after = before.replace(old, new, count)
        assert replacement_diff(before, old, new, count, "f") == _difflib_diff(before, after, "f")
