"""A concurrent symlink swapper against the file tools, through the real gRPC server: the path a tool
was given flips between a file or directory inside the workspace and a symlink to a secret outside,
as fast as another process can flip it, while thousands of calls go through. Nothing outside is ever
read, written, created or listed."""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.tools import beneath

from ..conftest import LiveServer

pytestmark = pytest.mark.security

SECRET = "OUTSIDE-SECRET-7f3a"
MARK = "WRITTEN-THROUGH-THE-TOOL"
BATCHES = 100  # of 50 calls (the server's per-request limit): 2,000 reads and 2,000 writes

# Flips, until killed or after 60 s: `f` by renaming a fresh symlink and then a fresh file over it (so a
# write that replaced `f` does not end the attack), and the directory `d` by exchanging it with the
# symlink `d.swap` (renameat2 RENAME_EXCHANGE: a symlink cannot be renamed over a directory).
SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[1])
secret = sys.argv[2]
os.symlink("../outside/dir", "d.swap")
print("ready", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    for _ in range(200):
        os.symlink(secret, "f.link")
        os.rename("f.link", "f")
        fd = os.open("f.file", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"inside f\n")
        os.close(fd)
        os.rename("f.file", "f")
        if libc.renameat2(-100, b"d", -100, b"d.swap", 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
"""


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root`: file contents, symlink targets, directories."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(path)] = path.read_bytes()
        else:
            found[str(path)] = "dir"
    return found


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Next to the workspace: a secret file, and a directory shaped like the workspace's `d`."""
    path = tmp_path / "outside"
    (path / "dir").mkdir(parents=True)
    (path / "secret.txt").write_text(f"{SECRET}\n")
    (path / "dir" / "f").write_text(f"{SECRET} in dir\n")
    (path / "dir" / "only-outside.txt").write_text(f"{SECRET}\n")
    return path


@pytest.fixture
def swapper(workspace: Path, outside: Path) -> Iterator[subprocess.Popen[str]]:
    (workspace / "f").write_text("inside f\n")
    (workspace / "d").mkdir()
    (workspace / "d" / "f").write_text("inside d/f\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(workspace), str(outside / "secret.txt")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _batch(index: int) -> list[pb.ToolCall]:
    """50 calls on the flipping names: 20 reads, 20 writes (4 of them new files), edits, listings."""

    def call(name: str, **arguments: object) -> pb.ToolCall:
        return pb.ToolCall(name=name, arguments=json.dumps(arguments))

    calls = []
    for _ in range(10):
        calls += [call("read_file", path="f"), call("read_file", path="d/f")]
        calls += [call("write_file", path="f", content=MARK), call("write_file", path="d/f", content=MARK)]
    calls[3] = call("write_file", path=f"d/new-{index}.txt", content=MARK)
    calls[7] = call("write_file", path=f"d/sub{index}/new.txt", content=MARK)
    calls[9] = call("read_file", path="d/f", encoding="base64")
    calls[12] = call("read_file", path="f", encoding="base64")
    calls += [call("edit_file", path=path, old_string=SECRET, new_string=MARK) for path in ("f", "d/f")] * 2
    calls += [
        call("list_files", path="d", recursive=True),
        call("search_files", pattern="**/*", path="d"),
        call("list_files", path=".", recursive=True, include_hidden=True),
        call("search_files", pattern="d/*"),
        call("delete_file", path="d/only-outside.txt"),
        call("delete_file", path="d/f"),
    ]
    return calls


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "portable-walk"])
async def test_a_symlink_swapped_in_mid_call_never_leads_out(
    live: LiveServer,
    outside: Path,
    swapper: subprocess.Popen[str],
    openat2: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if openat2 and not beneath.openat2_enabled:
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(beneath, "openat2_enabled", openat2)
    before = _snapshot(outside)
    outcomes = {"read inside": 0, "refused as outside": 0}
    for index in range(BATCHES):
        reply = await live.stub.ExecuteToolBatch(pb.ExecuteToolBatchRequest(tool_calls=_batch(index)))
        for result in reply.results:
            text = result.output + result.error
            assert SECRET not in text and "only-outside" not in result.output, text
            assert SECRET.encode() not in _decoded(result)
            outcomes["read inside"] += "inside" in result.output
            outcomes["refused as outside"] += "outside the workspace" in result.error
    assert swapper.poll() is None, "the swapper stopped before the calls ended"
    assert _snapshot(outside) == before
    # The swap really raced the calls: some calls met the inside file, others the link out.
    assert outcomes["read inside"] > 0 and outcomes["refused as outside"] > 0, outcomes


def _decoded(result: pb.ToolResult) -> bytes:
    """The bytes of a base64 read (anything else as it is)."""
    try:
        return base64.b64decode(result.output, validate=True)
    except (binascii.Error, ValueError):
        return result.output.encode()
