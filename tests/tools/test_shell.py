"""bash and run_script: real subprocesses in a real workspace, including killing what they start."""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from a3s_agent.base.errors import InvalidArgument
from a3s_agent.tools.environment import tool_environment
from a3s_agent.tools.process import TIMEOUT_EXIT_CODE, find_binary, run_process
from a3s_agent.tools.registry import ToolContext, ToolOutput, ToolRegistry
from a3s_agent.tools.sandbox import Place
from a3s_agent.tools.shell import TOOLS

from ..conftest import running_with, unique_sleep
from ..fault.conftest import zombie_children


async def call(workspace: Path, name: str, ctx: ToolContext | None = None, **arguments: Any) -> ToolOutput:
    context = ctx or ToolContext(workspace=workspace)
    return await ToolRegistry(TOOLS).run(name, json.dumps(arguments), context)


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def _exists(path: str) -> bool:
    return Path(path).exists()


def _real(path: Path) -> str:
    return str(path.resolve())


def _wait_until_none(command: str, within_s: float = 2.0) -> list[int]:
    """The processes running `command` still there after `within_s` (none, if they were killed)."""
    deadline = time.monotonic() + within_s
    while (found := running_with(command)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


# --- bash ----------------------------------------------------------------------------------


async def test_bash_runs_command_in_workspace(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("one\ntwo\n")
    result = await call(tmp_path, "bash", command="wc -l < notes.txt && pwd")
    assert result.success, result.error
    assert result.output == f"2\n{_real(tmp_path)}\n"
    assert result.metadata["exit_code"] == 0 and result.metadata["timed_out"] is False
    assert result.metadata["duration_ms"] > 0


async def test_bash_nonzero_exit_fails_but_keeps_output(tmp_path: Path) -> None:
    result = await call(tmp_path, "bash", command="echo building; echo 'boom' >&2; exit 3")
    assert not result.success
    assert result.error == "exited with code 3" and result.metadata["exit_code"] == 3
    assert "building\n" in result.output and "boom\n" in result.output


async def test_bash_interleaves_stdout_and_stderr_in_order(tmp_path: Path) -> None:
    result = await call(tmp_path, "bash", command="echo 1; sleep 0.05; echo 2 >&2; sleep 0.05; echo 3")
    assert result.output == "1\n2\n3\n"


async def test_bash_cwd_is_resolved_in_workspace(tmp_path: Path) -> None:
    (tmp_path / "sub" / "dir").mkdir(parents=True)
    result = await call(tmp_path, "bash", command="pwd", cwd="sub/dir")
    assert result.output.strip() == _real(tmp_path / "sub" / "dir")
    (tmp_path / "file.txt").write_text("x")
    not_dir = await call(tmp_path, "bash", command="pwd", cwd="file.txt")
    assert not not_dir.success and "not a directory" in not_dir.error


async def test_bash_cwd_cannot_escape_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for cwd in ("..", "/", "../ws/../.."):
        result = await call(workspace, "bash", command="pwd", cwd=cwd)
        assert not result.success and "outside the workspace" in result.error


async def test_bash_sees_context_env(tmp_path: Path) -> None:
    ctx = ToolContext(workspace=tmp_path, env={"A3S_GREETING": "hello from ctx"})
    result = await call(tmp_path, "bash", ctx, command='echo "$A3S_GREETING"')
    assert result.output == "hello from ctx\n"


async def test_bash_sees_the_server_environment_as_it_is_at_each_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    show = "echo tz=${TZ-unset} lc=${LC_A3S_TEST-unset} secret=${A3S_TEST_TOKEN-unset}"
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("A3S_TEST_TOKEN", "s3cret")  # not allow-listed: never passed on
    monkeypatch.delenv("LC_A3S_TEST", raising=False)
    assert (await call(tmp_path, "bash", command=show)).output == "tz=UTC lc=unset secret=unset\n"
    monkeypatch.setenv("TZ", "Europe/Paris")  # same length, same names: only the value changed
    monkeypatch.setenv("LC_A3S_TEST", "1")
    assert (await call(tmp_path, "bash", command=show)).output == "tz=Europe/Paris lc=1 secret=unset\n"
    monkeypatch.delenv("TZ")
    monkeypatch.delenv("LC_A3S_TEST")
    assert (await call(tmp_path, "bash", command=show)).output == "tz=unset lc=unset secret=unset\n"


def test_the_tool_environment_handed_out_is_the_callers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    first = tool_environment()
    first["TZ"] = "changed"
    first["A3S_TEST_TOKEN"] = "s3cret"
    with_extra = tool_environment({"EXTRA": "1"})
    assert with_extra["TZ"] == "UTC" and "A3S_TEST_TOKEN" not in with_extra and with_extra["EXTRA"] == "1"
    assert "EXTRA" not in tool_environment() and tool_environment()["TZ"] == "UTC"
    monkeypatch.setattr(os, "environ", {"TZ": "Asia/Tokyo", "A3S_TEST_TOKEN": "s3cret"})  # a plain dict
    assert tool_environment() == {"TZ": "Asia/Tokyo", "PATH": os.defpath}


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_bash_timeout_kills_command_and_children(
    tmp_path: Path, sandboxed: bool, request: pytest.FixtureRequest
) -> None:
    if not sandboxed:  # without the sandbox's PID namespace, the kill of the process group does it
        request.getfixturevalue("unsandboxed")
    sleep = unique_sleep()
    started = time.monotonic()
    result = await call(tmp_path, "bash", command=f"{sleep} & {sleep}", timeout_ms=300)
    assert time.monotonic() - started < 5
    assert not result.success
    assert result.metadata["exit_code"] == 124 and result.metadata["timed_out"] is True
    assert "timed out after 300 ms" in result.error
    assert _wait_until_none(sleep) == []


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_bash_background_process_does_not_outlive_call(
    tmp_path: Path, sandboxed: bool, request: pytest.FixtureRequest
) -> None:
    if not sandboxed:
        request.getfixturevalue("unsandboxed")
    sleep = unique_sleep()
    started = time.monotonic()
    result = await call(tmp_path, "bash", command=f"{sleep} >/dev/null 2>&1 & echo started")
    assert result.success and time.monotonic() - started < 5
    assert _wait_until_none(sleep) == []


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
async def test_bash_process_that_leaves_its_session_does_not_outlive_call(
    tmp_path: Path, sandboxed: bool, request: pytest.FixtureRequest
) -> None:
    # Outside a server (no cgroup, no subreaper): the call's environment marker still finds it.
    if not sandboxed:
        request.getfixturevalue("unsandboxed")
    sleep = unique_sleep()
    command = f"setsid -f sh -c 'touch started; exec {sleep}'; until [ -e started ]; do :; done"
    result = await call(tmp_path, "bash", command=command)
    assert result.success
    assert _wait_until_none(sleep) == []


async def test_bash_caps_huge_output_with_hint(tmp_path: Path) -> None:
    ctx = ToolContext(workspace=tmp_path, max_output_bytes=2000)
    result = await call(
        tmp_path, "bash", ctx, command="head -c 50000 /dev/zero | tr '\\0' x; echo; echo the-last-line"
    )
    assert result.success and result.metadata["truncated"] is True
    assert len(result.output.encode()) <= 2000
    assert result.output.startswith("x" * 800)
    assert "bytes of output omitted" in result.output
    assert "the-last-line" in result.output  # the end of a long log, where errors usually are
    assert "output truncated" in result.output and "read_file" in result.output


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"command": ""},
        {"command": "ls", "timeout_ms": 0},
        {"command": "ls", "timeout_ms": 600_001},
        {"command": "ls", "shell": "zsh"},
    ],
)
async def test_bash_rejects_invalid_arguments(tmp_path: Path, arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await call(tmp_path, "bash", **arguments)


# --- run_script ----------------------------------------------------------------------------


async def test_run_script_python_code_with_args(tmp_path: Path) -> None:
    code = "import os, sys\nprint(sys.argv[1:])\nprint(os.getcwd())\nprint(__file__)\n"
    result = await call(tmp_path, "run_script", code=code, args=["a b", "--flag"])
    assert result.success, result.error
    argv_line, cwd_line, script_line = result.output.splitlines()
    assert argv_line == "['a b', '--flag']"
    assert cwd_line == _real(tmp_path)
    assert not script_line.startswith(_real(tmp_path)) and not _exists(script_line)
    assert _entries(tmp_path) == []
    assert result.metadata["language"] == "python" and result.metadata["exit_code"] == 0


async def test_run_script_workspace_file_with_args(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "greet.sh").write_text('echo "hi $1 from $(basename "$PWD")"\n')
    result = await call(tmp_path, "run_script", language="bash", path="scripts/greet.sh", args=["bob"])
    assert result.success, result.error
    assert result.output == f"hi bob from {tmp_path.name}\n"


async def test_run_script_sh_failure_keeps_output(tmp_path: Path) -> None:
    result = await call(tmp_path, "run_script", language="sh", code="echo partial\nexit 7\n")
    assert not result.success and result.error == "exited with code 7"
    assert result.output == "partial\n" and result.metadata["exit_code"] == 7


async def test_run_script_python_exception_shows_traceback(tmp_path: Path) -> None:
    result = await call(tmp_path, "run_script", code="1 / 0\n")
    assert not result.success and result.metadata["exit_code"] == 1
    assert "ZeroDivisionError" in result.output


@pytest.mark.skipif(find_binary("node") is None, reason="node is not installed")
async def test_run_script_node(tmp_path: Path) -> None:
    result = await call(
        tmp_path,
        "run_script",
        language="node",
        code="console.log(process.argv.slice(2).join('+'))",
        args=["1", "2"],
    )
    assert result.success and result.output == "1+2\n"


async def test_run_script_missing_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    if find_binary("node"):
        pytest.skip("node is installed next to the interpreter")
    result = await call(tmp_path, "run_script", language="node", code="console.log(1)")
    assert not result.success and "node is not installed" in result.error


async def test_run_script_timeout(tmp_path: Path) -> None:
    result = await call(tmp_path, "run_script", code="import time\ntime.sleep(30)\n", timeout_ms=300)
    assert not result.success and result.metadata["exit_code"] == 124
    assert "timed out after 300 ms" in result.error


async def test_run_script_path_must_be_workspace_file(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "dir").mkdir(parents=True)
    (tmp_path / "evil.py").write_text("print('escaped')\n")
    escape = await call(workspace, "run_script", path="../evil.py")
    assert not escape.success and "outside the workspace" in escape.error
    directory = await call(workspace, "run_script", path="dir")
    assert not directory.success and "not a file" in directory.error


@pytest.mark.parametrize(
    "arguments",
    [{}, {"code": "print(1)", "path": "x.py"}, {"code": "print(1)", "language": "ruby"}],
)
async def test_run_script_rejects_invalid_arguments(tmp_path: Path, arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await call(tmp_path, "run_script", **arguments)


# --- the process runner ----------------------------------------------------------------------


async def test_run_process_feeds_stdin_larger_than_a_pipe_and_survives_a_process_not_reading_it(
    tmp_path: Path,
) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: sixteen times what a pipe holds
    counted = await run_process(["wc", "-c"], cwd=tmp_path, place=Place(tmp_path), stdin=data)
    assert counted.exit_code == 0 and counted.stdout.strip() == str(len(data))
    ignored = await run_process(
        ["sh", "-c", "exec 0<&-; echo done"], cwd=tmp_path, place=Place(tmp_path), stdin=data, timeout_s=10
    )
    assert ignored.exit_code == 0 and ignored.stdout == "done\n" and not ignored.timed_out


async def test_run_process_without_pidfds_waits_for_the_exit_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open refused")  # as a seccomp filter or Linux < 5.3 would

    monkeypatch.setattr(os, "pidfd_open", refused)
    result = await run_process(
        ["sh", "-c", "echo out; echo err >&2; exit 3"], cwd=tmp_path, place=Place(tmp_path)
    )
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    timed_out = await run_process(["sleep", "30"], cwd=tmp_path, place=Place(tmp_path), timeout_s=0.2)
    assert timed_out.timed_out and timed_out.exit_code == 124


async def test_run_process_leaves_no_descriptor_or_zombie_behind(tmp_path: Path) -> None:
    descriptors = set(os.listdir("/proc/self/fd"))
    earlier = zombie_children(os.getpid())  # left by other tests of this process, whatever they ran
    for argv, timeout_s in [
        (["sh", "-c", "echo ok"], 10.0),
        (["sh", "-c", "kill -9 $$"], 10.0),
        (["sh", "-c", "sleep 30 & echo started"], 10.0),  # a background child holding the pipes
        (["sleep", "30"], 0.2),  # timed out
    ]:
        result = await run_process(argv, cwd=tmp_path, place=Place(tmp_path), timeout_s=timeout_s)
        # killed by a signal: a negative exit code, or bwrap's 128 + the signal's number
        assert result.exit_code in (0, -signal.SIGKILL, 128 + signal.SIGKILL, TIMEOUT_EXIT_CODE), result
    assert set(os.listdir("/proc/self/fd")) <= descriptors
    assert zombie_children(os.getpid()) - earlier == set()
