"""The seccomp program of every sandboxed command: the system calls a coding task never needs fail.

A classic-BPF program (`struct sock_filter[]`, native byte order) assembled here, without
libseccomp, for x86_64 and aarch64. It first checks the calling convention: a system call of
another architecture (i386 through `int 0x80` on x86_64, arm32 on aarch64) kills the process, and
x86_64's x32 numbers fail, so no second table can be used around this one. Then it refuses, with
EPERM so that tools fail cleanly rather than die:

- other processes' memory: ptrace, process_vm_readv/writev, pidfd_getfd, process_madvise;
- mounts and namespaces: the mount family, chroot, unshare, setns, and clone() with a CLONE_NEW*
  flag (clone3, whose flags sit behind a pointer, fails with ENOSYS: the C library falls back to
  clone);
- the kernel's keyring, bpf, perf_event_open, userfaultfd, io_uring (whose operations include
  socket() and would pass outside this filter), module loading, kexec, reboot, swap, acct, syslog,
  open_by_handle_at;
- typing into the terminal (ioctl TIOCSTI, TIOCLINUX);
- by network mode: "off" refuses socket() entirely, and socketpair() but for stream and seqpacket
  pairs (a datagram pair can send to any Unix socket by its path). "proxy" the same, but allows TCP
  sockets, which Landlock narrows to the proxy's port, and closes two ways around Landlock's TCP
  rules: sending with MSG_FASTOPEN (a connect the connect hook never sees: landlock-lsm/linux#41)
  and listen() (which binds an unbound socket without the bind hook). "on" leaves them alone.

bwrap loads it with `--seccomp FD` after making its namespaces; the Landlock launcher loads it last.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from .policy import Network


class Unsupported(RuntimeError):
    """This machine's architecture has no system call table here."""


@dataclass(frozen=True)
class _Arch:
    audit: int  # AUDIT_ARCH_*: what seccomp_data.arch holds for a call of this convention
    numbers: Mapping[str, int]
    x32: bool = False  # x86_64: numbers with bit 30 set are x32 calls


_SHARED = {  # numbered alike on both (the common table from 424 on)
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "process_madvise": 440,
    "mount_setattr": 442,
    "open_tree_attr": 467,
}
_ARCHES = {
    "x86_64": _Arch(
        audit=0xC000003E,
        x32=True,
        numbers={
            **_SHARED,
            "ioctl": 16,
            "socket": 41,
            "sendto": 44,
            "sendmsg": 46,
            "listen": 50,
            "socketpair": 53,
            "clone": 56,
            "ptrace": 101,
            "syslog": 103,
            "pivot_root": 155,
            "chroot": 161,
            "acct": 163,
            "mount": 165,
            "umount2": 166,
            "swapon": 167,
            "swapoff": 168,
            "reboot": 169,
            "init_module": 175,
            "delete_module": 176,
            "kexec_load": 246,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "unshare": 272,
            "perf_event_open": 298,
            "open_by_handle_at": 304,
            "sendmmsg": 307,
            "setns": 308,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "finit_module": 313,
            "kexec_file_load": 320,
            "bpf": 321,
            "userfaultfd": 323,
        },
    ),
    "aarch64": _Arch(
        audit=0xC00000B7,
        numbers={
            **_SHARED,
            "ioctl": 29,
            "umount2": 39,
            "mount": 40,
            "pivot_root": 41,
            "chroot": 51,
            "acct": 89,
            "unshare": 97,
            "kexec_load": 104,
            "init_module": 105,
            "delete_module": 106,
            "syslog": 116,
            "ptrace": 117,
            "reboot": 142,
            "socket": 198,
            "socketpair": 199,
            "listen": 201,
            "sendto": 206,
            "sendmsg": 211,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "clone": 220,
            "swapon": 224,
            "swapoff": 225,
            "perf_event_open": 241,
            "open_by_handle_at": 265,
            "setns": 268,
            "sendmmsg": 269,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "finit_module": 273,
            "bpf": 280,
            "userfaultfd": 282,
            "kexec_file_load": 294,
        },
    ),
}
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "process_madvise",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "open_tree_attr",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "open_by_handle_at",
)
"""Refused with EPERM whatever their arguments."""

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]. Arguments are
# compared by their low 32 bits (little-endian: at the start of each): the kernel reads every one
# tested here (socket's int domain, type and protocol; ioctl's unsigned int cmd; clone's flags, of
# which clone() keeps only the low half) as 32 bits.
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    return 16 + 8 * index


_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ, _JGE, _JSET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_{JEQ,JGE,JSET} | BPF_K
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000
_ALLOW = 0x7FFF0000
_X32_BIT = 0x40000000
_CLONE_NEW = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_AF_INET, _AF_INET6 = 2, 10
_SOCK_TYPE_MASK, _SOCK_STREAM, _SOCK_SEQPACKET = 0xF, 1, 5
_IPPROTO_TCP = 6
_MSG_FASTOPEN = 0x20000000
_SEND_FLAGS = {"sendto": 3, "sendmsg": 2, "sendmmsg": 3}  # the flags argument of each

# An instruction before assembly: (code, k, jump if true, jump if false); a jump is a label or 0
# (the next instruction); a label is a string in the list, naming the instruction after it.
_Op = tuple[int, int, str | int, str | int]


def _ld(offset: int) -> _Op:
    return (_LD_ABS, offset, 0, 0)


def _ret(action: int) -> _Op:
    return (_RET, action, 0, 0)


def _jump(code: int, k: int, yes: str | int, no: str | int = 0) -> _Op:
    return (code, k, yes, no)


def machine() -> str:
    """This machine's architecture, as the tables here name it (Unsupported when none fits)."""
    raw = os.uname().machine
    if sys.byteorder != "little" or raw not in _MACHINES:
        raise Unsupported(f"no seccomp system call table for the {raw} architecture (x86_64, aarch64)")
    return _MACHINES[raw]


@lru_cache(maxsize=8)
def program(network: Network, arch: str | None = None) -> bytes:
    """The filter for commands under `network`, for `arch` (default: this machine's)."""
    table = _ARCHES[arch or machine()]
    nr = table.numbers
    dispatch: list[_Op | str] = [_ld(_ARCH), _jump(_JEQ, table.audit, 0, "kill"), _ld(_NR)]
    if table.x32:
        dispatch.append(_jump(_JGE, _X32_BIT, "eperm"))
    dispatch += [_jump(_JEQ, nr[name], "eperm") for name in DENIED]
    dispatch += [_jump(_JEQ, nr["clone3"], "enosys"), _jump(_JEQ, nr["clone"], "clone")]
    dispatch.append(_jump(_JEQ, nr["ioctl"], "ioctl"))
    blocks: list[_Op | str] = ["clone", _ld(_arg(0)), _jump(_JSET, _CLONE_NEW, "eperm", "allow")]
    blocks += [
        "ioctl",
        _ld(_arg(1)),
        _jump(_JEQ, _TIOCSTI, "eperm"),
        _jump(_JEQ, _TIOCLINUX, "eperm", "allow"),
    ]
    if network != "on":
        dispatch.append(_jump(_JEQ, nr["socketpair"], "socketpair"))
        blocks += ["socketpair", _ld(_arg(1)), (_AND, _SOCK_TYPE_MASK, 0, 0)]
        blocks += [_jump(_JEQ, _SOCK_STREAM, "allow"), _jump(_JEQ, _SOCK_SEQPACKET, "allow", "eperm")]
    if network == "off":
        dispatch.append(_jump(_JEQ, nr["socket"], "eperm"))
    if network == "proxy":
        dispatch += [_jump(_JEQ, nr["socket"], "socket"), _jump(_JEQ, nr["listen"], "eperm")]
        blocks += _tcp_only()
        for name, flags in _SEND_FLAGS.items():
            dispatch.append(_jump(_JEQ, nr[name], name))
            blocks += [name, _ld(_arg(flags)), _jump(_JSET, _MSG_FASTOPEN, "eperm", "allow")]
    verdicts: list[_Op | str] = ["allow", _ret(_ALLOW), "eperm", _ret(_ERRNO | errno.EPERM)]
    verdicts += ["enosys", _ret(_ERRNO | errno.ENOSYS), "kill", _ret(_KILL_PROCESS)]
    return _assemble([*dispatch, _ret(_ALLOW), *blocks, *verdicts])


def _tcp_only() -> list[_Op | str]:
    """socket(): TCP over IPv4 or IPv6 (not SCTP, not MPTCP, which Landlock's TCP rules skip)."""
    return [
        "socket",
        _ld(_arg(0)),
        _jump(_JEQ, _AF_INET, "type"),
        _jump(_JEQ, _AF_INET6, "type", "eperm"),
        "type",
        _ld(_arg(1)),
        (_AND, _SOCK_TYPE_MASK, 0, 0),
        _jump(_JEQ, _SOCK_STREAM, 0, "eperm"),
        _ld(_arg(2)),
        _jump(_JEQ, 0, "allow"),  # the family's default stream protocol: TCP
        _jump(_JEQ, _IPPROTO_TCP, "allow", "eperm"),
    ]


def _assemble(ops: list[_Op | str]) -> bytes:
    labels: dict[str, int] = {}
    code: list[_Op] = []
    for op in ops:
        if isinstance(op, str):
            labels[op] = len(code)
        else:
            code.append(op)
    out = bytearray()
    for index, (opcode, k, yes, no) in enumerate(code):
        jt, jf = (labels[j] - index - 1 if isinstance(j, str) else j for j in (yes, no))
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise AssertionError(f"seccomp jump out of range at instruction {index}")
        out += struct.pack("=HBBI", opcode, jt, jf, k)
    return bytes(out)
