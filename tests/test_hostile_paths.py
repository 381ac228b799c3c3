"""Generated hostile paths against every path-taking tool, through the real server:
nothing outside the workspace is ever read, written or deleted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc

from .conftest import ServerProcess

SECRET = "TOP-SECRET-OUTSIDE-CONTENT"
MARK = "WRITTEN-BY-HOSTILE-CALL"

# Each path-taking tool, with arguments that would read, write or delete at `p` if allowed.
TOOL_CALLS: dict[str, Callable[[str], dict[str, object]]] = {
    "read_file": lambda p: {"path": p},
    "write_file": lambda p: {"path": p, "content": MARK},
    "edit_file": lambda p: {"path": p, "old_string": SECRET, "new_string": MARK},
    "delete_file": lambda p: {"path": p},
    "list_files": lambda p: {"path": p, "recursive": True},
    "search_files": lambda p: {"pattern": "**/*", "path": p},
    "grep": lambda p: {"pattern": "SECRET", "path": p},
    "find_definition": lambda p: {"symbol": "secret", "path": p},
    "find_references": lambda p: {"symbol": "secret", "path": p},
    "format_code": lambda p: {"path": p},
    "lint_code": lambda p: {"path": p, "fix": True},
    "bash": lambda p: {"command": f"echo {MARK} > marker.txt", "cwd": p},
    "run_script": lambda p: {"language": "bash", "path": p},
    "git_status": lambda p: {"path": p},
    "git_diff": lambda p: {"path": p},
    "git_commit": lambda p: {"message": "x", "paths": [p]},
    "git_log": lambda p: {"path": p},
}

_components = st.sampled_from(
    ["..", ".", "outside", "secret.py", "link-out", "link-file", "sub", "", "\x00", "x" * 300, "~", "%2e%2e"]
)


def _hostile_paths(outside: Path) -> st.SearchStrategy[str]:
    relative = st.lists(_components, min_size=1, max_size=6).map("/".join)
    absolute = st.sampled_from(
        [str(outside), str(outside / "secret.py"), "/etc/passwd", "/", str(outside.parent)]
    )
    return st.one_of(relative, absolute, relative.map(lambda r: f"{outside}/{r}"))


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_no_tool_reaches_outside_the_workspace(server_process: ServerProcess, tmp_path: Path) -> None:
    workspace = server_process.workspace
    outside = tmp_path / "outside"
    (outside / "nested").mkdir(parents=True)
    (outside / "secret.py").write_text(f"secret = '{SECRET}'\nimport os\n")
    (outside / "nested" / "run.sh").write_text(f"echo {MARK} > /dev/null\n")
    subprocess.run(["git", "init", "-q", str(outside)], check=True)
    (workspace / "sub").mkdir()
    (workspace / "sub" / "ok.txt").write_text("inside\n")
    os.symlink(outside, workspace / "link-out")
    os.symlink(outside / "secret.py", workspace / "link-file")
    before = _snapshot(outside)
    server_process.start()
    channel = server_process.channel()
    stub = pb_grpc.CodeAgentServiceStub(channel)

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(tool=st.sampled_from(sorted(TOOL_CALLS)), path=_hostile_paths(outside))
    def probe(tool: str, path: str) -> None:
        arguments = json.dumps(TOOL_CALLS[tool](path))
        try:
            result = stub.ExecuteTool(
                pb.ExecuteToolRequest(tool_name=tool, arguments=arguments), timeout=30
            ).result
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (tool, path, err.details())
            return
        assert SECRET not in result.output + result.error, (tool, path)
        assert _snapshot(outside) == before, (tool, path)
        assert not (outside / "marker.txt").exists()

    try:
        probe()
        # The obvious escapes are refused with a message that says why. (delete_file may have
        # removed the links themselves, and write_file put a file in their place: both allowed,
        # they live in the workspace.)
        for link, target in (("link-out", outside), ("link-file", outside / "secret.py")):
            place = workspace / link
            if not place.is_symlink():
                if place.is_dir():
                    shutil.rmtree(place)
                elif place.exists():
                    place.unlink()
                os.symlink(target, place)
        for raw in ("../outside/secret.py", str(outside / "secret.py"), "link-file", "link-out/secret.py"):
            result = stub.ExecuteTool(
                pb.ExecuteToolRequest(tool_name="read_file", arguments=json.dumps({"path": raw}))
            )
            assert not result.result.success
            assert "outside the workspace" in result.result.error
    finally:
        channel.close()
