"""Running git so that neither the repository nor the model can make it run a command.

A repository's own configuration (.git/config, the files it includes, a worktree config)
cannot be switched off, and many of its keys name programs git runs: hooks, core.fsmonitor,
filter and diff drivers, gpg, pagers, editors, transports. So every git command runs with:

- an environment that skips the system and global configuration files, never prompts,
  pages or opens an editor, and allows no transport (`GIT_ALLOW_PROTOCOL` empty,
  `GIT_NO_LAZY_FETCH`); the operator's identity, `safe.directory` and excludes file are
  carried over from those files as `-c` settings;
- fixed `-c` settings switching off hooks, fsmonitor, signing, automatic gc/maintenance,
  credential helpers and git started inside submodules;
- per repository, `-c` settings emptying the commands of every filter driver its
  configuration names (found with `git config --list --includes`, which runs nothing).

The commands themselves (git.py) add `--no-ext-diff --no-textconv --ignore-submodules=dirty`
to diffs (an empty textconv is not "no textconv" to git) and keep `git add`/`git commit`
pathspecs off submodules. A key git could run that cannot be neutralised is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from .process import find_binary, run_process
from .registry import ToolFailure
from .sandbox import Place

GIT_TIMEOUT_S = 120.0
_MAX_OUTPUT_BYTES = 64_000_000

_SKIP_OPERATOR_CONFIG = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
_QUIET_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",  # git treats "cat" as no pager at all
    "GIT_EDITOR": ":",  # git treats ":" as an editor that is not run
    "GIT_SEQUENCE_EDITOR": ":",
    "GIT_ALLOW_PROTOCOL": "",  # overrides protocol.<name>.allow: no transport, no lazy fetch
    "GIT_NO_LAZY_FETCH": "1",  # git >= 2.44 and 2.39.4+: no fetch of a partial clone's missing objects
}
FIXED_SETTINGS: tuple[str, ...] = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",  # no hook is found under it
    "core.pager=cat",
    "core.askPass=",
    "credential.helper=",  # an empty value clears the list of helpers
    "protocol.allow=never",
    "commit.gpgSign=false",
    "log.showSignature=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "diff.submodule=short",
    "diff.ignoreSubmodules=dirty",  # git commit: no git started inside submodules
    "status.submoduleSummary=false",
    "submodule.recurse=false",
)
_FILTER_COMMANDS = ("clean", "smudge", "process")
# Values the operator's system/global configuration contributes although git does not read it.
_CARRIED_KEYS = ("user.name", "user.email", "core.excludesfile")
_OPERATOR_SCOPES = ("system", "global")
_REFUSED_SECTIONS = {"hook": "config-based hooks (hook.*) would run commands"}


@dataclass(frozen=True)
class _Entry:
    scope: str
    key: str  # section and name lower case, subsection as written
    value: str

    @property
    def section(self) -> str:
        return self.key.partition(".")[0]

    @property
    def subsection(self) -> str | None:
        _, dot, rest = self.key.partition(".")
        head, dot, _ = rest.rpartition(".")
        return head if dot else None


def _parse_listing(raw: str) -> list[_Entry]:
    """`git config --list -z --show-scope`: `scope NUL key LF value NUL` per entry."""
    items = raw.split("\0")
    entries = []
    for scope, item in zip(items[0::2], items[1::2], strict=False):
        key, _, value = item.partition("\n")
        entries.append(_Entry(scope, key, value))
    return entries


def _driver_settings(entries: list[_Entry]) -> list[str]:
    """Empty commands and required=false for every filter driver named anywhere in the config."""
    drivers = sorted({e.subsection for e in entries if e.section == "filter" and e.subsection is not None})
    settings = []
    for driver in drivers:
        if "=" in driver or "\n" in driver:
            raise ToolFailure(
                f"refusing to run git: the repository configures filter driver {driver!r}, "
                "a name that git's -c cannot override"
            )
        settings += [f"filter.{driver}.{name}=" for name in _FILTER_COMMANDS]
        settings.append(f"filter.{driver}.required=false")
    return settings


def _refuse_unneutralisable(entries: list[_Entry]) -> None:
    for entry in entries:
        reason = _REFUSED_SECTIONS.get(entry.section)
        if reason and entry.scope not in _OPERATOR_SCOPES:
            raise ToolFailure(
                f"refusing to run git: the repository's configuration sets {entry.key}; {reason}"
            )


def _carried_settings(entries: list[_Entry]) -> list[str]:
    """The operator's identity, excludes file and safe.directory, which the repository's own
    configuration still overrides (safe.directory counts only from the operator's files)."""
    own = {e.key.lower() for e in entries if e.scope not in _OPERATOR_SCOPES}
    operator = [e for e in entries if e.scope in _OPERATOR_SCOPES]
    carried = {e.key.lower(): e.value for e in operator if e.key.lower() in _CARRIED_KEYS}
    settings = [f"{key}={value}" for key, value in carried.items() if key not in own]
    return settings + [f"safe.directory={e.value}" for e in operator if e.key.lower() == "safe.directory"]


def repository_settings(listing: str) -> list[str]:
    """The `-c` settings (besides FIXED_SETTINGS) for a repository with this config listing."""
    entries = _parse_listing(listing)
    _refuse_unneutralisable(entries)
    return _driver_settings(entries) + _carried_settings(entries)


@dataclass(frozen=True)
class SafeGit:
    """git for one repository: fixed and per-repository `-c` settings, a controlled environment."""

    executable: str
    cwd: Path
    session_env: Mapping[str, str]
    place: Place
    settings: tuple[str, ...] = FIXED_SETTINGS
    protocols: str = ""  # the transports git may use (GIT_ALLOW_PROTOCOL): none but for a clone

    async def execute(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        operator_config: bool = False,
        stdin: bytes | None = None,
    ) -> tuple[int, str, str]:
        """Exit status, stdout and stderr of `git args` (given `stdin`); a timeout or overflow is a
        ToolFailure. `operator_config` lets git read the system and global files (only to list them)."""
        argv = [self.executable, "--no-pager"]
        for setting in self.settings:
            argv += ["-c", setting]
        extra = {
            "LC_ALL": "C",
            "LANGUAGE": "C",
            **self.session_env,
            **(env or {}),
            **_QUIET_ENV,
            "GIT_ALLOW_PROTOCOL": self.protocols,
            **({} if operator_config else _SKIP_OPERATOR_CONFIG),
        }
        place = self.place
        operator_global = _operator_global_config() if operator_config else None
        if operator_global is not None:  # commands get a HOME of their own: name the operator's file
            extra["GIT_CONFIG_GLOBAL"] = str(operator_global)
            place = replace(place, readable=(*place.readable, operator_global))
        result = await run_process(
            [*argv, *args],
            cwd=self.cwd,
            place=place,
            extra_env=extra,
            timeout_s=GIT_TIMEOUT_S,
            stdin=stdin,
            max_output_bytes=_MAX_OUTPUT_BYTES,
        )
        if result.timed_out:
            raise ToolFailure(
                f"git {args[0]} timed out after {GIT_TIMEOUT_S:.0f} s", exit_code=result.exit_code
            )
        if result.truncated:
            raise ToolFailure(
                f"git {args[0]} wrote more than {_MAX_OUTPUT_BYTES} bytes; narrow it with a path"
            )
        return result.exit_code, result.stdout, result.stderr

    async def for_repository(self) -> SafeGit:
        """This git with the settings the configuration of the repository around `cwd` calls for.

        The listing reads the operator's files too, so it sees the repository's own configuration
        exactly when the later commands will (a safe.directory there lets git read it)."""
        status, out, err = await self.execute(
            "config", "--list", "-z", "--includes", "--show-scope", operator_config=True
        )
        if status != 0:
            raise ToolFailure(f"git cannot read the repository's configuration: {err.strip()}")
        return replace(self, settings=FIXED_SETTINGS + tuple(repository_settings(out)))

    def at(self, cwd: Path) -> SafeGit:
        return replace(self, cwd=cwd)

    def writing(self, directory: Path) -> SafeGit:
        """This git, its sandbox letting it write `directory` too (a temporary index, a patch file)."""
        return replace(self, place=replace(self.place, writable=(*self.place.writable, directory)))


def base_git(cwd: Path, session_env: Mapping[str, str], place: Place | None = None) -> SafeGit:
    """git in `cwd`, sandboxed for `place` (default: `cwd` is the workspace) widened by what the
    repository holding `cwd` needs (repository_trees), with the network off (it has no transport)."""
    executable = find_binary("git")
    if executable is None:
        raise ToolFailure("git is not installed on this server")
    place = place or Place(cwd)
    readable, writable = repository_trees(cwd)
    place = replace(
        place, readable=(*place.readable, *readable), writable=(*place.writable, *writable), network="off"
    )
    return SafeGit(executable, cwd, session_env, place)


async def shallow_clone(
    url: str, target: Path, *, readable: tuple[Path, ...] = (), network: str = "off"
) -> None:
    """Clone the default branch of `url` (https, http or file), its last commit only, into `target`
    (which must not exist yet), with no hooks, templates, submodules, tags or symlinks (a link is
    checked out as a plain file holding its target); ToolFailure with git's reason. `readable` is
    what the sandbox lets git read besides `target`'s directory (a file:// repository)."""
    executable = find_binary("git")
    if executable is None:
        raise ToolFailure("git is not installed on this server")
    place = Place(target.parent, readable=readable, network=network)
    git = SafeGit(executable, target.parent, {}, place, protocols=_CLONE_PROTOCOLS)
    status, _, err = await git.execute(
        "clone", "--depth=1", "--single-branch", "--no-tags", "--no-recurse-submodules", "--template=",
        "--config=core.symlinks=false", "--config=core.hooksPath=/dev/null", "--", url, str(target),
    )  # fmt: skip
    if status != 0:
        raise ToolFailure(f"git clone failed: {err.strip()[-400:]}")


_CLONE_PROTOCOLS = "https:http:file"  # never ext:: (a command) nor ssh
_GITDIR_FILE_BYTES = 4096


def _operator_global_config() -> Path | None:
    """The global git configuration of the user running the server: ~/.gitconfig, else
    $XDG_CONFIG_HOME/git/config (None when neither exists)."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    for path in (Path(os.path.expanduser("~/.gitconfig")), Path(xdg) / "git" / "config"):
        if path.is_file():
            return path.resolve()
    return None


def repository_trees(directory: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """What git needs to see besides `directory`, for the repository holding it (the first `.git`
    on the way up): its work tree when that lies above (readable), and its git directory, with the
    common one of a linked worktree or submodule (writable: commits go there). Only git itself
    (this module: no hooks, filters or other programs of the repository) gets these; the hidden
    paths of the sandbox stay hidden inside them."""
    for top in (directory, *directory.parents):
        dot_git = top / ".git"
        if dot_git.is_dir():
            return ((top,) if top != directory else ()), (dot_git,)
        if os.path.isfile(dot_git):
            git_dir = _linked_git_dir(dot_git)
            if git_dir is None:
                return (), ()
            common = _linked_git_dir(git_dir / "commondir", prefix="")
            return ((top,) if top != directory else ()), tuple(d for d in (git_dir, common) if d is not None)
        if os.path.lexists(dot_git):
            return (), ()
    return (), ()


def _linked_git_dir(pointer: Path, prefix: str = "gitdir:") -> Path | None:
    """The directory a `.git` file (`gitdir: PATH`) or a `commondir` file (`PATH`) names, relative
    to the file's directory; None when unreadable or not a directory."""
    try:
        with open(pointer, "rb") as file:
            text = file.read(_GITDIR_FILE_BYTES).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    if not text.startswith(prefix):
        return None
    named = (pointer.parent / text[len(prefix) :].strip()).resolve()
    return named if named.is_dir() else None
