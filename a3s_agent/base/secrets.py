"""The server's own secrets, read once at start and then kept only in this process's memory.

`withhold_secrets` takes every variable named like a secret (`is_secret_name`: A3S_AUTH_TOKEN,
*_API_KEY, A3S_LLM_*, A3S_STORE (its URL may hold the database password), PGPASSWORD, *_TOKEN,
*_SECRET, *_PASSWORD and the names in A3S_SECRET_ENV) out of
os.environ, so no process the server starts inherits them, and blanks them in the environment
block the process was started with, which is what /proc/<pid>/environ shows (unsetenv does not
change it). Then it makes the process non-dumpable, so processes of the same user can no longer
read its /proc/<pid>/environ or /proc/<pid>/mem; root (CAP_SYS_PTRACE) still can.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4  # <linux/prctl.h>
_ENV_START_FIELD = 50  # /proc/<pid>/stat field numbers, proc(5); env_end follows
_withheld: dict[str, str] = {}
_SECRET_PATTERN = re.compile(
    r"(^A3S_AUTH_TOKEN(_FILE)?$|^A3S_LLM_|^A3S_STORE$|^PGPASSWORD$|(^|_)(API_KEY|SECRET|TOKEN|PASSWORD)$)"
)
SECRET_NAMES_VARIABLE = "A3S_SECRET_ENV"
"""A comma-separated list of further variable names the operator marks secret."""


def operator_secret_names(env: Mapping[str, str]) -> frozenset[str]:
    return frozenset(name.strip() for name in env.get(SECRET_NAMES_VARIABLE, "").split(",") if name.strip())


def is_secret_name(name: str, marked: Iterable[str] = ()) -> bool:
    """Whether `name` is one of the server's own secrets (token, API keys, LLM settings, marked ones)."""
    return bool(_SECRET_PATTERN.search(name.upper())) or name in set(marked)


def withhold_secrets(marked: Iterable[str] = ()) -> list[str]:
    """Take the server's secrets out of its environment; the names withheld, sorted."""
    marked = frozenset(marked)
    names = sorted(name for name in os.environ if is_secret_name(name, marked))
    for name in names:
        _withheld[name] = os.environ.pop(name)  # pop also unsetenv()s it
    if sys.platform.startswith("linux"):
        _blank_start_environment(marked)
        _not_dumpable()
    return names


def withheld(name: str) -> str:
    """A withheld variable's value ('' if it was not set), for the server's own use (an API it calls)."""
    return _withheld.get(name, "")


def withheld_values(shortest: int = 8) -> list[str]:
    """The values withheld (those of at least `shortest` characters: shorter ones would be found
    in any text), so that what leaves the server can be checked for them."""
    return [value for value in _withheld.values() if len(value) >= shortest]


def _blank_start_environment(marked: frozenset[str]) -> None:
    """Overwrite the secret NAME=value entries of the start environment block with NUL bytes.

    Nothing points at those entries any more: os.environ holds copies, and unsetenv took them
    out of libc's `environ`. The block is only written once it reads back exactly as
    /proc/self/environ shows it, so a wrong address can never be written to."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = (int(fields[n - 3]) for n in (_ENV_START_FIELD, _ENV_START_FIELD + 1))
        shown = Path("/proc/self/environ").read_bytes()
    except (OSError, IndexError, ValueError) as exc:
        log.warning("secrets stay visible in /proc/%d/environ: cannot locate it (%s)", os.getpid(), exc)
        return
    if not shown or end - start != len(shown) or ctypes.string_at(start, len(shown)) != shown:
        log.warning("secrets stay visible in /proc/%d/environ: it is not where /proc says", os.getpid())
        return
    offset = 0
    for entry in shown.split(b"\0"):
        name = entry.split(b"=", 1)[0].decode(errors="replace")
        if entry and is_secret_name(name, marked):
            ctypes.memset(start + offset, 0, len(entry))
        offset += len(entry) + 1


def _not_dumpable() -> None:
    """No core dumps, and no same-user reads of /proc/<pid>/environ, mem or ptrace attach."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))
