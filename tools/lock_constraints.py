#!/usr/bin/env python3
"""Write constraints.txt: the exact versions of a3s-agent's runtime dependencies, resolved in a
fresh virtual environment, so the container image (and anyone else) installs the same set.

Usage: python tools/lock_constraints.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        venv.create(tmp, with_pip=True)
        python = Path(tmp) / "bin" / "python"
        subprocess.run([python, "-m", "pip", "install", "-q", str(ROOT)], check=True)
        frozen = subprocess.run(
            [python, "-m", "pip", "freeze", "--exclude", "a3s-agent"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    header = "# Runtime dependencies of a3s-agent, pinned. Regenerate: python tools/lock_constraints.py\n"
    (ROOT / "constraints.txt").write_text(header + frozen)
    print(f"wrote {len(frozen.splitlines())} pins to constraints.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
