"""The seccomp program for each architecture, run by a classic-BPF interpreter on the system call
numbers of the kernel's own headers: aarch64's program cannot run on this machine, and a wrong
number in either table would let that call through unnoticed. (Real processes under the x86_64
program: tests/security/test_sandbox_landlock.py.)"""

from __future__ import annotations

import errno
import os
import re
import struct
from pathlib import Path

import pytest

from a3s_agent.tools.sandbox import seccomp
from a3s_agent.tools.sandbox.policy import Network

HEADERS = {
    "x86_64": ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"),
    "aarch64": ("/usr/include/asm-generic/unistd.h",),
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # linux/audit.h
AUDIT_ARCH_I386 = 0x40000003
ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_CLOEXEC = 1, 2, 5, 0x80000
IPPROTO_SCTP, MSG_FASTOPEN = 132, 0x20000000
TIOCSTI, TCGETS = 0x5412, 0x5401


def kernel_numbers(arch: str) -> dict[str, int]:
    for header in HEADERS[arch]:
        if Path(header).exists():
            text = Path(header).read_text()
            return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", text)}
    pytest.skip(f"no kernel header with {arch}'s system call numbers")


def run(program: bytes, nr: int, *args: int, arch: int) -> int:
    """What the program returns for system call `nr` with `args`, called by convention `arch`."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    code = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x54:  # and #k
            acc &= k
        elif op in (0x15, 0x35, 0x45):  # jeq, jge, jset #k
            taken = acc == k if op == 0x15 else acc >= k if op == 0x35 else bool(acc & k)
            pc += jt if taken else jf
        elif op == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {op:#x}")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize("network", ["off", "on", "proxy"])
def test_the_refused_calls_fail_and_the_ordinary_ones_pass(arch: str, network: Network) -> None:
    nr = kernel_numbers(arch)
    program = seccomp.program(network, arch)
    native = AUDIT_ARCH[arch]

    known = [name for name in seccomp.DENIED if name in nr]  # an older header lacks the newest calls
    assert len(known) >= len(seccomp.DENIED) - 2
    for name in known:
        assert run(program, nr[name], arch=native) == EPERM, name
    for name in ("read", "openat", "execve", "wait4", "mmap", "getpid", "socketpair"):
        assert run(program, nr[name], AF_UNIX, SOCK_STREAM, arch=native) == ALLOW, name
    assert run(program, nr["clone"], CLONE_NEWUSER | SIGCHLD, arch=native) == EPERM
    assert run(program, nr["clone"], SIGCHLD, arch=native) == ALLOW
    assert run(program, nr["clone3"], arch=native) == ENOSYS
    assert run(program, nr["ioctl"], 0, TIOCSTI, arch=native) == EPERM
    assert run(program, nr["ioctl"], 0, TCGETS, arch=native) == ALLOW
    assert run(program, nr["getpid"], arch=AUDIT_ARCH_I386) == KILL
    if arch == "x86_64":
        assert run(program, 0x40000000 | nr["ptrace"], arch=native) == EPERM  # x32


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_sockets_by_network_mode(arch: str) -> None:
    nr = kernel_numbers(arch)
    native = AUDIT_ARCH[arch]

    def verdicts(network: Network) -> list[int]:
        program = seccomp.program(network, arch)
        return [
            run(program, nr["socket"], AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0, arch=native),
            run(program, nr["socket"], AF_INET6, SOCK_STREAM, 6, arch=native),
            run(program, nr["socket"], AF_INET, SOCK_STREAM, IPPROTO_SCTP, arch=native),
            run(program, nr["socket"], AF_INET, SOCK_DGRAM, 0, arch=native),
            run(program, nr["socket"], AF_UNIX, SOCK_STREAM, 0, arch=native),
            run(program, nr["socketpair"], AF_UNIX, SOCK_SEQPACKET, 0, arch=native),
            run(program, nr["socketpair"], AF_UNIX, SOCK_DGRAM, 0, arch=native),
            run(program, nr["sendto"], 3, 0, 1, MSG_FASTOPEN, arch=native),
            run(program, nr["sendmsg"], 3, 0, 0, arch=native),
            run(program, nr["listen"], 3, 1, arch=native),
        ]

    assert verdicts("off") == [EPERM] * 5 + [ALLOW, EPERM, ALLOW, ALLOW, ALLOW]
    assert verdicts("proxy") == [ALLOW, ALLOW, EPERM, EPERM, EPERM, ALLOW, EPERM, EPERM, ALLOW, EPERM]
    assert verdicts("on") == [ALLOW] * 10


def test_an_unknown_architecture_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "uname", lambda: type("U", (), {"machine": "riscv64"})())
    seccomp.program.cache_clear()
    try:
        with pytest.raises(seccomp.Unsupported, match="riscv64"):
            seccomp.program("off")
    finally:
        seccomp.program.cache_clear()
