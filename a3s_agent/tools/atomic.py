"""Writing a file so that readers never see half of it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_atomically(target: Path, data: bytes, mode: int | None = None) -> None:
    """Write through a temporary file in the same directory and rename it over `target`.

    `mode` (e.g. the replaced file's permission bits) is kept; without it a new file gets the
    umask's default. Missing parent directories are created.
    """
    temp = target.with_name(f".{target.name[:200]}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(temp, flags, 0o666 if mode is None else mode)
    except FileNotFoundError:  # a missing parent: create it only then (one syscall less per write)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temp, flags, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
