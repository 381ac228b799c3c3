"""What a sandboxed command may touch: one policy, which both mechanisms render (bwrap.py, landlock.py).

Files: the system read-only (SYSTEM_TREES, the interpreter's prefixes, the server's PATH, the
operator's --sandbox-read), the call's workspace, scratch TMPDIR and session HOME read-write (and
the operator's --sandbox-write); nothing else exists for it. Inside those trees some paths are
hidden: the server's data dir (but for the HOME inside it), its token and TLS key files, the
credential places of the user running it, the system's own secrets, other sessions' workspaces
and the operator's --sandbox-deny. A hidden path outside every tree needs no rule: nothing there
is visible anyway, so only those inside a tree are kept (fewer rules, a faster spawn).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

Network = Literal["off", "on", "proxy"]

SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
"""Read-only for every command: programs, libraries, configuration. Symlinks among them (/bin ->
usr/bin) are kept as links by the mechanisms that build a root of their own."""
SYSTEM_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/krb5.keytab",
)
SSH_HOST_KEYS = "/etc/ssh"  # its ssh_host_*_key files (the public halves stay readable)
CREDENTIAL_PLACES = (
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".kube",
    ".docker",
    ".gnupg",
    ".password-store",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".local/share/keyrings",
    ".local/share/a3s-agent",  # every data dir of this user's servers
)
"""Below the home directory of the user running the server: unreadable for commands, should that
home lie inside a tree they may read (a workspace that is the home directory, --sandbox-read ~)."""
TOOLCHAIN_HOMES = (("RUSTUP_HOME", ".rustup"),)
"""Where a toolchain manager keeps what the programs it put on PATH run (rustup's cargo and rustc in
~/.cargo/bin run the toolchains in ~/.rustup), found by a variable that defaults to a place in
$HOME, which a command's HOME (its session's) replaces: readable, and the variable set for
commands, where the server's user has one."""


@dataclass(frozen=True)
class SandboxPolicy:
    """What one command may do; every path absolute and symlink-resolved."""

    readable: tuple[str, ...]  # trees it may read
    writable: tuple[str, ...]  # trees it may read and write
    hidden: tuple[str, ...]  # paths inside those trees it may not read
    network: Network
    proxy_port: int | None = None  # loopback TCP port of the server's allow-list proxy ("proxy")
    memory_bytes: int | None = None


@dataclass
class Launch:
    """How to start a command under a mechanism: the argv to spawn instead, and the descriptors the
    spawned process must inherit (the parent closes its copies with `close` after the spawn).
    `handover`: the socket on which a listener on the proxy's port arrives from inside the
    command's network namespace (network "proxy" under bwrap), for the proxy to serve."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    closed: bool = field(default=False, repr=False)
    handover: socket.socket | None = field(default=None, repr=False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass


@dataclass(frozen=True)
class Grounds:
    """What every call's policy starts from: the operator's settings and this machine, found once at
    the server's start (the server's PATH, not a call's: a client's env adds nothing readable)."""

    readable: tuple[str, ...]
    writable: tuple[str, ...]
    hidden: tuple[str, ...]  # candidates: kept for a call only when inside one of its trees
    network: Network
    proxy_port: int | None = None
    memory_bytes: int | None = None
    variables: tuple[tuple[str, str], ...] = ()  # set for every command: the toolchain homes


def server_grounds(
    *,
    read: Iterable[Path] = (),
    write: Iterable[Path] = (),
    deny: Iterable[Path] = (),
    secret_files: Iterable[Path] = (),
    data_dir: Path | None = None,
    network: Network = "off",
    proxy_port: int | None = None,
    memory_bytes: int | None = None,
    path_variable: str | None = None,
) -> Grounds:
    """The grounds for a server: `read`, `write` and `deny` are the operator's lists, `secret_files`
    the token and key files, `data_dir` the server's (hidden but for the sessions' HOMEs in it)."""
    path_variable = os.environ.get("PATH", os.defpath) if path_variable is None else path_variable
    homes = _homes()
    programs = [_installation(entry, homes) for entry in path_variable.split(os.pathsep)]
    toolchains = _toolchain_homes(homes)
    readable = [*SYSTEM_TREES, sys.prefix, sys.base_prefix, sys.exec_prefix, *programs, *toolchains.values()]
    if network != "off":  # name resolution: /etc/resolv.conf may lead to /run/... (systemd-resolved)
        readable.append("/etc/resolv.conf")
    readable += map(str, read)
    hidden = [*SYSTEM_SECRETS, *_ssh_host_keys(), *map(str, deny), *map(str, secret_files)]
    if data_dir is not None:
        hidden.append(str(data_dir))
    for home in homes:
        hidden += (os.path.join(home, place) for place in CREDENTIAL_PLACES)
    return Grounds(
        readable=_existing(readable),
        writable=_existing(map(str, write)),
        hidden=_resolved(hidden),
        network=network,
        proxy_port=proxy_port,
        memory_bytes=memory_bytes,
        variables=tuple(toolchains.items()),
    )


def for_call(
    ground: Grounds,
    *,
    workspace: str,
    home: str,
    scratch: str,
    readable: Iterable[Path] = (),
    writable: Iterable[Path] = (),
    others: Iterable[str] = (),
    network: Network | None = None,
    proxy_port: int | None = None,
) -> SandboxPolicy:
    """One call's policy: `workspace`, `home` and `scratch` (resolved) and `writable` writable,
    `readable` (files the server put out for the call: a script, a skill's directory) readable,
    `others` (other sessions' workspaces, resolved) hidden, and `network` (with the proxy's
    `proxy_port` for "proxy") if the call's is not the grounds'. Which hidden paths exist is looked at on every call (one may appear any
    time); the rest is worked out once per layout."""
    layout = _layout(
        ground,
        workspace,
        home,
        _existing(map(str, readable)),
        _existing(map(str, writable)),
        tuple(others),
    )
    return SandboxPolicy(
        readable=layout.readable,
        writable=(*layout.writable, scratch),  # a tree of its own, whatever holds it
        hidden=tuple(h for h in layout.hidden if h != scratch and os.path.lexists(h)),
        network=network or ground.network,
        proxy_port=proxy_port or ground.proxy_port,
        memory_bytes=ground.memory_bytes,
    )


@dataclass(frozen=True)
class _Layout:
    readable: tuple[str, ...]
    writable: tuple[str, ...]
    hidden: tuple[str, ...]  # those inside a tree, existing or not


@lru_cache(maxsize=128)
def _layout(
    ground: Grounds,
    workspace: str,
    home: str,
    readable: tuple[str, ...],
    writable: tuple[str, ...],
    others: tuple[str, ...],
) -> _Layout:
    own = (workspace, home)
    writable_given = [*own, *writable, *ground.writable]
    readable_given = [*ground.readable, *readable]
    trees = (*readable_given, *writable_given)
    hidden = tuple(
        dict.fromkeys(h for h in (*ground.hidden, *others) if h not in own and _within_any(h, trees))
    )
    writable_trees = _outermost(writable_given, hidden)
    readable_trees = _outermost(readable_given, hidden)
    readable_trees = tuple(t for t in readable_trees if not _within_any(t, writable_trees))  # writable wins
    return _Layout(readable_trees, writable_trees, hidden)


def within(path: str, tree: str) -> bool:
    """Whether `path` is `tree` or below it (both absolute and resolved)."""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _within_any(path: str, trees: Iterable[str]) -> bool:
    return any(within(path, tree) for tree in trees)


def _outermost(paths: Iterable[str], hidden: Sequence[str] = ()) -> tuple[str, ...]:
    """The paths without those inside another of them (in their first order), but for those below
    a hidden path inside that other one (a HOME in a data dir in the workspace shows again)."""
    unique = list(dict.fromkeys(paths))
    return tuple(
        p
        for p in unique
        if not any(
            q != p and within(p, q) and not any(within(p, h) and within(h, q) and h != q for h in hidden)
            for q in unique
        )
    )


def _resolved(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if p and os.path.isabs(p)))


def _existing(paths: Iterable[str]) -> tuple[str, ...]:
    """Resolved absolute paths that exist (a relative PATH entry means nothing here)."""
    return tuple(p for p in _resolved(paths) if os.path.exists(p))


_PROGRAM_DIRECTORIES = frozenset({"bin", "sbin", "shims"})


def _installation(entry: str, homes: list[str]) -> str:
    """The tree a PATH entry's programs need: a `bin`, `sbin` or `shims` directory's parent (the
    installation: ~/.nvm/versions/node/v22 with its lib/, ~/.pyenv with its libexec/), unless that
    is / or a home directory (~/bin stays itself)."""
    entry = os.path.normpath(entry) if entry else entry
    parent = os.path.dirname(entry)
    if os.path.basename(entry) in _PROGRAM_DIRECTORIES and parent not in ("/", "", *homes):
        return parent
    return entry


def _homes() -> list[str]:
    """The home directories of the user running the server: $HOME and the password database's."""
    homes = [os.environ.get("HOME", "")]
    try:
        import pwd

        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError):
        pass
    return [h for h in dict.fromkeys(homes) if h and os.path.isabs(h) and h != "/"]


def _toolchain_homes(homes: Sequence[str]) -> dict[str, str]:
    """TOOLCHAIN_HOMES' variables and the resolved directories they name for the server's user:
    the server's own value, else the default place in a home directory, where it exists."""
    found = {}
    for variable, place in TOOLCHAIN_HOMES:
        given = os.environ.get(variable, "")
        candidates = [given] if given else [os.path.join(home, place) for home in homes]
        existing = [path for path in candidates if os.path.isabs(path) and os.path.isdir(path)]
        if existing:
            found[variable] = os.path.realpath(existing[0])
    return found


def _ssh_host_keys() -> list[str]:
    try:
        names = os.listdir(SSH_HOST_KEYS)
    except OSError:
        return []
    return [os.path.join(SSH_HOST_KEYS, n) for n in names if n.startswith("ssh_host_") and n.endswith("_key")]
