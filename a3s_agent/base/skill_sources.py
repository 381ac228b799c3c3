"""The skill sources the operator configures (--skill-source, A3S_SKILL_SOURCES): where SearchSkills
looks and InstallSkill installs from. A client names a source by its name, never by a location, so
only what the operator listed is ever fetched.

A source is `[NAME=]LOCATION`: a git repository (`https://`, `http://` or `file://` URL) or an
absolute path to a directory of skills. Its name defaults to the URL's last two path segments
without `.git` (`https://github.com/anthropics/skills.git` is `anthropics/skills`), or the
directory's own name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal
from urllib.parse import urlsplit

from .errors import InvalidArgument

SOURCE_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}(/[A-Za-z0-9._-]{1,100})?")
GIT_SCHEMES = ("https", "http", "file")


@dataclass(frozen=True)
class SkillSource:
    name: str
    location: str  # the git URL, or the directory's absolute path
    kind: Literal["git", "directory"]

    @property
    def host(self) -> str:
        """The host a git source is fetched from ("" for file:// and directories)."""
        return (urlsplit(self.location).hostname or "") if self.kind == "git" else ""


def parse_skill_source(text: str) -> SkillSource:
    """One `[NAME=]LOCATION`; InvalidArgument saying what is wrong."""
    text = text.strip()
    name, eq, location = text.partition("=")
    if not eq or "://" in name or name.startswith("/"):
        name, location = "", text
    location = location.strip()
    if "://" in location:
        parts = urlsplit(location)
        if parts.scheme not in GIT_SCHEMES:
            raise InvalidArgument(
                f"skill source {location!r}: a git URL must be https://, http:// or file://, not {parts.scheme}://"
            )
        if parts.scheme != "file" and not parts.hostname:
            raise InvalidArgument(f"skill source {location!r}: the URL names no host")
        segments = [s for s in PurePosixPath(parts.path).parts if s != "/"]
        default = "/".join(segments[-2:]).removesuffix(".git")
        kind: Literal["git", "directory"] = "git"
    elif location.startswith("/"):
        default, kind = PurePosixPath(location).name, "directory"
    else:
        raise InvalidArgument(
            f"skill source {location!r}: give a git URL (https://, http://, file://) or an absolute directory"
        )
    name = name.strip() or default
    if not SOURCE_NAME.fullmatch(name) or name.split("/")[-1] in (".", ".."):
        raise InvalidArgument(
            f"skill source {location!r}: its name {name!r} must be letters, digits, '.', '_' or '-',"
            " with at most one '/'; name it with NAME=LOCATION"
        )
    return SkillSource(name, location, kind)


def parse_skill_sources(texts: list[str]) -> tuple[SkillSource, ...]:
    """Every source, their names distinct."""
    sources = tuple(parse_skill_source(text) for text in texts if text.strip())
    names = [source.name for source in sources]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidArgument(f"two skill sources are named {name!r}: name one with NAME=LOCATION")
    return sources
