"""A fake model server in a process of its own (its CPU counts for neither the server under test
nor the client), for the tests that need that and the benchmarks."""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path
from typing import Self

READY_WITHIN_S = 30.0


class FakeServerProcess:
    """`python -m MODULE ARGS` on 127.0.0.1, started at construction and ready once it has printed
    its `<NAME>_READY <base url>` line (as the fakes of this package do), terminated on exit."""

    def __init__(self, module: str, *args: str, cwd: Path | None = None) -> None:
        argv = [sys.executable, "-m", module, *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=cwd)
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], READY_WITHIN_S)
        line = self.proc.stdout.readline() if readable else ""
        words = line.split()
        if len(words) != 2 or not words[0].endswith("_READY"):
            self.close()
            raise RuntimeError(f"{module} did not start within {READY_WITHIN_S:g} s: {line!r}")
        self.base_url = words[1]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
