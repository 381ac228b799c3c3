"""Helpers for the fault and load suite: logged server subprocesses, the fake LLM as a subprocess,
and /proc readings. Every test here is marked `fault` (run them alone with `pytest -m fault`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from a3s_agent.testing.fake_process import FakeServerProcess

from ..conftest import ServerProcess, wait_serving

DEAD_LLM_URL = "http://127.0.0.1:9/v1"
"""An LLM endpoint nothing listens on: any request to it is refused at once, on this machine."""


def env_number(name: str, default: float) -> float:
    """A positive number from the environment (to run the suite longer than CI does), else `default`."""
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


class LoggedServer(ServerProcess):
    """`a3s-agent serve` whose output goes to a log file (a pipe nobody reads would block it)."""

    def __init__(
        self,
        workspace: Path,
        data_dir: Path,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(workspace, data_dir, env)
        self.log_path = log_path
        self.extra_args = extra_args

    def command(self) -> list[str]:
        return [*super().command(), *self.extra_args]

    def start(self, timeout_s: float = 30.0) -> LoggedServer:
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True
            )
        try:
            wait_serving(self.address, timeout_s, self.proc)
        except AssertionError as exc:
            self.kill()
            raise AssertionError(f"{exc}\n--- server log ---\n{self.log()[-4000:]}") from None
        return self

    def kill(self) -> None:
        """SIGKILL, and reap the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class FakeLLMProcess(FakeServerProcess):
    """The fake LLM (a3s_agent/testing/fake_llm.py) as a subprocess on 127.0.0.1 (its own CPU, like a
    real provider)."""

    def __init__(self, *args: str) -> None:
        super().__init__("a3s_agent.testing.fake_llm", "--host", "127.0.0.1", "--port", "0", *args)


def rss_kb(pid: int) -> int:
    """Resident set size of a process, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def child_pids(pid: int) -> set[int]:
    """Direct children of a process, over all its threads."""
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children.update(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return children


def zombie_children(pid: int) -> set[int]:
    """Children of a process that exited and were not reaped."""
    zombies = set()
    for child in child_pids(pid):
        try:
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                zombies.add(child)
        except OSError:
            continue
    return zombies
