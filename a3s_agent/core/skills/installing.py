"""SearchSkills and InstallSkill over the operator's skill sources (sources.py fetches and scans them).

A client names a skill `<source>@<skill>` (or `<source>` alone, for a source of one skill), never a
location. Installing copies the skill's directory into the workspace's `.a3s/skills` or the
operator's first skills directory, and runs nothing: regular files only (a link or a device is
refused), at most MAX_SKILL_FILES files and MAX_SKILL_BYTES bytes, into a hidden directory first,
renamed into place once complete; a skill already installed under the name is left as it is.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...base.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ...base.skill_sources import SOURCE_NAME, SkillSource
from .sources import Hit, fetched, ranked

DEFAULT_SEARCH_LIMIT = 10
MAX_SEARCH_LIMIT = 30
MAX_SKILL_FILES = 500
MAX_FETCHES = 2
MAX_SKILL_BYTES = 20 * 1024 * 1024
_SKILL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_HOW_TO_CONFIGURE = (
    "no skill sources are configured: the operator lists them with --skill-source [NAME=]LOCATION"
    " (A3S_SKILL_SOURCES), a git URL or a directory of skills"
)


@dataclass(frozen=True)
class Installed:
    success: bool
    message: str
    path: str = ""
    skill_name: str = ""


class SkillRefused(Exception):
    """The skill cannot be installed as it is (InstallSkill says so in its reply)."""


class SkillSources:
    def __init__(self, sources: tuple[SkillSource, ...], secret_names: Iterable[str]) -> None:
        self._sources = {source.name: source for source in sources}
        self._secret_names = frozenset(secret_names)
        self._fetching = asyncio.Semaphore(MAX_FETCHES)  # clones take disk and time: a few at once

    def _configured(self) -> dict[str, SkillSource]:
        if not self._sources:
            raise FailedPrecondition(_HOW_TO_CONFIGURE)
        return self._sources

    async def search(self, query: str, limit: int) -> tuple[list[Hit], int]:
        """The best `limit` (0: 10, at most 30) skills matching `query`, and how many matched."""
        sources = self._configured()
        if not query.strip():
            raise InvalidArgument("query is required: words to find in skills' names and descriptions")
        limit = min(limit or DEFAULT_SEARCH_LIMIT, MAX_SEARCH_LIMIT)
        scans = []
        for source in sources.values():
            async with self._fetching, fetched(source, self._secret_names) as scanned:
                scans.append(scanned)  # (the skills are parsed: they outlive a clone's files)
        found = ranked(query, scans)
        return found[:limit], len(found)

    async def install(self, source_text: str, target_root: Path, within: Path) -> Installed:
        """Install the skill `source_text` names into `target_root` (which must lie, links resolved,
        beneath `within`). A request naming no configured
        source or skill is an error; a skill that cannot be installed is an unsuccessful result."""
        source, wanted = self._named(source_text)
        try:
            async with self._fetching, fetched(source, self._secret_names) as scanned:
                if wanted is None:
                    held = sorted({*scanned.skills, *scanned.problems})
                    if len(held) != 1:
                        raise InvalidArgument(
                            f"source: {source.name!r} holds {len(held)} skills; name one as"
                            f" {source.name}@<skill> ({', '.join(held) or 'none'})"
                        )
                    wanted = held[0]
                if wanted in scanned.problems and wanted not in scanned.skills:
                    raise SkillRefused(f"skill {wanted!r} is not valid: {scanned.problems[wanted]}")
                if wanted not in scanned.skills:
                    raise NotFound(
                        f"source: skill source {source.name!r} has no skill named {wanted!r}"
                        f" (it has: {', '.join(sorted(scanned.skills)) or 'none'})"
                    )
                skill, directory = scanned.skills[wanted]
                path = copy_skill(directory, target_root, skill.name, within)
        except (SkillRefused, Unavailable, ResourceExhausted) as exc:
            return Installed(False, f"{source_text}: {exc}", skill_name=wanted or "")
        return Installed(
            True, f"installed skill {skill.name} from {source.name} into {path}", str(path), skill.name
        )

    def _named(self, text: str) -> tuple[SkillSource, str | None]:
        """The source and skill (None: the source's only one) `<source>[@<skill>]` names."""
        sources = self._configured()
        text = text.strip()
        if not text:
            raise InvalidArgument(
                "source is required: <source>@<skill>, as SearchSkills' install_source gives"
            )
        name, at, skill = text.partition("@")
        if not SOURCE_NAME.fullmatch(name) or (at and not _SKILL_NAME.fullmatch(skill)):
            raise InvalidArgument(
                f"source {text[:200]!r} is not <source>@<skill>: a configured source's name, then a skill's"
                " (SearchSkills' install_source); URLs and paths are not accepted"
            )
        if name not in sources:
            raise NotFound(f"source: no skill source is named {name!r} (configured: {', '.join(sources)})")
        return sources[name], skill if at else None


def copy_skill(directory: Path, target_root: Path, name: str, within: Path) -> Path:
    """Copy the skill directory to `target_root/name`; SkillRefused saying why not."""
    if name in (".", "..") or name.startswith("."):
        raise SkillRefused(f"skill name {name!r} cannot be a directory name")
    real_within = os.path.realpath(within)
    if os.path.commonpath([os.path.realpath(target_root), real_within]) != real_within:
        raise SkillRefused(
            f"{target_root} leads out of {within} (a link); skills are installed only beneath it"
        )
    target_root.mkdir(parents=True, exist_ok=True)
    target = target_root / name
    if os.path.lexists(target):
        raise SkillRefused(f"a skill is already installed at {target}; remove it to install again")
    files = _files(directory)
    staging = target_root / f".installing-{name}-{uuid.uuid4().hex[:8]}"
    try:
        for relative, executable in files:
            destination = staging / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            _copy_regular(directory / relative, destination)
            os.chmod(destination, 0o755 if executable else 0o644)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _files(directory: Path) -> list[tuple[Path, bool]]:
    """The skill's files (relative path, executable) when every entry is a directory or a regular
    file and they fit the bounds; SkillRefused naming the first that does not."""
    files: list[tuple[Path, bool]] = []
    total = 0
    for current, subdirs, names in os.walk(directory):
        subdirs[:] = [d for d in subdirs if d != ".git"]
        for entry in [*subdirs, *names]:
            path = Path(current) / entry
            mode = os.lstat(path).st_mode
            relative = path.relative_to(directory)
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise SkillRefused(
                    f"{relative} is not a regular file (a link or device); a skill holds files only"
                )
            total += os.lstat(path).st_size
            files.append((relative, bool(mode & stat.S_IXUSR)))
            if len(files) > MAX_SKILL_FILES or total > MAX_SKILL_BYTES:
                raise SkillRefused(
                    f"the skill holds more than {MAX_SKILL_FILES} files or {MAX_SKILL_BYTES // 2**20} MiB"
                )
    return files


def _copy_regular(source: Path, destination: Path) -> None:
    """Copy one file, never through a link (O_NOFOLLOW), never onto an existing one."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as src, open(destination, "xb") as dst:
        shutil.copyfileobj(src, dst)
