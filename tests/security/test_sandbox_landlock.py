"""The Landlock launcher on real commands: what a command under a policy can read, write, reach and
signal, and that ordinary work still runs. Each command is spawned the way the runner spawns it
(landlock.command's argv and inherited memfd) and attacks from inside; running as root (as here)
nothing but the sandbox stands in its way. Skipped where the kernel has no usable Landlock."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from a3s_agent.tools.sandbox import landlock, seccomp
from a3s_agent.tools.sandbox.policy import Network, SandboxPolicy

PROBLEM = landlock.problem()
pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(PROBLEM is not None, reason=f"Landlock cannot be used here: {PROBLEM}"),
]

SYSTEM = tuple(
    dict.fromkeys(
        os.path.realpath(p)
        for p in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", sys.prefix, sys.base_prefix)
        if os.path.exists(p)
    )
)
PYTHON = sys.executable
ROOT = os.geteuid() == 0


def needs_abi(version: int, what: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(landlock.abi() < version, reason=f"{what} needs Landlock ABI {version}")


class World:
    """A workspace (writable), a tree the command may only read, and a place in no tree."""

    def __init__(self, root: Path) -> None:
        self.workspace = root / "workspace"
        self.readable = root / "readable"
        self.elsewhere = root / "elsewhere"
        for directory in (self.workspace, self.readable / "sub", self.elsewhere):
            directory.mkdir(parents=True)
        (self.readable / "notes").write_text("notes\n")
        (self.readable / "sub" / "file").write_text("sub\n")
        (self.elsewhere / "file").write_text("elsewhere\n")
        self.policy = SandboxPolicy(
            readable=(*SYSTEM, str(self.readable)),
            writable=(str(self.workspace),),
            hidden=(),
            network="off",
        )

    def run(
        self, *argv: str, policy: SandboxPolicy | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        chosen = policy or self.policy
        started = landlock.command(list(argv), chosen, seccomp.program(chosen.network))
        try:
            return subprocess.run(
                started.argv,
                pass_fds=started.pass_fds,
                cwd=self.workspace,
                env=env if env is not None else {"PATH": os.environ["PATH"], "HOME": str(self.workspace)},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            started.close()

    def sh(self, script: str, policy: SandboxPolicy | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("bash", "-c", script, policy=policy)

    def py(self, code: str, policy: SandboxPolicy | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(PYTHON, "-c", code, policy=policy)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture(params=["as-is", "capless"])
def sibling(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[bytes]]:
    """A process outside the sandbox, the command's would-be victim, with a secret in its
    environment: as this test runs (root: capabilities alone would already keep a command without
    any away from it), or of the same user without capabilities (only Landlock stands in the way)."""
    argv = ["sh", "-c", "echo ready; exec sleep 120"]  # ready: its capabilities are what they stay
    if request.param == "capless":
        if not ROOT or shutil.which("setpriv") is None:
            pytest.skip("a sibling without capabilities needs root and setpriv")
        argv = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", *argv]
    process = subprocess.Popen(argv, env={"SIBLING_SECRET": "hunter2"}, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"  # or EOF: it died
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


# Files


def test_a_hidden_file_in_a_readable_tree_is_unreadable_and_its_siblings_are_not(world: World) -> None:
    (world.readable / "secret").write_text("token\n")
    policy = replace(world.policy, hidden=(str(world.readable / "secret"), "/etc/shadow"))

    done = world.sh(
        f"cat {world.readable}/notes {world.readable}/sub/file /etc/passwd >/dev/null && echo siblings-read;"
        f"cat {world.readable}/secret; cat /etc/shadow",
        policy=policy,
    )

    assert "siblings-read" in done.stdout
    assert "token" not in done.stdout and "root:" not in done.stdout
    assert f"{world.readable}/secret: Permission denied" in done.stderr
    assert "/etc/shadow: Permission denied" in done.stderr


def test_the_data_dir_is_hidden_but_the_session_home_inside_it(tmp_path: Path, world: World) -> None:
    data = tmp_path / "data"
    home = data / "homes" / "s1"
    home.mkdir(parents=True)
    (data / "sessions.db").write_text("every session\n")
    (home / ".gitconfig").write_text("[user]\n")
    policy = replace(
        world.policy,
        readable=(*world.policy.readable, str(tmp_path)),  # the data dir lies inside a readable tree
        writable=(str(world.workspace), str(home)),
        hidden=(str(data),),
    )

    done = world.sh(
        f"cd {home} && cat .gitconfig && echo cache > cache && cat cache;"
        f"cat {data}/sessions.db; ls {data}; echo planted > {data}/planted; cat {world.readable}/notes",
        policy=policy,
    )

    assert done.stdout.split() == ["[user]", "cache", "notes"]
    assert f"{data}/sessions.db: Permission denied" in done.stderr
    assert f"cannot open directory '{data}': Permission denied" in done.stderr
    assert f"{data}/planted: Permission denied" in done.stderr
    assert not (data / "planted").exists()


def test_a_hidden_path_that_does_not_exist_cannot_be_made(world: World) -> None:
    policy = replace(world.policy, hidden=(str(world.workspace / ".aws" / "credentials"),))
    (world.workspace / "src").mkdir()

    done = world.sh("mkdir .aws; echo code > src/main.py && cat src/main.py", policy=policy)

    assert done.stdout.split() == ["code"]
    assert "cannot create directory '.aws': Permission denied" in done.stderr
    assert not (world.workspace / ".aws").exists()


def test_writes_outside_the_writable_trees_fail_by_every_road(world: World) -> None:
    target = world.readable / "notes"

    done = world.sh(
        f"echo direct >> {target};"
        f"ln -s {target} symlink; echo symlink >> symlink;"
        f"ln {target} hardlink; echo hardlink >> hardlink;"
        f"echo proc >> /proc/self/root{target};"
        f"echo elsewhere >> {world.elsewhere}/file; touch {world.elsewhere}/new;"
        "echo inside > mine && cat mine"
    )

    assert target.read_text() == "notes\n"
    assert (world.elsewhere / "file").read_text() == "elsewhere\n"
    assert not (world.elsewhere / "new").exists()
    assert done.stdout.split() == ["inside"]
    for refused in (f"{target}: Permission denied", "symlink: Permission denied", f"/proc/self/root{target}"):
        assert refused in done.stderr
    assert "failed to create hard link" in done.stderr
    assert f"{world.elsewhere}/file: Permission denied" in done.stderr


def test_a_tree_outside_the_policy_is_unreadable(world: World) -> None:
    done = world.sh(f"cat {world.elsewhere}/file; ls {world.elsewhere}")

    assert "elsewhere" not in done.stdout
    assert f"{world.elsewhere}/file: Permission denied" in done.stderr


# Network


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def _connect(port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=10); print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )


def test_network_off_refuses_every_socket_but_stream_pairs(world: World, listener: socket.socket) -> None:
    done = world.py(
        "import socket\n"
        "a, b = socket.socketpair(); a.send(b'x'); print('pair', b.recv(1))\n"
        "for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM),"
        " (socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_NETLINK, socket.SOCK_RAW)):\n"
        "    try:\n"
        "        socket.socket(family, kind); print('created', family)\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
        "try:\n"
        "    socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); print('datagram pair')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )

    assert done.stdout.splitlines() == ["pair b'x'", *["refused 1"] * 5], done.stderr


def test_a_datagram_pair_cannot_reach_a_unix_socket_outside(tmp_path: Path, world: World) -> None:
    path = str(tmp_path / "log.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as outside:
        outside.bind(path)
        outside.setblocking(False)
        done = world.py(
            "import socket\n"
            "try:\n"
            "    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            f"    a.sendto(b'escaped', {path!r}); print('sent')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
        )
        with pytest.raises(BlockingIOError):
            outside.recv(100)
    assert done.stdout.split() == ["refused", "1"], done.stderr


def test_network_proxy_reaches_only_the_proxy_port_over_tcp(world: World, listener: socket.socket) -> None:
    with socket.create_server(("127.0.0.1", 0)) as other:
        other.setblocking(False)
        proxy = replace(world.policy, network="proxy", proxy_port=listener.getsockname()[1])
        other_port = other.getsockname()[1]

        to_proxy = world.py(_connect(listener.getsockname()[1]), policy=proxy)
        to_other = world.py(_connect(other_port), policy=proxy)
        around = world.py(
            "import socket\n"
            "for attempt in ('fastopen', 'listen', 'udp', 'unix'):\n"
            "    try:\n"
            "        if attempt == 'fastopen':\n"
            f"            socket.socket().sendto(b'x', socket.MSG_FASTOPEN, ('127.0.0.1', {other_port}))\n"
            "        elif attempt == 'listen':\n"
            "            socket.socket().listen()\n"
            "        elif attempt == 'udp':\n"
            "            socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "        else:\n"
            "            socket.socket(socket.AF_UNIX)\n"
            "        print(attempt, 'done')\n"
            "    except OSError as exc:\n"
            "        print(attempt, exc.errno)\n",
            policy=proxy,
        )
        with pytest.raises(BlockingIOError):
            other.accept()

    assert to_proxy.stdout.strip() == "connected", to_proxy.stderr
    assert to_other.stdout.strip() == "refused 13", to_other.stderr  # EACCES: Landlock's port rule
    assert around.stdout.split() == ["fastopen", "1", "listen", "1", "udp", "1", "unix", "1"], around.stderr


def test_network_on_reaches_loopback(world: World, listener: socket.socket) -> None:
    done = world.py(_connect(listener.getsockname()[1]), policy=replace(world.policy, network="on"))

    assert done.stdout.strip() == "connected", done.stderr


@needs_abi(6, "the abstract Unix socket scope")
@pytest.mark.parametrize("network", ["off", "on"])
def test_an_abstract_unix_socket_outside_is_out_of_reach(world: World, network: Network) -> None:
    name = f"\0a3s-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as outside:
        outside.bind(name)
        outside.listen()
        done = world.py(
            "import socket\n"
            "try:\n"
            f"    socket.socket(socket.AF_UNIX).connect({name!r}); print('connected')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n",
            policy=replace(world.policy, network=network),
        )

    assert done.stdout.strip() == "refused 1", done.stderr


# Processes


@needs_abi(6, "the signal scope")
def test_a_process_outside_cannot_be_signalled(world: World, sibling: subprocess.Popen[bytes]) -> None:
    done = world.sh(f"kill -KILL {sibling.pid}; kill -TERM {sibling.pid}; echo done")

    assert "done" in done.stdout
    assert done.stderr.count("Operation not permitted") == 2
    assert sibling.poll() is None


def test_a_process_outside_cannot_be_traced_or_read(world: World, sibling: subprocess.Popen[bytes]) -> None:
    done = world.py(
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"print('attach', libc.ptrace(16, {sibling.pid}, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH
        "try:\n"
        f"    print(open('/proc/{sibling.pid}/environ').read())\n"
        "except OSError as exc:\n"
        "    print('environ', exc.errno)\n"
    )

    assert done.stdout.split() == ["attach", "-1", "1", "environ", "13"], done.stderr
    assert "hunter2" not in done.stdout


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_command_cannot_trace_even_its_own_child(world: World) -> None:
    done = world.run("strace", "-f", "true")

    assert done.returncode != 0
    assert "PTRACE_TRACEME" in done.stderr and "Operation not permitted" in done.stderr


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the raw system call numbers are x86_64's")
def test_no_namespaces_and_no_second_system_call_table(world: World) -> None:
    done = world.py(
        "import ctypes, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"  # clone(CLONE_NEWUSER | SIGCHLD)
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "print('clone', pid, ctypes.get_errno())\n"
        "print('x32', libc.syscall(0x40000000 + 39, 0, 0, 0, 0, 0), ctypes.get_errno())\n"  # x32 getpid
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
    )
    unshared = world.run("unshare", "-U", "true")

    assert done.stdout.split() == ["clone", "-1", "1", "x32", "-1", "1", "thread"], done.stderr
    assert unshared.returncode != 0 and "Operation not permitted" in unshared.stderr


@pytest.mark.skipif(not ROOT, reason="capabilities matter for a root server")
def test_a_root_server_s_commands_run_without_capabilities(world: World) -> None:
    done = world.sh("grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status; mknod disk b 8 0")

    assert [line.split()[1] for line in done.stdout.splitlines()] == ["0000000000000000"] * 4
    assert "mknod: disk: Operation not permitted" in done.stderr


def test_memory_beyond_the_limit_fails(world: World) -> None:
    policy = replace(world.policy, memory_bytes=256 << 20)

    small = world.py("b = bytearray(32 << 20); print('ok')", policy=policy)
    big = world.py("b = bytearray(512 << 20); print('ok')", policy=policy)

    assert small.stdout.strip() == "ok", small.stderr
    assert big.returncode != 0 and "MemoryError" in big.stderr


# Ordinary work


def test_ordinary_commands_work(world: World) -> None:
    (world.workspace / "main.py").write_text("def answer():\n    return 42\n")
    rg = shutil.which("rg") or shutil.which("rg", path=os.path.dirname(PYTHON))
    policy = world.policy
    if rg:
        policy = replace(policy, readable=(*policy.readable, os.path.dirname(os.path.realpath(rg))))
    script = (
        "set -e\n"
        "git init -q . && git add main.py && git -c user.name=t -c user.email=t@t commit -qm one\n"
        "git log --format=%s\n"
        f'{PYTHON} -c \'import main, subprocess; print(main.answer(), flush=True); subprocess.run(["echo", "child"])\'\n'
        "yes | head -1 >/dev/null; echo pipe ${PIPESTATUS[0]}\n"  # SIGPIPE kills yes, as outside
        "ls /usr/bin >/dev/null && echo listed\n" + (f"{rg} -n answer main.py\n" if rg else "")
    )

    done = world.sh(script, policy=policy)

    assert done.returncode == 0, done.stderr
    expected = ["one", "42", "child", "pipe 141", "listed"] + (["1:def answer():"] if rg else [])
    assert done.stdout.splitlines() == expected


def test_the_command_gets_the_environment_it_was_given(world: World) -> None:
    done = world.run("env", env={"PATH": "/usr/bin:/bin", "LANG": "C", "ODD": "a=b"})

    assert sorted(done.stdout.splitlines()) == ["LANG=C", "ODD=a=b", "PATH=/usr/bin:/bin"]


def test_a_program_outside_the_readable_trees_is_refused_with_the_reason(world: World) -> None:
    program = world.elsewhere / "tool"
    program.write_text("#!/bin/sh\necho ran\n")
    program.chmod(0o755)

    done = world.run(str(program))

    assert done.returncode == 126
    assert done.stderr.strip() == f"sandbox: cannot run {program}: Permission denied"


@pytest.mark.parametrize("instructions", [None, b"not instructions\0"])
def test_the_launcher_fails_closed_without_good_instructions(
    world: World, instructions: bytes | None
) -> None:
    fd = os.memfd_create("instructions")
    try:
        if instructions is not None:
            os.write(fd, instructions)
        spec = f"{fd}:0:{len(instructions)}" if instructions is not None else "999:0:16"
        done = subprocess.run(
            [PYTHON, "-I", "-S", landlock.LAUNCHER, spec, "echo", "ran"],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(fd)

    assert done.returncode == 126 and "ran" not in done.stdout
    assert done.stderr.startswith("sandbox: ") and done.stderr.count("\n") == 1
