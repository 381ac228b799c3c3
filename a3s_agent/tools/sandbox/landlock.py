"""Landlock and seccomp: the sandbox where user namespaces (and so bwrap) are not available.

The command is started through launch.py, which restricts itself and then execs it; this module
renders a policy into that launcher's instructions. A Landlock rule grants rights beneath a path,
and nothing takes them back deeper down. So a tree holding hidden paths is covered by rules on its
other entries instead, down to each hidden path: the directories on the way get no rule of their
own (listing them fails, and nothing can be created, removed or renamed directly in them), their
other entries get the tree's rights. A hidden path that does not exist is walked towards as far
as it does, so that nothing can be made in its place. A tree inside a hidden path (a session's
HOME in the data dir) is granted by its own rule. Symlinks never get a rule: a path through one
is judged where it leads.

Added here, since every command needs them and bwrap makes its own: /proc (read-only) and the
harmless devices (/dev/null, zero, full and tty writable; random and urandom readable).

What bwrap's namespaces give and Landlock cannot: a private /dev/shm and /dev/pts (so neither is
here); other processes' /proc entries out of sight (their environ, memory and signals are out of
reach, their cmdline is not); Unix sockets by path out of sight (network "off" and "proxy" refuse
Unix sockets in seccomp; under "on" a command may connect to any socket file its user may open);
TCP narrowed to the proxy's address rather than only its port; and a hard link to a hidden file,
made by someone outside the sandbox inside one of its trees, opens that file (the command itself
cannot make one: Landlock refuses a link that would give a file more rights than it had).
"""

from __future__ import annotations

import errno
import marshal
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from . import launch, seccomp
from .policy import Launch, SandboxPolicy

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")
EXTRA_READABLE = ("/proc", "/dev/random", "/dev/urandom")
EXTRA_WRITABLE = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")
_PROBE_TIMEOUT_S = 10.0
_COVERS_KEPT = 64

Rule = tuple[bytes, bytes]  # (kind, path): see launch.RULE_KINDS


def abi() -> int:
    """The kernel's Landlock ABI version (0: none)."""
    return max(_abi(), 0)


@lru_cache(maxsize=1)
def _abi() -> int:
    return launch.abi()


SIGNAL_SCOPE_ABI = 6  # Linux 6.12: signals to processes outside the sandbox's domain refused


def weakness() -> str | None:
    """What this kernel's Landlock leaves a command that a newer one would not (None: nothing)."""
    version = abi()
    if 0 < version < SIGNAL_SCOPE_ABI:
        return (
            f"this kernel's Landlock ABI is {version}, without the signal scope of ABI"
            f" {SIGNAL_SCOPE_ABI} (Linux 6.12): a command can signal (kill) the server and every"
            " process of its user"
        )
    return None


@lru_cache(maxsize=1)
def problem() -> str | None:
    """Why Landlock cannot sandbox commands here (None: it can), found once by running the
    launcher on `true` under a policy that really restricts it."""
    version = _abi()
    if version == -errno.ENOSYS:
        return "this kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK)"
    if version < 0:
        return f"Landlock is disabled on this kernel (add landlock to the lsm= boot parameter): {os.strerror(-version)}"
    if not sys.executable:
        return "no path to this Python interpreter, which runs the Landlock launcher"
    try:
        bpf = seccomp.program("off")
    except seccomp.Unsupported as exc:
        return str(exc)
    started = command(["true"], SandboxPolicy(readable=("/",), writable=(), hidden=(), network="off"), bpf)
    try:
        done = subprocess.run(
            started.argv,
            pass_fds=started.pass_fds,
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
            env={"PATH": os.defpath},
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the Landlock launcher cannot be run: {exc}"
    finally:
        started.close()
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return f"the Landlock launcher fails here: {said[-1] if said else f'exit status {done.returncode}'}"
    return None


def command(
    argv: Sequence[str], policy: SandboxPolicy, bpf: bytes | None, setenv: Mapping[str, str] | None = None
) -> Launch:
    """The launcher's argv running `argv` under `policy` and the seccomp program `bpf` (None:
    none), and the memfd it reads (inherited by the spawn, closed by the caller after it): the
    launcher's compiled code, then its instructions. Working directory and environment: the spawn's,
    plus `setenv` for the command only."""
    instructions = launch.encode(
        rules(policy),
        policy.network,
        policy.proxy_port,
        policy.memory_bytes,
        bpf or b"",
        setenv=dict(setenv or {}),
    )
    return launcher(argv, instructions)


def launcher(argv: Sequence[str], instructions: bytes, pass_fds: tuple[int, ...] = ()) -> Launch:
    """The launcher's argv running `argv` as `instructions` (launch.encode) say, and the memfd it
    reads them from; `pass_fds` are further descriptors the instructions name."""
    code = _launcher_code()
    fd = os.memfd_create("a3s-sandbox")  # close-on-exec: only the spawn given it in pass_fds has it
    try:
        view = memoryview(code + instructions)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        os.close(fd)
        raise
    loader = f"import marshal,os;exec(marshal.loads(os.pread({fd},{len(code)},0)))"
    spec = f"{fd}:{len(code)}:{len(instructions)}"
    return Launch([sys.executable, "-I", "-S", "-c", loader, spec, *argv], (fd, *pass_fds))


@lru_cache(maxsize=1)
def _launcher_code() -> bytes:
    """launch.py compiled by this interpreter (the one the launcher runs on), marshalled."""
    with open(LAUNCHER, "rb") as source:
        return marshal.dumps(compile(source.read(), LAUNCHER, "exec", dont_inherit=True))


def rules(policy: SandboxPolicy) -> list[Rule]:
    """The launcher's path rules for `policy`: each tree, or its entries around hidden paths."""
    out: list[Rule] = []
    hidden = set(policy.hidden)
    for trees, writable in (
        (policy.readable + EXTRA_READABLE, False),
        (policy.writable + EXTRA_WRITABLE, True),
    ):
        for tree in trees:
            if tree in hidden:
                continue
            inside = tuple(sorted(h for h in policy.hidden if _below(h, tree)))
            out += _cover(tree, inside, writable) if inside else _whole(tree, writable)
    return out


def _below(path: str, tree: str) -> bool:
    """Whether `path` lies strictly below `tree` (both absolute and normalized)."""
    return path.startswith(tree.rstrip("/") + "/")


def _kind(writable: bool, directory: bool) -> bytes:
    return (b"w" if writable else b"r") + (b"d" if directory else b"f")


def _whole(tree: str, writable: bool) -> list[Rule]:
    try:
        mode = os.lstat(tree).st_mode
    except OSError:
        return []
    if stat.S_ISLNK(mode):  # the policy's paths are resolved; a symlink here grants nothing
        return []
    return [(_kind(writable, stat.S_ISDIR(mode)), os.fsencode(tree))]


@dataclass(frozen=True)
class _Cover:
    rules: tuple[Rule, ...]
    listed: tuple[tuple[str, int, int], ...]  # each directory walked: path, inode, mtime (ns)

    def current(self) -> bool:
        """Whether no directory walked has changed since (an entry added, removed or renamed)."""
        for path, inode, mtime in self.listed:
            try:
                st = os.stat(path)
            except OSError:
                return False
            if (st.st_ino, st.st_mtime_ns) != (inode, mtime):
                return False
        return True


_covers: dict[tuple[str, tuple[str, ...], bool], _Cover] = {}
_covers_lock = threading.Lock()


def _cover(tree: str, hidden: tuple[str, ...], writable: bool) -> list[Rule]:
    """The rules granting `tree` but the `hidden` paths below it; the walk is kept and used again
    while the directories it listed are unchanged (a system tree like /etc is listed once)."""
    key = (tree, hidden, writable)
    with _covers_lock:
        kept = _covers.get(key)
    if kept is None or not kept.current():
        kept = _walk(tree, hidden, writable)
        with _covers_lock:
            if len(_covers) >= _COVERS_KEPT:
                _covers.clear()
            _covers[key] = kept
    return list(kept.rules)


def _walk(tree: str, hidden: tuple[str, ...], writable: bool) -> _Cover:
    rules: list[Rule] = []
    listed: list[tuple[str, int, int]] = []

    def visit(directory: str, inside: Sequence[str]) -> None:
        """Rules for the entries of `directory` but the hidden paths (`inside`, all below it)."""
        prefix = directory.rstrip("/") + "/"
        hidden_here: set[str] = set()  # names of entries hidden themselves
        toward: dict[str, list[str]] = {}  # entry name -> the hidden paths below that entry
        for path in inside:
            name, _, rest = path[len(prefix) :].partition("/")
            if rest:
                toward.setdefault(name, []).append(path)
            else:
                hidden_here.add(name)
        try:
            st = os.stat(directory)
            with os.scandir(directory) as entries:
                found = list(entries)
        except OSError:  # gone or unreadable: nothing granted in it
            return
        listed.append((directory, st.st_ino, st.st_mtime_ns))
        for entry in found:
            if entry.name in hidden_here:
                continue
            try:
                if entry.is_symlink():
                    continue
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            deeper = toward.get(entry.name)
            if deeper and is_dir:
                visit(entry.path, deeper)
            else:  # nothing hidden below it (below a file, a hidden path cannot exist)
                rules.append((_kind(writable, is_dir), os.fsencode(entry.path)))

    visit(tree, hidden)
    return _Cover(tuple(rules), tuple(listed))
