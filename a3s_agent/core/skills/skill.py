"""Skills: instructions for the model, plus the tools a skill may use and the tools it adds.

A skill is a directory `<name>/SKILL.md` or a single `.md` file: YAML frontmatter between
`---` lines, then a markdown body of instructions.

    ---
    name: word-count                     # required, [A-Za-z0-9._-]{1,64}
    description: Count lines and words.
    allowed-tools: Bash(wc:*), Read      # or a YAML list
    env: [WC_LOCALE]                     # optional: the environment variables the skill reads
    sandbox-network: allow:pypi.org      # optional: the network of its tools' processes (below)
    mcp-servers:                         # optional: MCP servers whose tools the skill brings
      git: {command: mcp-server-git, args: [--repository, .]}   # (the mcpServers shape)
    tools:                               # optional: tools this skill adds
      - name: count_lines                # [a-zA-Z0-9_-]{1,64}
        description: Line and word counts of a workspace file.
        parameters: {type: object, properties: {path: {type: string}}, required: [path]}
        timeout_ms: 30000                # optional
        script: |                        # exactly one backend: script, binary or http
          #!/usr/bin/env python3
          ...
    ---
    Instructions in markdown.

Backends (run by tools/skill_backends.py):
- `script`: an inline script run in the workspace by `interpreter` (alias `language`, a command
  line such as `python3` or `bash -eu`), else its shebang, else bash; the arguments arrive in
  the environment (`TOOL_ARGS`, `TOOL_ARG_<NAME>`).
- `binary`: an argv list, run without a shell; `[echo, "${msg}"]`.
- `http`: `{url, method (GET), headers, body}` or just the URL; `body` is a string template, or
  a mapping/list sent as JSON. Requests go through web_fetch's checked fetcher.
A3S Code's form, `backend: {type: binary|script|http, ...}`, is rewritten into these
(core/skills/a3s_code_backends.py).

`mcp-servers` take the shape of `--mcp-config` (tools/mcp/config.py); their tools appear while the
skill is loaded. A repository's skill adds no servers unless the server trusts workspace skills, and
a skill sent as LoadSkill content may bring a command only where the API may (runtime/mcp.py).

`sandbox-network` (off, on or allow:host,..., as --sandbox-network takes it) gives the processes of
the skill's tools that network in place of the server's. Only the operator gives a network: it
holds for a skill of the operator's skill directories; a repository's skill's is left out (with a
warning), and a skill sent as LoadSkill content that names one is refused. The same goes for the
`sandbox_network` of the servers in its `mcp-servers`.

Templates: `${arg}` is an argument, `${env:VAR}` a variable the skill declares in `env`. Every
reference is checked when the skill is parsed: against the parameters, and against `env`. `env`
may not name one of the server's secrets (base/secrets.py is_secret_name, and the names the
operator marks).

The frontmatter is validated by the models in core/skills/frontmatter.py. Unknown top-level keys
are kept in `Skill.metadata`; unknown keys in a tool definition are errors, since a misspelt
backend would otherwise go unnoticed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...base.errors import InvalidArgument, NotFound
from ...tools.mcp.config import ServerSpec
from ...tools.registry import Tool
from ...tools.skill_backends import SkillToolSpec
from .frontmatter import kind, read_frontmatter

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"

_FENCES = ("---", "...")
_FRONTMATTER_FORM = "{kind} starts with YAML frontmatter: a '---' line, 'name: ...' and the other fields, then another '---' line"


@dataclass
class Skill:
    name: str
    description: str = ""
    allowed_tools: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)  # the environment variables it may read
    instructions: str = ""  # the markdown body
    tools: list[SkillToolSpec] = field(default_factory=list)
    mcp_servers: dict[str, ServerSpec] = field(default_factory=dict)  # the MCP servers it brings
    sandbox_network: str = ""  # the network of its tools' processes, if the operator's ("": the server's)
    source: str = "client"  # the file it came from, or "client"
    metadata: dict[str, Any] = field(default_factory=dict)  # frontmatter keys we do not interpret
    text: str = field(default="", repr=False, compare=False)  # what it was parsed from, kept to store it

    @property
    def tool_names(self) -> list[str]:
        return [spec.name for spec in self.tools]

    def build_tools(self, network: str = "") -> list[Tool]:
        """Registry tools for this skill's tool definitions, ready to register; their processes
        get `network` ("": the server's)."""
        return [spec.build(network) for spec in self.tools]


def parse_skill(text: str, *, source: str, secret_names: Iterable[str] = ()) -> Skill:
    """A skill from SKILL.md text; InvalidArgument names the source and the line or field at fault.

    `secret_names` are the variables the operator marks secret, besides those is_secret_name
    recognises; the skill's `env` may name none of them. Every problem in the fields is
    reported, one line each."""
    first_line, frontmatter, body = split_frontmatter(text, source)
    fields = read_frontmatter(
        load_frontmatter(frontmatter, first_line, source), source, frozenset(secret_names)
    )
    return Skill(
        name=fields.name,
        description=fields.description or "",
        allowed_tools=fields.allowed_tools or [],
        env=fields.env or [],
        instructions=body.strip(),
        tools=fields.tool_specs(),
        mcp_servers=fields.mcp_servers or {},
        sandbox_network=fields.sandbox_network,
        source=source,
        metadata=fields.metadata,
        text=text,
    )


def load_skill_file(path: Path | str, secret_names: Iterable[str] = ()) -> Skill:
    """A skill from a `.md` file, or from a skill directory's SKILL.md."""
    path = Path(path)
    file = path / SKILL_FILE if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise NotFound(f"no skill file at {file}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{file}: cannot be read: {exc}") from exc
    return parse_skill(text, source=str(file), secret_names=secret_names)


def scan_skill_dirs(dirs: Iterable[Path | str], secret_names: Iterable[str] = ()) -> dict[str, Skill]:
    """Skills by name from `<dir>/<name>/SKILL.md` and `<dir>/*.md`, in name order.

    The first skill with a name wins: earlier directories take precedence over later ones.
    Missing directories, invalid skills and duplicates are logged as warnings and skipped, so
    one bad file does not take the others down.
    """
    skills: dict[str, Skill] = {}
    for directory in dirs:
        for file in _skill_files(Path(directory)):
            try:
                skill = load_skill_file(file, secret_names)
            except (InvalidArgument, NotFound) as exc:
                log.warning("skipping skill file: %s", exc)
                continue
            if skill.name in skills:
                log.warning(
                    "skipping skill %r from %s: already loaded from %s",
                    skill.name,
                    file,
                    skills[skill.name].source,
                )
                continue
            skills[skill.name] = skill
    return skills


def _skill_files(directory: Path) -> list[Path]:
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        log.warning("cannot read skill directory %s: %s", directory, exc)
        return []
    files = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and (entry / SKILL_FILE).is_file():
            files.append(entry / SKILL_FILE)
        elif entry.is_file() and entry.suffix.lower() == ".md":
            files.append(entry)
    return files


# ---------------------------------------------------------------- frontmatter


def split_frontmatter(text: str, source: str, kind: str = "skill") -> tuple[int, str, str]:
    """(file line of the first YAML line, the YAML, the body) of a `kind` of file (a skill, an
    agent) that starts with frontmatter. Line endings are normalised; a byte-order mark and blank
    lines before the opening fence are allowed."""
    lines = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    form = _FRONTMATTER_FORM.format(kind=f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}")
    if start == len(lines):
        raise InvalidArgument(f"{source}: the {kind} is empty; {form}")
    if lines[start].rstrip() != "---":
        raise InvalidArgument(f"{source}: line {start + 1}: {form}")
    for end in range(start + 1, len(lines)):
        if lines[end].rstrip() in _FENCES:
            return start + 2, "\n".join(lines[start + 1 : end]), "\n".join(lines[end + 1 :])
    raise InvalidArgument(f"{source}: line {start + 1}: the frontmatter is never closed with a '---' line")


class _FrontmatterLoader(yaml.SafeLoader):
    """SafeLoader without aliases: a few `*ref`s can make a tiny document expand exponentially
    once it is turned into JSON, and frontmatter has no need for them."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not allowed in frontmatter",
                self.peek_event().start_mark,
            )
        return super().compose_node(parent, index)


def load_frontmatter(frontmatter: str, first_line: int, source: str) -> dict[Any, Any]:
    """The frontmatter's fields; InvalidArgument naming the source and the line at fault."""
    try:
        data = yaml.load(frontmatter, Loader=_FrontmatterLoader)
    except yaml.MarkedYAMLError as exc:
        raise InvalidArgument(f"{source}: {_yaml_problem(exc, first_line)}") from None
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{source}: invalid YAML frontmatter: {exc}") from None
    except RecursionError:
        raise InvalidArgument(f"{source}: the frontmatter is nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(
            f"{source}: line {first_line}: the frontmatter must be a mapping of fields "
            f"(name: ..., description: ...), not a {kind(data)}"
        )
    return data


def _yaml_problem(exc: yaml.MarkedYAMLError, first_line: int) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"line {first_line + mark.line}" if mark else "frontmatter"
    problem = f"{where}: invalid YAML: {exc.problem or exc.context}"
    if exc.context and exc.problem and exc.context_mark:
        problem += f" ({exc.context} on line {first_line + exc.context_mark.line})"
    return problem
