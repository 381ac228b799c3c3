"""The environment every process a tool starts gets: an allow-list, never the server's secrets.

A tool process (bash, run_script, format/lint, git, rg, skill scripts and binaries, Agent
Spaces shell) sees only PATH, HOME, LANG/LC_*, TERM, TZ, TMPDIR, USER, SHELL from the server's
own environment, plus what the host gave on purpose: Initialize's `env`, a skill's declared
variables, a coven Welcome's secrets. A name that looks like one of the server's secrets is
dropped even from those extras unless the host put it there itself (the `extra` mapping).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ALLOWED_NAMES = frozenset({"PATH", "HOME", "LANG", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL"})
_ALLOWED_PREFIXES = ("LC_",)


def is_allowed_name(name: str) -> bool:
    return name in ALLOWED_NAMES or name.startswith(_ALLOWED_PREFIXES)


def tool_environment(
    extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a tool process: the allow-listed part of `base` (default: the server's
    environment), then `extra` (the host's own additions, taken as given)."""
    source = os.environ if base is None else base
    env = {name: value for name, value in source.items() if is_allowed_name(name)}
    env.setdefault("PATH", os.defpath)
    env.update(extra or {})
    return env
