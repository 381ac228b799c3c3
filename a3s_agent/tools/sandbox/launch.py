"""The Landlock launcher: restricts itself, then becomes the command.

Run as `<python> -I -S launch.py FD:START:LENGTH COMMAND...`: FD is an inherited file holding, from
byte START, LENGTH bytes of instructions (`encode`). landlock.py runs the same code compiled, from
the same memfd as the instructions (`-c` with a loader: no source to read and compile each time).
In order it first (when told to) listens on 127.0.0.1:<proxy port> and sends the listening socket
over an inherited Unix socket: bwrap runs it so in a command's network namespace, where the
server's proxy is out of reach until it serves that socket (bwrap.py). Then it sets the memory
limit, drops every capability (a root server's commands run without any, as under bwrap), sets
no_new_privs, builds and enforces a Landlock ruleset (file rules, TCP port rules and scopes, as far
as the kernel's ABI goes; not when told so: under bwrap, whose namespaces do that work), loads the
seccomp program, and execs the command with the environment it was itself started with plus the
variables the instructions carry (the loader's, such as LD_PRELOAD, which must not act on this
process before it is restricted), looked up on that environment's PATH.
Any failure: a line `sandbox: <why>` on stderr and exit status 126, never the command unrestricted.

Standard library only, and as little of it as it takes, since every sandboxed spawn pays for this
interpreter's start: `_ctypes` rather than `ctypes` (whose Python half costs 2 ms), no json (its
`re` import costs 5 ms), no `from __future__` (a module to import). The instructions are
NUL-separated bytes, so paths need no decoding.
"""

import _ctypes
import _signal  # type: ignore[import-not-found]  # signal's C half, loaded at start (signal imports enum)
import errno
import os
import sys

MAGIC = b"a3s-landlock-2"
FAILED = 126

# Landlock (include/uapi/linux/landlock.h); the system calls are numbered alike on every architecture.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # those a file can carry
_READ_RIGHTS = _EXECUTE | _READ_FILE | _READ_DIR
_BIND_TCP, _CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAPABILITY_VERSION_3 = 0x20080522
_RLIMIT_DATA = 2

RULE_KINDS = (b"rd", b"rf", b"wd", b"wf")
"""A rule's kind: readable or writable, directory (the rights apply beneath it) or file."""
NETWORKS = (b"off", b"on", b"proxy")


class Refused(Exception):
    """A step of the sandbox failed: the command must not run."""


def encode(
    rules: list[tuple[bytes, bytes]],
    network: str,
    proxy_port: int | None,
    memory_bytes: int | None,
    bpf: bytes,
    *,
    landlock: bool = True,
    handover: int | None = None,
    setenv: dict[str, str] | None = None,
) -> bytes:
    """The instructions: MAGIC, memory, network, proxy port, the fd to hand a listener on the proxy
    port over (-1: none), whether to restrict with Landlock, the count of variables to set for the
    command only, each as NAME=VALUE, rule count, each rule as its kind and path, all
    NUL-terminated, then the seccomp program (empty: none)."""
    fields = [MAGIC, b"%d" % (memory_bytes or 0), network.encode(), b"%d" % (proxy_port or 0)]
    fields += [b"%d" % (-1 if handover is None else handover), b"1" if landlock else b"0"]
    variables = [os.fsencode(f"{name}={value}") for name, value in (setenv or {}).items()]
    fields += [b"%d" % len(variables), *variables]
    fields.append(b"%d" % len(rules))
    fields += (kind + path for kind, path in rules)
    return b"\0".join(fields) + b"\0" + bpf


class _Call(_ctypes.CFuncPtr):
    """A C function taking small ints and byte buffers, returning an int, keeping errno."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO


class _Char(_ctypes._SimpleCData):  # type: ignore[type-arg]
    _type_ = "c"


class _Libc:
    def __init__(self) -> None:
        handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # the process's own symbols
        self.syscall = _Call(_ctypes.dlsym(handle, "syscall"))
        self.prctl = _Call(_ctypes.dlsym(handle, "prctl"))
        self.capset = _Call(_ctypes.dlsym(handle, "capset"))
        self.getrlimit = _Call(_ctypes.dlsym(handle, "getrlimit"))
        self.setrlimit = _Call(_ctypes.dlsym(handle, "setrlimit"))

    def check(self, result: int, what: str) -> int:
        if result < 0:
            raise Refused(f"{what}: {os.strerror(_ctypes.get_errno())}")
        return result


def _u64(value: int) -> bytes:
    return value.to_bytes(8, sys.byteorder)


def abi() -> int:
    """The kernel's Landlock ABI version; when it has none, minus the errno saying why (ENOSYS: not
    built in, EOPNOTSUPP: disabled at boot)."""
    return _abi(_Libc())


def _abi(libc: _Libc) -> int:
    version: int = libc.syscall(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return version if version >= 0 else -_ctypes.get_errno()


def _limit_memory(libc: _Libc, limit: int) -> None:
    """RLIMIT_DATA, not RLIMIT_AS: it counts the private writable memory a process can fill, where
    the address space also counts reservations that hold nothing (the JVM's, Go's and V8's run to
    gigabytes; sanitizers' to terabytes), which would fail long before any memory is used."""
    current = bytearray(16)
    libc.check(libc.getrlimit(_RLIMIT_DATA, _ctypes.byref(_Char.from_buffer(current))), "getrlimit")
    hard = int.from_bytes(current[8:], sys.byteorder)
    limit = min(limit, hard)
    libc.check(libc.setrlimit(_RLIMIT_DATA, _u64(limit) + _u64(limit)), "setrlimit(RLIMIT_DATA)")


def _drop_capabilities(libc: _Libc) -> None:
    """No capability, now or after the exec: the permitted, effective, inheritable (and so ambient)
    sets emptied; with no_new_privs an exec cannot give root its capabilities back (the kernel
    keeps only those the process had). The bounding set is emptied too where CAP_SETPCAP allows."""
    cap = 0
    while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:  # until EINVAL (past the last) or EPERM
        cap += 1
    header = _CAPABILITY_VERSION_3.to_bytes(4, sys.byteorder) + bytes(4)
    libc.check(libc.capset(header, bytes(24)), "capset")


def _fs_rights(version: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if version >= 2:
        rights |= _REFER
    if version >= 3:
        rights |= _TRUNCATE
    if version >= 5:
        rights |= _IOCTL_DEV
    return rights


def _landlock(libc: _Libc, version: int, rules: list[bytes], network: bytes, proxy_port: int) -> None:
    handled = _fs_rights(version)
    rights = {b"rd": _READ_RIGHTS, b"rf": _READ_RIGHTS & _FILE_RIGHTS}
    rights[b"wd"] = handled
    rights[b"wf"] = handled & _FILE_RIGHTS
    attr = _u64(handled)
    if version >= 4:
        attr += _u64(_BIND_TCP | _CONNECT_TCP if network != b"on" else 0)
    elif network == b"proxy":
        raise Refused(
            f"network 'proxy' needs Landlock ABI 4 (Linux 6.7) to keep TCP to the proxy's port; "
            f"this kernel has ABI {version}"
        )
    if version >= 6:
        attr += _u64(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    ruleset = libc.check(libc.syscall(_CREATE_RULESET, attr, len(attr), 0), "landlock_create_ruleset")
    try:
        for rule in rules:
            _path_rule(libc, ruleset, rights[rule[:2]], rule[2:])
        if version >= 4 and network == b"proxy":
            port = _u64(_CONNECT_TCP) + _u64(proxy_port)
            libc.check(libc.syscall(_ADD_RULE, ruleset, _RULE_NET_PORT, port, 0), "the proxy port's rule")
        libc.check(libc.syscall(_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _path_rule(libc: _Libc, ruleset: int, rights: int, path: bytes) -> None:
    """Allow `rights` beneath `path`. A path gone, or no longer of its kind, is skipped: a rule
    fewer only takes rights away. Never through a symlink (one could lead out of the tree)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, _u64(rights) + fd.to_bytes(4, sys.byteorder), 0)
    finally:
        os.close(fd)


def _seccomp(libc: _Libc, bpf: bytes) -> None:
    if len(bpf) % 8 or not 0 < len(bpf) // 8 <= 4096:
        raise Refused(f"a seccomp program of {len(bpf)} bytes")
    code = bytearray(bpf)
    fprog = (
        (len(bpf) // 8).to_bytes(2, sys.byteorder)
        + bytes(6)
        + _u64(_ctypes.addressof(_Char.from_buffer(code)))
    )
    libc.check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog, 0, 0), "loading the seccomp filter")


def _environment() -> dict[bytes, bytes]:
    """The environment this process was started with, as the kernel keeps it: the interpreter has
    changed its own copy (LC_CTYPE=C.UTF-8 where the locale was C)."""
    fd = os.open("/proc/self/environ", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    env: dict[bytes, bytes] = {}
    for entry in b"".join(chunks).split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and name:
            env.setdefault(name, value)
    return env


def _hand_over_listener(port: int, fd: int) -> None:
    """Listen on 127.0.0.1:`port` (in this network namespace) and send the socket over the Unix
    socket `fd` (SCM_RIGHTS); neither stays open here."""
    import _socket  # socket's C half (socket imports enum, selectors)

    channel = _socket.socket(fileno=fd)
    try:
        listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", port))
            listener.listen(_socket.SOMAXCONN)
            rights = listener.fileno().to_bytes(4, sys.byteorder)
            channel.sendmsg([b"L"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        finally:
            listener.close()
    except OSError as exc:
        raise Refused(f"listening for the network proxy on 127.0.0.1:{port}: {exc.strerror or exc}") from None
    finally:
        channel.close()


def apply(data: bytes) -> dict[bytes, bytes]:
    """Restrict this process as `data` (see `encode`) says; the variables to set for the command."""
    magic, memory, network, port, handover, landlock, variables, rest = data.split(b"\0", 7)
    if magic != MAGIC or network not in NETWORKS or landlock not in (b"0", b"1"):
        raise Refused("instructions of an unknown format")
    *assignments, rest = rest.split(b"\0", int(variables))
    setenv = dict(assignment.partition(b"=")[::2] for assignment in assignments)
    count, rest = rest.split(b"\0", 1)
    parts = rest.split(b"\0", int(count))
    rules, bpf = parts[:-1], parts[-1]
    if any(rule[:2] not in RULE_KINDS for rule in rules):
        raise Refused("a rule of an unknown kind")
    if int(handover) >= 0:
        _hand_over_listener(int(port), int(handover))
    libc = _Libc()
    version = _abi(libc) if landlock == b"1" else 0
    if landlock == b"1" and version <= 0:
        raise Refused(f"this kernel has no Landlock: {os.strerror(-version)}")
    if int(memory):
        _limit_memory(libc, int(memory))
    _drop_capabilities(libc)
    libc.check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if landlock == b"1":
        _landlock(libc, version, rules, network, int(port))
    if bpf:
        _seccomp(libc, bpf)
    return setenv


def _execute(argv: list[str], env: dict[bytes, bytes]) -> None:
    """execve argv[0], looked up on env's PATH when it has no slash (as subprocess does)."""
    program = os.fsencode(argv[0])
    if b"/" in program:
        candidates = [program]
    else:
        path = env.get(b"PATH", os.fsencode(os.defpath))
        candidates = [os.path.join(directory, program) for directory in path.split(b":")]
    failure: OSError | None = None
    for candidate in candidates:
        try:
            os.execve(candidate, argv, env)
        except OSError as exc:
            if failure is None or exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # they say the least
                failure = exc
    assert failure is not None
    raise Refused(f"cannot run {argv[0]}: {os.strerror(failure.errno or 0)}")


def _fail(why: str) -> None:
    os.write(2, b"sandbox: " + why.encode(errors="replace") + b"\n")
    os._exit(FAILED)


def main(argv: list[str]) -> None:
    try:
        if len(argv) < 3:
            raise Refused("usage: launch.py FD:START:LENGTH COMMAND...")
        fd, start, length = (int(n) for n in argv[1].split(":"))
        data = os.pread(fd, length, start)
        os.close(fd)
        if len(data) != length:
            raise Refused("the instructions were cut short")
        env = _environment()
        env.update(apply(data))
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)  # the interpreter ignores these two,
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)  # which the command would inherit
        _execute(argv[2:], env)
    except Refused as exc:
        _fail(str(exc))
    except Exception as exc:  # whatever it is, the command does not run
        _fail(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main(sys.argv)
