"""LoadSkillsFromDir's directory and the skills in it, and Claude Code's skill places.

A client names a directory, relative to the session's workspace or absolute; it must lie, symlinks
resolved, beneath that workspace or one of the operator's skill directories, and its skills count as
that place's (a workspace's grant no permissions without --trust-workspace-skills). A skill file
whose real path leads out of the directory is refused, as is one that is a link itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...base.errors import InvalidArgument, NotFound
from .catalog import Origin, parse_skill
from .sources import MAX_DEPTH, MAX_SKILLS, SKILL_FILE, read_skill_file

if TYPE_CHECKING:
    from .skill import Skill

CLAUDE_CODE_DIR = Path(".claude") / "skills"
"""Where Claude Code keeps skills, in a workspace and in a user's home directory."""


@dataclass
class DirectorySkills:
    """The skills of a directory (with the origin of its place) and the problems of those that
    do not load, one line each, naming the file."""

    origin: Origin
    skills: list[Skill] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def resolve_directory(directory: str, workspace: Path, operator_dirs: list[Path]) -> tuple[Path, Origin]:
    """The real directory `directory` names and whose place it lies in: InvalidArgument naming the
    field when it lies elsewhere, NotFound when it does not exist."""
    if not directory.strip():
        raise InvalidArgument("directory is required: a directory of skills beneath the workspace")
    if "\0" in directory:
        raise InvalidArgument("directory must not contain NUL characters")
    named = Path(directory)
    real = Path(os.path.realpath(named if named.is_absolute() else workspace / named))
    if _beneath(real, workspace):
        origin: Origin = "workspace"
    elif any(_beneath(real, d) for d in operator_dirs):
        origin = "operator"
    else:
        raise InvalidArgument(
            f"directory {directory[:200]!r} lies outside the session's workspace and the operator's skill"
            " directories (links resolved); skills load only from those"
        )
    if not real.is_dir():
        raise NotFound(f"directory {directory[:200]!r}: no such directory")
    return real, origin


def _beneath(path: Path, root: Path) -> bool:
    root = Path(os.path.realpath(root))
    return path == root or root in path.parents


def directory_skills(
    root: Path, origin: Origin, recursive: bool, secret_names: frozenset[str]
) -> DirectorySkills:
    """The skills of `root`: `<root>/*.md` and `<root>/<name>/SKILL.md`, and with `recursive` every
    SKILL.md further down (at most MAX_DEPTH levels, hidden directories skipped)."""
    found = DirectorySkills(origin)
    files = _skill_files(root, recursive)
    if len(files) > MAX_SKILLS:
        found.problems.append(f"more than {MAX_SKILLS} skill files: only the first {MAX_SKILLS} were read")
    for file in files[:MAX_SKILLS]:
        shown = file.relative_to(root).as_posix()
        try:
            if not _beneath(Path(os.path.realpath(file)), root):
                raise InvalidArgument("is a link leading out of the directory")
            skill = parse_skill(read_skill_file(file), source=str(file), secret_names=secret_names)
        except InvalidArgument as exc:
            message = str(exc)
            found.problems.append(message if message.startswith(str(file)) else f"{shown}: {message}")
            continue
        if any(other.name == skill.name for other in found.skills):
            found.problems.append(f"{shown}: a second skill named {skill.name!r}; the first is kept")
            continue
        found.skills.append(skill)
    return found


def _skill_files(root: Path, recursive: bool) -> list[Path]:
    files: list[Path] = []
    for directory, subdirs, names in os.walk(root):  # (links to directories are not followed)
        here = Path(directory)
        depth = len(here.relative_to(root).parts)
        if depth == 0:
            files += [here / n for n in sorted(names) if n.lower().endswith(".md") and not n.startswith(".")]
            # a linked skill directory is listed (and refused if it leads out)
            files += [here / d / SKILL_FILE for d in sorted(subdirs) if (here / d).is_symlink()]
        elif SKILL_FILE in names:
            files.append(here / SKILL_FILE)
        if (not recursive and depth >= 1) or len(files) > MAX_SKILLS:
            subdirs[:] = []
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and depth < MAX_DEPTH)
    return [f for f in files if os.path.lexists(f)]


def claude_code_places(workspace: Path, home: Path) -> list[tuple[Path, Origin]]:
    """Claude Code's skill directories that exist: the workspace's (`.claude/skills`) and the user's
    (`~/.claude/skills`, the operator's: the server runs as that user)."""
    places: list[tuple[Path, Origin]] = [
        (workspace / CLAUDE_CODE_DIR, "workspace"),
        (home / CLAUDE_CODE_DIR, "operator"),
    ]
    return [(path, origin) for path, origin in places if path.is_dir()]
