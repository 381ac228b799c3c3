"""The skills of the operator's skill sources (base/skill_sources.py): fetched, scanned and searched.

A git source is cloned afresh for each call into a temporary directory (tools/safe_git.py
shallow_clone: no hooks, no submodules, symlinks checked out as plain files; file:// sources get
no network, http(s) ones do), and the clone is stopped once it holds more than MAX_SOURCE_BYTES. A
directory source is read where it is. Either way a skill is a `<dir>/SKILL.md` at most
MAX_DEPTH directories down (hidden ones skipped, symlinks never followed), parsed as every skill
is; a loose `.md` file is not a skill here (repositories have READMEs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from ...base.errors import InvalidArgument, ResourceExhausted, Unavailable
from ...base.skill_sources import SkillSource
from ...tools.registry import ToolFailure
from ...tools.safe_git import shallow_clone
from .catalog import parse_skill

if TYPE_CHECKING:
    from .skill import Skill

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
MAX_SOURCE_BYTES = 100 * 1024 * 1024
"""The most a git source's clone may hold (its .git directory included)."""
MAX_SKILL_FILE_BYTES = 1024 * 1024
"""The largest SKILL.md read."""
MAX_DEPTH = 4
MAX_SKILLS = 1000
_SIZE_POLL_S = 0.2


@dataclass
class Scanned:
    """A source's skills by name, each with its directory, and the problems of the directories
    whose SKILL.md does not load, by directory name."""

    source: SkillSource
    root: Path
    skills: dict[str, tuple[Skill, Path]] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def fetched(source: SkillSource, secret_names: Iterable[str]) -> AsyncIterator[Scanned]:
    """The skills of `source`, its files readable until the block ends (a clone is then removed)."""
    names = frozenset(secret_names)
    if source.kind == "directory":
        yield await asyncio.to_thread(scan_source, source, Path(source.location), names)
        return
    with tempfile.TemporaryDirectory(prefix="a3s-skill-source-") as scratch:
        checkout = Path(scratch) / "checkout"
        await _clone(source, checkout)
        yield await asyncio.to_thread(scan_source, source, checkout, names)


async def _clone(source: SkillSource, checkout: Path) -> None:
    parts = urlsplit(source.location)
    local = parts.scheme == "file"
    readable = (Path(unquote(parts.path)),) if local else ()
    clone = asyncio.ensure_future(
        shallow_clone(source.location, checkout, readable=readable, network="off" if local else "on")
    )
    try:
        while True:
            await asyncio.wait({clone}, timeout=_SIZE_POLL_S)
            if await asyncio.to_thread(tree_bytes, checkout) > MAX_SOURCE_BYTES:
                raise ResourceExhausted(
                    f"skill source {source.name!r} holds more than {MAX_SOURCE_BYTES // 2**20} MiB;"
                    " point --skill-source at a smaller repository"
                )
            if clone.done():
                break
        clone.result()
    except ToolFailure as exc:
        raise Unavailable(f"skill source {source.name!r}: {exc}") from None
    finally:
        if not clone.done():
            clone.cancel()
            with contextlib.suppress(asyncio.CancelledError, ToolFailure):
                await clone


def tree_bytes(root: Path) -> int:
    """The bytes of the regular files beneath `root` (0 while it does not exist)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def scan_source(source: SkillSource, root: Path, secret_names: frozenset[str]) -> Scanned:
    if not root.is_dir():
        raise Unavailable(f"skill source {source.name!r}: {root} is not a directory")
    scanned = Scanned(source, root)
    for directory in _skill_dirs(root):
        try:
            skill = parse_skill(
                read_skill_file(directory / SKILL_FILE),
                source=f"{source.name}:{directory.relative_to(root).as_posix()}/{SKILL_FILE}",
                secret_names=secret_names,
            )
        except InvalidArgument as exc:
            scanned.problems[directory.name] = str(exc)
            continue
        if skill.name in scanned.skills:
            log.warning("skill source %s: skipping a second skill named %r", source.name, skill.name)
            continue
        scanned.skills[skill.name] = (skill, directory)
    return scanned


def read_skill_file(path: Path) -> str:
    """A SKILL.md's text: a regular file (not a link), at most MAX_SKILL_FILE_BYTES, UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidArgument(
            f"{path.name}: cannot be read ({exc.strerror}); a skill file is a regular file"
        ) from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidArgument(f"{path.name}: is not a regular file")
        data = file.read(MAX_SKILL_FILE_BYTES + 1)
    if len(data) > MAX_SKILL_FILE_BYTES:
        raise InvalidArgument(f"{path.name}: larger than {MAX_SKILL_FILE_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{path.name}: is not UTF-8 text") from None


def _skill_dirs(root: Path) -> list[Path]:
    """The directories beneath `root` (itself included) holding a SKILL.md entry, in path order."""
    found: list[Path] = []
    for directory, subdirs, files in os.walk(root):  # (links to directories are not followed)
        depth = len(Path(directory).relative_to(root).parts)
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and depth < MAX_DEPTH)
        if SKILL_FILE in files:
            found.append(Path(directory))
            if len(found) >= MAX_SKILLS:
                break
    return sorted(found)


@dataclass(frozen=True)
class Hit:
    skill: Skill
    source: SkillSource
    path: str  # the skill's directory within the source

    @property
    def install_source(self) -> str:
        return f"{self.source.name}@{self.skill.name}"


def ranked(query: str, scanned: Iterable[Scanned]) -> list[Hit]:
    """The skills every word of `query` is found in (name, description, source name; any case),
    those matching in their name first."""
    words = query.lower().split()
    hits: list[tuple[int, str, Hit]] = []
    for each in scanned:
        for name, (skill, directory) in each.skills.items():
            text = f"{name} {skill.description} {each.source.name}".lower()
            if all(word in text for word in words):
                exact = name.lower() == query.lower().strip()
                rank = -100 * exact - sum(word in name.lower() for word in words)
                where = directory.relative_to(each.root).as_posix()
                hits.append((rank, name, Hit(skill, each.source, where)))
    return [hit for _, _, hit in sorted(hits, key=lambda entry: entry[:2])]
