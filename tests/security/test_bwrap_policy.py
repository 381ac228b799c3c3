"""The policy as bubblewrap renders it, tried with real processes: what a command may read, write
and reach is the kernel's decision, whatever path it takes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from a3s_agent.tools.sandbox import bwrap
from a3s_agent.tools.sandbox.policy import SandboxPolicy, for_call, server_grounds

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(bwrap.problem() is not None, reason=f"bwrap does not work here: {bwrap.problem()}"),
]


def _run(policy: SandboxPolicy, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    launch = bwrap.command(["sh", "-c", script], policy, None)
    try:
        return subprocess.run(
            launch.argv,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            pass_fds=launch.pass_fds,
        )
    finally:
        launch.close()


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A workspace holding the server's data dir (with a session HOME in it) and another session's
    workspace; a directory outside everything; real paths."""
    root = Path(os.path.realpath(tmp_path))
    paths = {
        "workspace": root / "ws",
        "data": root / "ws" / ".data",
        "home": root / "ws" / ".data" / "homes" / "s1",
        "scratch": root / "ws" / ".data" / "scratch" / "1",
        "other": root / "ws" / "other",
        "outside": root / "outside",
    }
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    (paths["data"] / "sessions.db").write_text("stored secret")
    (paths["other"] / "notes").write_text("other secret")
    (paths["outside"] / "file").write_text("outside secret")
    return paths


def _policy(layout: dict[str, Path]) -> SandboxPolicy:
    ground = server_grounds(data_dir=layout["data"])
    return for_call(
        ground,
        workspace=str(layout["workspace"]),
        home=str(layout["home"]),
        scratch=str(layout["scratch"]),
        others=[str(layout["other"])],
    )


def test_hidden_paths_inside_the_workspace_stay_unreadable_and_the_home_inside_them_works(
    layout: dict[str, Path],
) -> None:
    done = _run(
        _policy(layout),
        f"cat .data/sessions.db; cat other/notes; cat {layout['outside']}/file;"
        f" echo cached > {layout['home']}/cache && cat {layout['home']}/cache",
        layout["workspace"],
    )
    assert "secret" not in done.stdout
    assert done.stdout.strip().endswith("cached")
    assert (layout["home"] / "cache").read_text() == "cached\n"


def test_writes_outside_fail_directly_and_through_links_made_inside(layout: dict[str, Path]) -> None:
    outside = layout["outside"]
    script = (
        f"echo x > {outside}/direct; ln -s {outside} link; echo x > link/through-symlink;"
        f" ln {outside}/file hard 2>&1; echo x >> hard; mkdir /new; echo x > /etc/new"
    )
    done = _run(_policy(layout), script, layout["workspace"])
    assert sorted(p.name for p in outside.iterdir()) == ["file"]
    assert (outside / "file").read_text() == "outside secret"
    assert "Read-only file system" in done.stderr


def test_the_network_is_off_and_the_server_is_not_in_sight(layout: dict[str, Path]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        script = (
            f"{sys.executable} -I -S -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5)\";"
            f" echo exit=$?; cat /proc/{os.getpid()}/cmdline; echo; kill -9 $PPID; echo alive"
        )
        done = _run(_policy(layout), script, layout["workspace"])
    assert "ConnectionRefusedError" in done.stderr and "exit=1" in done.stdout
    assert "pytest" not in done.stdout and done.stdout.strip().endswith("alive")
