"""A workspace's checkpoints as trees of a shadow git repository, kept outside the workspace.

The repository (`<root>/git`) is ours: git runs with `--git-dir` there and `--work-tree` the
workspace, through safe_git (no hooks, filters or other programs, no operator configuration), in
a sandbox that may read the workspace and write only `<root>`. So the user's own `.git` (index,
branches, stash, hooks) is never read as a repository nor touched, and a workspace needs none.

Each snapshot goes through an index file of its own (one per session, `<root>/index/`), so `git
add -A` hashes only what changed since that session's last snapshot; when `ls-files` finds
nothing changed the last tree is reused without writing anything. `.gitignore` files are
honoured; files larger than the cap are left out (an exclude file per index) and reported as
skipped. Trees are kept by refs (`refs/a3s/trees/<tree>`) and dropped when no checkpoint names them;
the trees of harness runs' change sets are held by refs of their own (`refs/a3s/held/<name>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

from .atomic import copy_file, replace_file
from .process import find_binary
from .registry import ToolFailure
from .safe_git import FIXED_SETTINGS, SafeGit
from .sandbox import Place

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
MAX_DIFF_BYTES = 4 * 1024 * 1024
LOCK_WAIT_S = 120.0  # a git command's own bound (safe_git), and then some
_OWN_SETTINGS = (
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.quotePath=false",
    "core.symlinks=true",
    "core.fileMode=true",
    "core.untrackedCache=true",  # directories unchanged since the last snapshot are not read again
    "advice.addEmbeddedRepo=false",
    "index.version=4",
)
_TREE_REFS = "refs/a3s/trees"
_HELD_REFS = "refs/a3s/held"
_STATUS = {"A": "added", "D": "deleted", "M": "modified", "T": "type_changed"}


class ShadowUnavailable(Exception):
    """git is missing or failed on the shadow repository."""


@dataclass(frozen=True)
class Skipped:
    path: str
    size: int


@dataclass(frozen=True)
class Snapshot:
    tree: str
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True)
class FileChange:
    path: str
    status: str  # added | modified | deleted | type_changed
    added: int  # lines; 0 for a binary file
    removed: int
    binary: bool
    mode: str  # the new mode (git's, e.g. 100644, 120000 for a symlink); "" when deleted

    def as_json(self) -> dict[str, str | int | bool]:
        """What records and replies show of it."""
        return {
            "path": self.path,
            "status": self.status,
            "added": self.added,
            "removed": self.removed,
            "binary": self.binary,
        }


@contextlib.asynccontextmanager
async def file_lock(path: Path, what: str) -> AsyncIterator[None]:
    """An exclusive lock on the file `path` (made if missing) for the block, across processes on
    one volume; ShadowUnavailable saying `what` holds it when it is not free within LOCK_WAIT_S."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if loop.time() > deadline:
                    raise ShadowUnavailable(f"{what} did not end within {LOCK_WAIT_S:g} s") from None
                await asyncio.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def key_of(text: str) -> str:
    """A file name standing for `text` (a workspace path, a session id)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ShadowRepo:
    """The shadow repository of one workspace, under `root`."""

    def __init__(self, root: Path, workspace: Path) -> None:
        self.root = root
        self.workspace = workspace
        self.git_dir = root / "git"
        self._indexes = root / "index"

    # --- running git -------------------------------------------------------------------------

    def _git(self, *, writable: Iterable[Path] = ()) -> SafeGit:
        executable = find_binary("git")
        if executable is None:
            raise ShadowUnavailable("git is not installed on this server")
        place = Place(self.workspace, writable=(self.root, *writable), network="off")
        settings = (*FIXED_SETTINGS, *_OWN_SETTINGS)
        return SafeGit(executable, self.workspace, {}, place, settings=settings)

    async def _run(
        self,
        *args: str,
        index: Path | None = None,
        stdin: bytes | None = None,
        writable: Iterable[Path] = (),
        work_tree: Path | None = None,
        excludes: Path | None = None,
    ) -> str:
        env = {"GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(work_tree or self.workspace)}
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        extra = ("-c", f"core.excludesFile={excludes}") if excludes is not None else ()
        try:
            status, out, err = await self._git(writable=writable).execute(*extra, *args, env=env, stdin=stdin)
        except ToolFailure as exc:
            raise ShadowUnavailable(str(exc)) from None
        if status != 0:
            raise ShadowUnavailable(f"git {args[0]} failed: {(err or out).strip()[:500]}")
        return out

    async def ensure(self) -> None:
        """Create the repository on first use."""
        if (self.git_dir / "HEAD").is_file():
            return
        self._indexes.mkdir(parents=True, exist_ok=True)
        replace_file(self.root / "workspace", f"{self.workspace}\n".encode())
        status, _, err = await self._git().execute(
            "init", "--quiet", "--bare", "--template=", str(self.git_dir)
        )
        if status != 0:
            raise ShadowUnavailable(f"git init failed: {err.strip()[:500]}")

    # --- snapshots ---------------------------------------------------------------------------

    async def snapshot(self, index_name: str, max_file_bytes: int) -> Snapshot:
        """The workspace now as a tree (written only when something changed since this index's
        last snapshot), leaving out ignored files and those over `max_file_bytes`."""
        await self.ensure()
        index = self._indexes / key_of(index_name)
        guard = index.with_suffix(".guard")  # not .lock: git's own lock of the index
        async with file_lock(guard, f"another snapshot of {self.workspace}"):  # replicas share the index
            return await self._snapshot(index, max_file_bytes)

    async def _snapshot(self, index: Path, max_file_bytes: int) -> Snapshot:
        last_tree = index.with_suffix(".tree")
        excludes = index.with_suffix(".exclude")
        await self._seed(index)
        skipped = self._still_large(excludes, max_file_bytes)
        listed = await self._run(
            "ls-files", "-z", "--others", "--modified", "--exclude-standard", index=index, excludes=excludes
        )
        candidates = [p for p in listed.split("\0") if p]
        if not candidates and last_tree.is_file() and len(skipped) == self._excluded_count(excludes):
            return Snapshot(last_tree.read_text().strip(), tuple(skipped))
        large = [s for s in map(self._large, candidates, [max_file_bytes] * len(candidates)) if s is not None]
        skipped = sorted({s.path: s for s in [*skipped, *large]}.values(), key=lambda s: s.path)
        _write_excludes(excludes, [s.path for s in skipped], self._own_place())
        if large:
            paths = b"".join(s.path.encode() + b"\0" for s in large)
            await self._run("update-index", "-z", "--force-remove", "--stdin", index=index, stdin=paths)
        await self._run("add", "-A", "--", ".", index=index, excludes=excludes)
        tree = (await self._run("write-tree", index=index)).strip()
        if not _is_object_id(tree):
            raise ShadowUnavailable(f"git write-tree gave {tree[:80]!r}")
        replace_file(last_tree, tree.encode())
        return Snapshot(tree, tuple(skipped))

    async def _seed(self, index: Path) -> None:
        """Start a new index as a copy of the one written last (another session's of this
        workspace, with its tree and excludes), so that only what changed since is hashed."""
        newest = self._seed_for(index)
        if newest is None:
            return
        async with file_lock(newest.with_suffix(".guard"), f"a snapshot of {self.workspace}"):
            for suffix in (".tree", ".exclude", ".json", ""):  # the index last: it says the rest is there
                with contextlib.suppress(FileNotFoundError):
                    copy_file(Path(f"{newest}{suffix}"), Path(f"{index}{suffix}"))

    def forget_index(self, index_name: str) -> None:
        """Remove an index and what is kept beside it."""
        index = self._indexes / key_of(index_name)
        for suffix in ("", ".tree", ".exclude", ".json", ".guard"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)

    def _seed_for(self, index: Path) -> Path | None:
        """The index a new `index` starts from: none when it exists, or when it would be the first."""
        if index.exists():
            return None
        trees = [p for p in self._indexes.glob("*.tree") if p.stem != index.name]
        return max(trees, key=lambda p: p.stat().st_mtime_ns).with_suffix("") if trees else None

    def _own_place(self) -> str:
        """The shadow root's path inside the workspace ("" when it lies outside it), left out."""
        try:
            return self.root.relative_to(self.workspace).as_posix()
        except ValueError:
            return ""

    def _large(self, path: str, cap: int) -> Skipped | None:
        try:
            info = os.lstat(self.workspace / path)
        except OSError:
            return None
        return Skipped(path, info.st_size) if stat.S_ISREG(info.st_mode) and info.st_size > cap else None

    def _still_large(self, excludes: Path, cap: int) -> list[Skipped]:
        """The files left out before that are still over the cap."""
        found = [self._large(path, cap) for path in _excluded(excludes)]
        return [s for s in found if s is not None]

    @staticmethod
    def _excluded_count(excludes: Path) -> int:
        return len(_excluded(excludes))

    def keep(self, tree: str) -> None:
        """Name `tree` by a ref, so that `drop`'s collection keeps it until `drop` names it."""
        self._write_ref(f"{_TREE_REFS}/{tree}", tree)

    def hold(self, name: str, tree: str) -> None:
        """Name `tree` by `name` for good, whatever checkpoints drop (a harness run's trees)."""
        self._write_ref(f"{_HELD_REFS}/{key_of(name)}", tree)

    def _write_ref(self, name: str, tree: str) -> None:
        """A loose ref written directly (the repository is ours, its refs never packed), which
        spares a git process per checkpoint."""
        if _is_object_id(tree):
            ref = self.git_dir / name
            ref.parent.mkdir(parents=True, exist_ok=True)
            replace_file(ref, f"{tree}\n".encode())

    async def drop(self, trees: Iterable[str]) -> None:
        """Forget the refs of `trees`, then let git remove the objects nothing names any more
        (those an hour old: a snapshot being written meanwhile keeps its own)."""
        dropped = False
        for tree in trees:
            if _is_object_id(tree):
                (self.git_dir / _TREE_REFS / tree).unlink(missing_ok=True)
                dropped = True
        if dropped:
            await self._run("-c", "gc.packRefs=false", "gc", "--quiet", "--prune=1.hour.ago")

    async def has(self, tree: str) -> bool:
        try:
            return (await self._run("cat-file", "-t", tree)).strip() == "tree"
        except ShadowUnavailable:
            return False

    # --- comparing ---------------------------------------------------------------------------

    async def changes(self, old: str, new: str) -> list[FileChange]:
        """What differs from tree `old` to tree `new`, file by file (renames as delete and add)."""
        if old == new:
            return []
        raw = await self._run(
            "diff-tree", "-r", "-z", "--no-renames", "--raw", "--numstat", old or EMPTY_TREE, new
        )
        return _parse_changes(raw)

    async def unified_diff(self, old: str, new: str, paths: Iterable[str] = ()) -> str:
        """`git diff` from tree `old` to tree `new` (binary files named, not shown)."""
        out = await self._run(
            "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", old or EMPTY_TREE, new,
            "--", *paths,
        )  # fmt: skip
        if len(out) > MAX_DIFF_BYTES:
            raise ShadowUnavailable(f"the diff is larger than {MAX_DIFF_BYTES} bytes; name fewer paths")
        return out

    async def patch(self, old: str, new: str) -> bytes:
        """The exact `git diff --binary --full-index` from tree `old` to tree `new` (a patch `git
        apply` takes); ShadowUnavailable when it is longer than MAX_DIFF_BYTES."""
        out = self._indexes / f"patch-{key_of(old + new)}"
        try:
            await self._run(
                "diff", "--binary", "--full-index", "--no-color", "--no-ext-diff", "--no-textconv",
                "--src-prefix=a/", "--dst-prefix=b/", f"--output={out}", old or EMPTY_TREE, new, "--",
            )  # fmt: skip
            if out.stat().st_size > MAX_DIFF_BYTES:
                raise ShadowUnavailable(f"the patch is larger than {MAX_DIFF_BYTES} bytes")
            return out.read_bytes()
        finally:
            out.unlink(missing_ok=True)

    # --- writing files out -------------------------------------------------------------------

    async def materialize(self, tree: str, paths: list[str] | None, into: Path) -> None:
        """Write the files `paths` of `tree` (None: all of them) under the new directory `into`,
        with their modes and symlinks, through a temporary index."""
        await asyncio.to_thread(into.mkdir, parents=True, exist_ok=True)
        index = self._indexes / f"out-{key_of(str(into))}"
        try:
            await self._run("read-tree", tree, index=index)
            target = f"--prefix={into}/"
            if paths is None:
                await self._run("checkout-index", "-a", "-f", target, index=index, writable=(into,))
            elif paths:
                listed = b"".join(p.encode() + b"\0" for p in paths)
                await self._run(
                    "checkout-index",
                    "-f",
                    "-z",
                    "--stdin",
                    target,
                    index=index,
                    stdin=listed,
                    writable=(into,),
                )
        finally:
            index.unlink(missing_ok=True)


def _is_object_id(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)


def _excluded(excludes: Path) -> list[str]:
    """The paths left out (the exclude file's companion `.json` holds them exactly)."""
    try:
        paths = json.loads(excludes.with_suffix(".json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):  # none yet, or unreadable: written anew at the next change
        return []
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []


def _write_excludes(excludes: Path, paths: list[str], own: str) -> None:
    replace_file(excludes.with_suffix(".json"), json.dumps(paths).encode())
    lines = [f"/{_pattern(path)}" for path in paths]
    if own:
        lines.append(f"/{_pattern(own)}/")
    replace_file(excludes, "".join(f"{line}\n" for line in lines).encode())


_SPECIAL = "\\*?[! #"


def _pattern(path: str) -> str:
    """A gitignore pattern matching the path: its special characters escaped, a control character
    (which a pattern cannot hold: a newline would end it) matched by `?`."""
    return "".join("?" if ord(c) < 32 or c == "\x7f" else f"\\{c}" if c in _SPECIAL else c for c in path)


def _parse_changes(raw: str) -> list[FileChange]:
    """`diff-tree -z --raw --numstat`: the raw records (`:old new oid oid S NUL path NUL`), then the
    numstat ones (`added TAB removed TAB path NUL`)."""
    parts = raw.split("\0")
    modes: dict[str, tuple[str, str]] = {}
    counts: dict[str, tuple[int, int, bool]] = {}
    i = 0
    while i < len(parts):
        part = parts[i]
        if part.startswith(":"):
            fields = part[1:].split()
            modes[parts[i + 1]] = (fields[4][:1], fields[1])
            i += 2
            continue
        if part:
            plus, minus, path = part.split("\t", 2)
            binary = plus == "-"
            counts[path] = (0 if binary else int(plus), 0 if binary else int(minus), binary)
        i += 1
    changes = []
    for path, (status, mode) in modes.items():
        added, removed, binary = counts.get(path, (0, 0, False))
        new_mode = "" if status == "D" else mode
        changes.append(FileChange(path, _STATUS.get(status, "modified"), added, removed, binary, new_mode))
    return changes
