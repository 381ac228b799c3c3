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
    """The environment for a tool process (a new dict each time): the allow-listed part of `base`
    (default: the server's environment), then `extra` (the host's own additions, taken as given)."""
    allowed = _allowed_part(base) if base is not None else _server_allowed()
    return {**allowed, **extra} if extra else dict(allowed)


def _allowed_part(source: Mapping[str, str]) -> dict[str, str]:
    env = {name: value for name, value in source.items() if is_allowed_name(name)}
    env.setdefault("PATH", os.defpath)
    return env


_server_cache: tuple[dict[object, object], dict[str, str]] | None = None
"""A copy of os.environ's raw data, and its allowed part (never handed out itself)."""


def _server_allowed() -> dict[str, str]:
    """The allowed part of os.environ, computed again only when its content changed: comparing its
    raw dict with the copy taken then is C-level and short-circuits on identical values (~1 µs),
    where decoding every variable cost 20-50 µs a call. Any change through os.environ shows."""
    global _server_cache
    environ = os.environ
    data = getattr(environ, "_data", None)
    if not isinstance(data, dict):  # os.environ replaced by a plain mapping
        return _allowed_part(environ)
    cached = _server_cache
    if cached is not None and cached[0] == data:
        return cached[1]
    snapshot = data.copy()  # one atomic copy: what is cached is what is compared later
    allowed = _allowed_part({environ.decodekey(k): environ.decodevalue(v) for k, v in snapshot.items()})
    _server_cache = (snapshot, allowed)
    return allowed
