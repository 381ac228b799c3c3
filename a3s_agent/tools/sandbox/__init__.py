"""The OS sandbox every process a tool starts runs in: the workspace writable, secrets unreadable,
the network off (unless the operator allows it), the server invisible.

One place wraps every spawn: a tool call's containment scope (tools/containment.py) opens a
CallSandbox for the call's Place, puts its HOME and TMPDIR into the environment and spawns the argv
`command` gives. The policy (policy.py) is rendered by one mechanism, chosen once per server:
bubblewrap (bwrap.py) or Landlock + seccomp (landlock.py); `auto` takes the first that works here.
When none works and the operator did not choose `off`, every spawn is refused (SandboxUnavailable,
saying why and how to enable one): never a silent fallback to running unsandboxed.

Each call gets a scratch directory as TMPDIR (removed when the call ends) and the HOME of its
session (kept with the session, so caches and dotfiles persist); both live in the server's data
dir, the only parts of it a command can see.

With a network of `allow:host,...` (the operator's --sandbox-network, narrowed by an Initialize,
or an MCP server's or skill's own, given by the operator) each call gets a grant of the server's
proxy (proxy.py): its credential in HTTP(S)_PROXY, and under bwrap the listener its launcher made
in the command's network namespace served for the call. Landlock cannot keep such a command to
the proxy (its TCP rules know ports, not addresses), so there `allow:` is refused.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import hashlib
import itertools
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ...base import metrics
from ...base.allow_list import AllowList
from ...config import SandboxSettings, parse_sandbox_network, sandbox_settings
from . import bwrap, landlock
from .policy import Grounds, Launch, Network, SandboxPolicy, for_call, server_grounds, within
from .seccomp import Unsupported, program

if TYPE_CHECKING:  # the proxy is imported once a call may use it
    from .proxy import Grant, SandboxProxy

log = logging.getLogger(__name__)

HOW_TO_ENABLE = (
    "To sandbox commands, let bwrap create user namespaces (sysctl kernel.unprivileged_userns_clone=1"
    " and user.max_user_namespaces > 0; in a container, a seccomp profile that allows them), or run"
    " on a kernel with Landlock (Linux 5.13+, landlock in the lsm= boot list); or start the server"
    " with --sandbox off (A3S_SANDBOX=off) to run commands unsandboxed"
)
LOADER_VARIABLES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
    }
)
"""Besides every LD_* name: the variables glibc drops for setuid programs (its unsecvars.h, but
TMPDIR), since they make the loader or the C library load code or write files. The mechanism
(the shell joining the cgroup, bwrap, the launcher) is spawned without them, and the command
gets them as it starts: they act only inside the sandbox."""
SCRATCH = "scratch"
HOMES = "homes"
_NETWORKS: dict[str, Network] = {"off": "off", "on": "on", "allow": "proxy"}
"""The operator's network setting -> the policy's (allow: through the server's proxy)."""
_SESSION_HOME_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


class SandboxUnavailable(PermissionError):
    """No sandbox mechanism works here and the operator did not opt out: nothing may be spawned."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.EPERM, f"sandbox: {reason}")


def network_problem(mechanism: str, network: str) -> str | None:
    """Why `network` cannot be given under `mechanism` (None: it can)."""
    if mechanism != "landlock" or not network.startswith("allow:"):
        return None
    return (
        f"the network {network} needs bwrap, and Landlock sandboxes commands here: Landlock's TCP"
        " rules know ports, not addresses, so a command could reach any address on the proxy's"
        " port. Let bwrap create user namespaces (sysctl kernel.unprivileged_userns_clone=1 and"
        " user.max_user_namespaces > 0; in a container, a seccomp profile that allows them), or"
        " choose --sandbox-network on (the host's network) or off"
    )


@dataclass(frozen=True)
class Place:
    """Where one call's commands work: the workspace they may write, the session whose HOME they get
    (None: the server's own), files the server put out for them to read (a script, a skill's
    directory) and further trees one of our own programs must write (git: the repository's git
    directory, when it lies outside the workspace)."""

    workspace: Path
    session_id: str | None = None
    readable: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    network: str = ""
    """The network of an MCP server or skill the operator gave one (off, on, allow:...; config
    parse_sandbox_network): it replaces the server's. "": the server's, as Initialize narrowed it."""


class Sandbox:
    """A server's sandbox: the operator's settings, the mechanism chosen, where HOMEs and scratch
    directories live. `also_read` are further trees commands may read (the operator's skill
    directories); `workspaces` lists every session's workspace (resolved): the others' are hidden
    from a call; `narrowing` is the network an Initialize asked for (config.custom), which may only
    narrow the operator's."""

    def __init__(
        self,
        settings: SandboxSettings,
        *,
        data_dir: Path | None = None,
        secret_files: Iterable[Path] = (),
        also_read: Iterable[Path] = (),
        workspaces: Callable[[], Iterable[str]] = tuple,
        narrowing: Callable[[], str] = str,
    ) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.secret_files = tuple(secret_files)
        self.also_read = tuple(also_read)
        self.workspaces = workspaces
        self.narrowing = narrowing
        self._chosen: tuple[str, str | None] | None = None
        self._grounds: Grounds | None = None
        self._root: Path | None = None
        self._homes_made: set[Path] = set()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._proxy: SandboxProxy | None = None

    # --- the mechanism ------------------------------------------------------------------------

    def _choose(self) -> tuple[str, str | None]:
        """(mechanism, None) or ("", why none works), found once."""
        if self._chosen is None:
            self._chosen = _choose(self.settings.mechanism)
        return self._chosen

    @property
    def mechanism(self) -> str:
        """bwrap, landlock, off (the operator's choice), or "" when none works (commands refused)."""
        return self._choose()[0]

    @property
    def problem(self) -> str | None:
        """Why no mechanism works (None when one does, or the sandbox is off)."""
        return self._choose()[1]

    def network(self) -> str:
        """The network commands get: the operator's, narrowed by Initialize's (off, on, allow:...)."""
        wanted = self.narrowing()
        if not wanted:
            return self.settings.network_text
        try:
            return self.narrowed(wanted)
        except ValueError:  # checked when Initialize gave it: never wider, whatever happened since
            return "off"

    def narrowed(self, wanted: str) -> str:
        """`wanted` (an Initialize's network) as the operator's narrowed to it; ValueError naming
        what is wider, or why it cannot be given here."""
        network = narrowed(self.settings, wanted)
        problem = network_problem(self.mechanism, network)
        if problem:
            raise ValueError(problem)
        return network

    def describe(self) -> dict[str, str]:
        """What HealthCheck and GetCapabilities show of it."""
        details = {
            "mechanism": self.mechanism or "unavailable",
            "requested": self.settings.mechanism,
            "network": self.network(),
            "read": os.pathsep.join(map(str, self.settings.read)),
            "write": os.pathsep.join(map(str, self.settings.write)),
            "deny": os.pathsep.join(map(str, self.settings.deny)),
            "memory_bytes": str(self.settings.memory_bytes or ""),
        }
        if self.problem:
            details["problem"] = self.problem
        if self.weakness:
            details["weakness"] = self.weakness
        return details

    @property
    def weakness(self) -> str | None:
        """What the chosen mechanism cannot hold on this kernel (None: all it can hold anywhere)."""
        return landlock.weakness() if self.mechanism == "landlock" else None

    # --- the server's lifetime ----------------------------------------------------------------

    def start(self) -> None:
        """At the server's start: choose the mechanism (logged), clear what crashed calls left."""
        mechanism, problem = self._choose()
        if mechanism == "off":
            log.warning(
                "tool processes run UNSANDBOXED (--sandbox off): a command can read, write and reach"
                " whatever the server's user can"
            )
        elif problem:
            log.error("no sandbox works here, so every tool that starts a process refuses: %s", problem)
        else:
            log.info("tool processes sandboxed by %s, network %s", mechanism, self.network())
            if self.weakness:
                log.warning("the sandbox is weaker here: %s", self.weakness)
            refused = network_problem(mechanism, self.settings.network_text)
            if refused:
                log.error("every tool that starts a process refuses: %s", refused)
        self._clear_scratch()

    async def stop(self) -> None:
        """At the server's stop: the proxy's port and connections close."""
        if self._proxy is not None:
            await self._proxy.close()
            self._proxy = None

    def grant(self, label: str, network: str) -> Grant:
        """A credential of the server's proxy for a call whose network is `network` (allow:...),
        letting it reach those hosts; the proxy is made by the first (in the event loop's thread)."""
        if self._proxy is None:
            from ..fetcher import private_allowed
            from .proxy import SandboxProxy

            self._proxy = SandboxProxy(None, allow_private=private_allowed())  # each grant has its list
        return self._proxy.grant(label, _allow_list(network))

    def _clear_scratch(self) -> None:
        """Remove the scratch directories of calls whose server is gone (pid-named)."""
        scratch = self.root() / SCRATCH
        with contextlib.suppress(OSError):
            for entry in os.scandir(scratch):
                pid = entry.name.partition("-")[0]
                if pid.isdigit() and not _alive(int(pid)):
                    shutil.rmtree(entry.path, ignore_errors=True)

    def root(self) -> Path:
        """Where HOMEs and scratch directories live: the data dir, else a directory of this process."""
        if self._root is None:
            if self.data_dir is not None:
                self._root = Path(os.path.realpath(self.data_dir))
            else:
                self._root = Path(os.path.realpath(_process_directory()))
        return self._root

    def forget_session(self, session_id: str) -> None:
        """The session is gone: its HOME goes too (on a worker thread; it may be big)."""
        home = self.home(session_id)
        self._homes_made.discard(home)
        threading.Thread(target=shutil.rmtree, args=(home,), kwargs={"ignore_errors": True}).start()

    # --- calls --------------------------------------------------------------------------------

    def grounds(self) -> Grounds:
        if self._grounds is None:
            settings = self.settings
            network = _NETWORKS[settings.network]
            self._grounds = server_grounds(
                read=(*settings.read, *self.also_read),
                write=settings.write,
                deny=settings.deny,
                secret_files=self.secret_files,
                data_dir=self.data_dir,
                network=network,
                proxy_port=None,  # SEAM(s-proxy): the allow-list proxy's loopback port (proxy.py)
                memory_bytes=settings.memory_bytes,
            )
        return self._grounds

    def home(self, session_id: str | None) -> Path:
        """The HOME of a session's commands (of the server's own calls for None)."""
        if session_id is None:
            return self.root() / HOMES / "server"
        safe = set(session_id) <= _SESSION_HOME_NAME_CHARS and session_id not in (".", "..")
        name = session_id if safe else hashlib.sha256(session_id.encode()).hexdigest()
        return self.root() / HOMES / "sessions" / name

    def open(self, place: Place) -> CallSandbox:
        """The sandbox of one call's processes."""
        return CallSandbox(self, place)

    def made_home(self, home: Path) -> None:
        if home not in self._homes_made:
            home.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._homes_made.add(home)

    def scratch(self) -> Path:
        """A new scratch directory for a call (the caller removes it)."""
        path = self.root() / SCRATCH / f"{os.getpid()}-{next(self._numbers)}"
        try:
            path.mkdir(mode=0o700)
        except FileNotFoundError:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.mkdir(mode=0o700)
        except FileExistsError:  # left by a crashed server whose pid this one got
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(mode=0o700)
        return path


class CallSandbox:
    """One call's sandbox: its HOME, its scratch TMPDIR, the launch of each process it starts."""

    def __init__(self, owner: Sandbox, place: Place) -> None:
        self.owner = owner
        self.place = place
        self.mechanism = owner.mechanism
        self.network = place.network or owner.network()
        self.scratch: Path | None = None
        self.home: Path | None = None
        self.launches: list[Launch] = []
        self.grant: Grant | None = None
        self._serving: list[asyncio.Task[None]] = []
        self._loader: dict[str, str] = {}
        self.last_policy: SandboxPolicy | None = None  # what the last process spawned ran under

    def denial(self, output: str, cwd: Path) -> str:
        """Why the sandbox refused what a failed process (run in `cwd`) wrote it was refused (""
        when its output shows no refusal of the sandbox's): denial_hint."""
        hint = denial_hint(output, self.mechanism, self.network, self.last_policy, str(cwd))
        if hint:
            metrics.add(metrics.SANDBOX_DENIALS, 1, {"a3s.tool.sandbox": self.mechanism})
        return hint

    @property
    def memory_bytes(self) -> int | None:
        """The memory each process of the call may use (the cgroup's memory.max or RLIMIT_AS)."""
        return self.owner.settings.memory_bytes

    @property
    def active(self) -> bool:
        """Whether its processes run sandboxed (or are refused): anything but --sandbox off."""
        return self.mechanism != "off"

    @property
    def refused(self) -> Sequence[str]:
        """What the proxy refused the call's connections (the latest few), as they happen."""
        return self.grant.refused if self.grant is not None else ()

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment to spawn with: `env` with the call's HOME and TMPDIR (and the toolchain
        homes that defaulted to the server's HOME, policy.TOOLCHAIN_HOMES), with a network of
        allow:... the proxy's variables naming its grant, and without the loader's variables, which
        `command` sets for the command only (unchanged under --sandbox off)."""
        if not self.active:
            return dict(env)
        if self.scratch is None:
            self.home = self.owner.home(self.place.session_id)
            self.owner.made_home(self.home)
            self.scratch = self.owner.scratch()
        if self.grant is None and self.network.startswith("allow:") and not self._problem():
            whose = (
                f"session {self.place.session_id}" if self.place.session_id else "a call without a session"
            )
            self.grant = self.owner.grant(whose, self.network)
        proxy = self.grant.env() if self.grant is not None else {}
        toolchains = dict(self.owner.grounds().variables)
        spawned = {**toolchains, **env, "HOME": str(self.home), "TMPDIR": str(self.scratch), **proxy}
        self._loader = {name: spawned.pop(name) for name in list(spawned) if _loader_variable(name)}
        return spawned

    def _problem(self) -> str | None:
        """Why this call's processes may not be spawned (None: they may)."""
        if not self.mechanism:
            return f"no sandbox works here ({self.owner.problem}). {HOW_TO_ENABLE}"
        return network_problem(self.mechanism, self.network)

    def policy(self) -> SandboxPolicy:
        if self.scratch is None or self.home is None:
            self.environment({})
        assert self.scratch is not None and self.home is not None
        workspace = _real(self.place.workspace)
        others = [w for w in self.owner.workspaces() if w != workspace]
        return for_call(
            self.owner.grounds(),
            workspace=workspace,
            home=str(self.home),
            scratch=str(self.scratch),
            readable=self.place.readable,
            writable=self.place.writable,
            others=others,
            network=_NETWORKS[self.network.partition(":")[0]],
            proxy_port=self.grant.port if self.grant is not None else None,
        )

    def command(self, argv: Sequence[str]) -> Launch:
        """How to spawn `argv` in this call's sandbox; SandboxUnavailable when none works here."""
        mechanism = self.mechanism
        _record(Ran(mechanism or "unavailable", self.network, self.refused))
        if mechanism == "off":
            return Launch(list(argv))
        problem = self._problem()
        if problem:
            raise SandboxUnavailable(problem)
        rules = self.last_policy = self.policy()
        bpf = _seccomp(rules.network)
        if mechanism == "bwrap":
            launch = bwrap.command(argv, rules, bpf, self._loader)
        else:
            launch = landlock.command(argv, rules, bpf, self._loader)
        self.launches.append(launch)
        return launch

    def spawned(self) -> None:
        """The process runs: the parent's copies of the descriptors it inherited are closed, and
        the listener it hands over (network allow:... under bwrap) is awaited, to be served."""
        for launch in self.launches:
            if not launch.closed and launch.handover is not None and self.grant is not None:
                serving = asyncio.get_running_loop().create_task(
                    self.grant.serve_handed_over(launch.handover)
                )
                self._serving.append(serving)
            launch.close()

    def close(self) -> None:
        """The call is over (its processes killed): its grant ends (with its connections) and its
        scratch directory goes."""
        self.spawned()
        for launch in self.launches:
            if launch.handover is not None:
                launch.handover.close()
        for serving in self._serving:
            serving.cancel()
        if self.grant is not None:
            self.grant.close()
        scratch, self.scratch = self.scratch, None
        if scratch is None:
            return
        try:
            scratch.rmdir()  # the common case: the command left nothing there
        except FileNotFoundError:
            pass
        except OSError:
            threading.Thread(target=shutil.rmtree, args=(scratch,), kwargs={"ignore_errors": True}).start()


_QUOTES = "'\"`\u2018\u2019"  # around a path in messages: ASCII, and coreutils' typographic ones
_READ_ONLY = re.compile(f"(/[^\\s:{_QUOTES}]*)[{_QUOTES}]?: Read-only file system")
_NO_NETWORK = re.compile(
    r"Network is unreachable|Could not resolve host|Temporary failure in name resolution"
    r"|Name or service not known|nodename nor servname|getaddrinfo|Connection refused"
    r"|(?:connect|socket|urlopen)[^\n]*Operation not permitted"  # the seccomp filter refusing socket()
)


_DENIED = re.compile(f"([^\\s:{_QUOTES}]+)[{_QUOTES}]?: Permission denied")
_WRITE_ONLY_IN = "commands may write only in the workspace, $TMPDIR and $HOME"


def denial_hint(
    output: str, mechanism: str, network: str, policy: SandboxPolicy | None = None, cwd: str = "/"
) -> str:
    """A sentence for the model when a failed command's output shows the sandbox refusing it ("":
    none shows): a write outside the writable trees, a connection with the network off. Landlock
    refuses with EACCES, which a file's mode gives too: `policy` (the call's, run in `cwd`) tells
    which paths it refused."""
    if mechanism not in ("bwrap", "landlock"):
        return ""
    written = _READ_ONLY.search(output)
    if written:
        return f"sandbox: writing {written.group(1)} is outside the workspace; {_WRITE_ONLY_IN}"
    if mechanism == "landlock" and policy is not None:
        for denied in _DENIED.finditer(output):
            hint = _landlock_denial(os.path.normpath(os.path.join(cwd, denied.group(1))), policy)
            if hint:
                return hint
    if network == "off" and _NO_NETWORK.search(output):
        return "sandbox: the network is off for commands (the operator's --sandbox-network)"
    return ""


def _landlock_denial(path: str, policy: SandboxPolicy) -> str:
    """Why Landlock refused `path` (absolute, as the command named it), if `policy` refuses it."""
    if any(within(path, extra) for extra in (*landlock.EXTRA_READABLE, *landlock.EXTRA_WRITABLE)):
        return ""  # /proc, the devices: the kernel's own checks (another process's environ...)
    trees = (*policy.readable, *policy.writable)
    if any(
        within(path, h) and not any(t != h and within(t, h) and within(path, t) for t in trees)
        for h in policy.hidden
    ):
        return f"sandbox: {path} is hidden from commands"
    if any(within(path, t) for t in policy.writable):
        # A directory holding a hidden path has no rule of its own (landlock.py): the entry refused
        # is that directory (listed) or a new one in it (created).
        holder = path if os.path.isdir(path) else "" if os.path.lexists(path) else os.path.dirname(path)
        if holder and any(within(h, holder) and h != holder for h in policy.hidden):
            return (
                f"sandbox: under Landlock nothing can be listed, created, removed or renamed directly"
                f" in {holder}, which holds paths hidden from commands; work in a subdirectory"
            )
        return ""  # the file's own mode refused it, not the sandbox
    if any(within(path, t) for t in policy.readable):
        return f"sandbox: writing {path} is outside the workspace; {_WRITE_ONLY_IN}"
    return f"sandbox: {path} is outside what commands may see; {_WRITE_ONLY_IN}"


def narrowed(settings: SandboxSettings, wanted: str) -> str:
    """The network `wanted` (off, on, allow:host,...) if it is within the operator's; ValueError
    naming what is wider otherwise. off is within everything, allow:X within on, allow:Y within
    allow:X when X lets through every host and port Y does (`a.example.com` within `*.example.com`,
    `host:8443` within `host:8443,host`)."""
    mode, hosts = parse_sandbox_network(wanted)
    allowed = settings.network
    if mode == "off" or allowed == "on":
        return "off" if mode == "off" else (f"allow:{','.join(hosts)}" if mode == "allow" else "on")
    if mode == "allow" and allowed == "allow":
        network = f"allow:{','.join(hosts)}"
        wider = _allow_list(network).beyond(_allow_list(settings.network_text))
        if not wider:
            return network
        listed = ", ".join(entry.text for entry in wider)
        raise ValueError(f"{listed}: not within the operator's {settings.network_text}")
    raise ValueError(f"{wanted!r} is wider than the operator's {settings.network_text}")


def _choose(requested: str) -> tuple[str, str | None]:
    if requested == "off":
        return "off", None
    problems = []
    if requested in ("auto", "bwrap"):
        problem = bwrap.problem()
        if problem is None:
            return "bwrap", None
        problems.append(f"bwrap: {problem}")
    if requested in ("auto", "landlock"):
        problem = landlock.problem()
        if problem is None:
            return "landlock", None
        problems.append(f"landlock: {problem}")
    return "", "; ".join(problems)


_programs: dict[Network, bytes] = {}


def _seccomp(network: Network) -> bytes:
    """The seccomp program for `network`, built once per network (seccomp.py); SandboxUnavailable
    on an architecture it does not know."""
    if network not in _programs:
        try:
            _programs[network] = program(network)
        except Unsupported as exc:
            raise SandboxUnavailable(str(exc)) from exc
    return _programs[network]


def _loader_variable(name: str) -> bool:
    return name.startswith("LD_") or name in LOADER_VARIABLES


@lru_cache(maxsize=64)
def _allow_list(network: str) -> AllowList:
    """The hosts of a network `allow:...` (checked by config.parse_sandbox_network already)."""
    return AllowList.parse(network.partition(":")[2])


@lru_cache(maxsize=256)
def _real(path: Path) -> str:
    """A workspace resolved (each once: workspaces are few)."""
    return os.path.realpath(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_process_root: str | None = None


def _process_directory() -> str:
    """A directory of this process's own for HOMEs and scratch when no server (data dir) is active."""
    global _process_root
    if _process_root is None:
        _process_root = tempfile.mkdtemp(prefix="a3s-sandbox-")
        atexit.register(shutil.rmtree, _process_root, ignore_errors=True)
    return _process_root


# --- which sandbox ran a tool's processes (its result's metadata) ---------------------------------


@dataclass(frozen=True)
class Ran:
    """How one process was started: the mechanism (or "unavailable"), its network, and what the
    proxy refused its call's connections (filled in as it happens)."""

    mechanism: str
    network: str
    refused: Sequence[str] = ()


_ran: ContextVar[list[Ran] | None] = ContextVar("a3s_sandbox_ran", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[Ran]]:
    """Collects how every process started inside ran (tasks started inside too)."""
    seen: list[Ran] = []
    token = _ran.set(seen)
    try:
        yield seen
    finally:
        _ran.reset(token)


def _record(ran: Ran) -> None:
    seen = _ran.get()
    if seen is not None:
        seen.append(ran)


# --- the process-wide state ------------------------------------------------------------------------

_active: list[Sandbox] = []
_default: Sandbox | None = None


def current() -> Sandbox:
    """The running server's sandbox; outside one, a sandbox of the environment's settings."""
    global _default
    if _active:
        return _active[-1]
    if _default is None:
        _default = Sandbox(sandbox_settings(os.environ))
    return _default


def activate(sandbox: Sandbox) -> Sandbox:
    """At server start: every tool process is sandboxed by `sandbox` until `deactivate`."""
    sandbox.start()
    _active.append(sandbox)
    return sandbox


def deactivate(sandbox: Sandbox) -> None:
    if sandbox in _active:
        _active.remove(sandbox)
