"""Which agents a session's model may start: the built-in ones, the operator's agent files
(--agents-dir, A3S_AGENT_DIRS) and the workspace's (`<workspace>/.a3s/agents`).

The repository being worked on is not trusted, the operator is (as for skills): an operator's
agent of a built-in's name replaces it, a workspace agent never replaces one of either (it is
listed as shadowed), and a workspace agent gets only the read-only ones of its tools and the
session's model unless the server runs with --trust-workspace-agents. A file that does not load
is logged once (a warning naming the file and the fault) and reported to a model that names it
(the task tool's error), so a typo in a frontmatter is never silent.

Directories are read again when they change (their files' sizes and times), so an agent file
written while the server runs is seen by the next generation.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...base.errors import InvalidArgument, NotFound
from .definition import BUILT_IN, AgentDefinition, Origin, parse_agent

log = logging.getLogger(__name__)

WORKSPACE_AGENTS = Path(".a3s") / "agents"
MAX_FILE_BYTES = 256 * 1024
MAX_FILES = 200  # read from one directory; a repository's hundreds more are ignored

Signature = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Agents:
    """The agents a workspace's sessions see."""

    available: dict[str, AgentDefinition]
    """By name: the built-in ones, then the operator's, then the workspace's."""
    shadowed: tuple[AgentDefinition, ...] = ()
    """Workspace agents hidden by a built-in or operator agent of their name."""
    problems: dict[str, str] = field(default_factory=dict)
    """What is wrong with each file that did not load, by its name without `.md`."""

    def get(self, name: str) -> AgentDefinition:
        """The agent `name`; NotFound naming those there are, InvalidArgument when its file is broken."""
        found = self.available.get(name)
        if found is not None:
            return found
        if name in self.problems:
            raise InvalidArgument(f"agent {name!r} cannot be used: {self.problems[name]}")
        raise NotFound(f"no agent named {name!r}; the agents are: {', '.join(self.available)}")


@dataclass
class _Directory:
    signature: Signature = ()
    agents: list[AgentDefinition] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)


class AgentCatalog:
    def __init__(
        self, operator_dirs: list[Path], trust_workspace: bool, workspace: Callable[[], Path]
    ) -> None:
        self._operator_dirs = operator_dirs
        self._trust_workspace = trust_workspace
        self._workspace = workspace  # the server's, for sessions that have none of their own
        self._read: dict[Path, _Directory] = {}

    def for_workspace(self, workspace: Path | None) -> Agents:
        """The agents of sessions working in `workspace` (None: the server's)."""
        operator: dict[str, AgentDefinition] = {}
        problems: dict[str, str] = {}
        for directory in self._operator_dirs:
            read = self._directory(directory, "operator")
            problems |= read.problems
            for agent in read.agents:
                operator.setdefault(agent.name, agent)  # the first directory naming it wins
        available = {agent.name: agent for agent in BUILT_IN} | operator
        shadowed: list[AgentDefinition] = []
        own = (workspace or self._workspace()) / WORKSPACE_AGENTS
        if own.resolve() not in {d.resolve() for d in self._operator_dirs}:
            read = self._directory(own, "workspace")
            problems = read.problems | problems
            for agent in read.agents:
                if agent.name in available:
                    shadowed.append(agent)
                else:
                    available[agent.name] = agent if self._trust_workspace else agent.capped()
        for name in available:
            problems.pop(name, None)
        return Agents(available, tuple(shadowed), problems)

    def _directory(self, directory: Path, origin: Origin) -> _Directory:
        # A repository's symlink could name any file of this machine (or a device that never ends).
        follow = origin == "operator"
        files = _agent_files(directory, follow)
        signature = tuple((str(path), stat.st_mtime_ns, stat.st_size) for path, stat in files)
        known = self._read.get(directory)
        if known is not None and known.signature == signature:
            return known
        read = _Directory(signature)
        for path, _ in files:
            try:
                flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
                with open(os.open(path, flags), "rb") as file:
                    data = file.read(MAX_FILE_BYTES + 1)
                if len(data) > MAX_FILE_BYTES:
                    raise InvalidArgument(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB")
                agent = parse_agent(data.decode("utf-8"), source=str(path), origin=origin)
            except (OSError, UnicodeDecodeError) as exc:
                read.problems[path.stem] = f"{path}: cannot be read: {exc}"
            except InvalidArgument as exc:
                read.problems[path.stem] = str(exc)
            else:
                if any(other.name == agent.name for other in read.agents):
                    read.problems[path.stem] = f"{path}: agent {agent.name!r} is defined twice in {directory}"
                else:
                    read.agents.append(agent)
        for problem in read.problems.values():
            log.warning("agent file left out: %s", problem.replace("\n", "; "))
        self._read[directory] = read
        return read


def _agent_files(directory: Path, follow_symlinks: bool) -> list[tuple[Path, os.stat_result]]:
    """The `*.md` files of `directory` (none when it is missing), by name, with their stat."""
    try:
        with os.scandir(directory) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError:
        return []
    files = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.lower().endswith(".md"):
            continue
        try:
            if entry.is_file(follow_symlinks=follow_symlinks):
                files.append((Path(entry.path), entry.stat(follow_symlinks=follow_symlinks)))
        except OSError:
            continue
        if len(files) >= MAX_FILES:
            break
    return files
