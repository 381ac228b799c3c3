"""An agent: the system prompt, the tools and the model of a subagent the `task` tool starts.

An agent file is Markdown with YAML frontmatter, as a skill is (core/skills/skill.py reads both);
the body is the agent's system prompt:

    ---
    name: reviewer                     # required, [A-Za-z0-9._-]{1,64}
    description: Reviews a change for bugs; use it once an edit is done.   # required: the model
                                       #   reads it in the task tool's description
    tools: read_file, grep, git_diff   # optional (or a YAML list): only these of the parent's
                                       #   tools; left out, all of them; `read-only`, those that
                                       #   change nothing (A3S Code's names too: read, glob, ls)
    model: small-fast-model            # optional: another model on the session's endpoint
    max-steps: 30                      # optional: at most this many tool calls (1-500)
    ---
    You review changes...

A child never has a tool its parent's model does not have, and `task` only while the depth limit
lets it start children of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ...base.errors import InvalidArgument
from ...tools.aliases import our_tool_name
from ...tools.registry import Tool
from ..skills.skill import load_frontmatter, split_frontmatter

MAX_STEPS = 500
READ_ONLY = "read-only"
"""The `tools` entry meaning every tool of the parent's that changes nothing (the query lane)."""

Origin = Literal["built-in", "operator", "workspace"]


@dataclass(frozen=True)
class AgentDefinition:
    name: str
    description: str
    prompt: str
    tools: tuple[str, ...] | None = None
    """The tools it may have of its parent's, by name; None: all of them."""
    read_only: bool = False
    """Only those of them that change nothing (the query lane's)."""
    model: str = ""  # "": the parent's
    max_steps: int = 0  # 0: the loop's default
    source: str = "built-in"  # the file it was read from
    origin: Origin = "built-in"

    def allows(self, tool: Tool) -> bool:
        """Whether the agent may have `tool` (one of its parent's)."""
        if self.read_only and tool.lane != "query":
            return False
        return self.tools is None or any(tool.name in (name, our_tool_name(name)) for name in self.tools)

    def capped(self) -> AgentDefinition:
        """As an untrusted file may have it: the read-only ones of its tools, the parent's model."""
        return replace(self, read_only=True, model="")


def _names(value: Any) -> Any:
    """`read_file, grep` or a YAML list."""
    return [name.strip() for name in value.split(",") if name.strip()] if isinstance(value, str) else value


ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:/-]{1,128}$")]


class _Frontmatter(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
    description: Annotated[str, Field(min_length=1, max_length=2000)]
    tools: Annotated[list[ToolName] | None, BeforeValidator(_names)] = None
    model: Annotated[str, Field(max_length=256)] = ""
    max_steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] | None = Field(
        None, validation_alias=AliasChoices("max-steps", "max_steps")
    )
    color: str | None = None  # Claude Code's agent files name one; it means nothing here


def parse_agent(text: str, *, source: str, origin: Origin) -> AgentDefinition:
    """An agent from its file's text; InvalidArgument naming the source, then the line or the
    field at fault, one line per problem."""
    first_line, frontmatter, body = split_frontmatter(text, source, "agent file")
    data = load_frontmatter(frontmatter, first_line, source)
    try:
        fields = _Frontmatter.model_validate({str(key): value for key, value in data.items()})
    except ValidationError as exc:
        raise InvalidArgument("\n".join(dict.fromkeys(_problems(exc.errors(), source)))) from None
    prompt = body.strip()
    if not prompt:
        raise InvalidArgument(f"{source}: the agent's prompt (the text after the frontmatter) is empty")
    named = [name for name in fields.tools or () if name != READ_ONLY]
    return AgentDefinition(
        name=fields.name,
        description=" ".join(fields.description.split()),
        prompt=prompt,
        tools=tuple(named) if named or fields.tools == [] else None,
        read_only=READ_ONLY in (fields.tools or ()),
        model=fields.model.strip(),
        max_steps=fields.max_steps or 0,
        source=source,
        origin=origin,
    )


def _problems(errors: Iterable[Any], source: str) -> Iterable[str]:
    for error in errors:
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "missing":
            yield f"{source}: missing required field {where!r}"
        elif error["type"] == "extra_forbidden":
            yield f"{source}: unknown field {where!r} (known: name, description, tools, model, max-steps)"
        elif where == "tools" and error["type"] == "list_type":
            yield f"{source}: tools: must be a comma-separated string or a list of tool names"
        elif error["type"] == "string_pattern_mismatch" and where == "name":
            yield f"{source}: name: {error['input']!r} is not a valid agent name: use 1-64 letters, digits, '.', '_' or '-'"
        else:
            yield f"{source}: {where}: {error['msg']}"


_EXPLORE = """You are a subagent exploring a codebase to answer one question for another agent, \
which sees none of your work but your final answer.

Search and read with the tools you have (they change nothing): find the files that matter, read \
the parts that answer the question, and check what you are unsure of. Then answer: what you \
found, with the paths (and line numbers) it rests on, as briefly as the question allows. Do not \
paste whole files; quote only the lines that matter."""

_PLAN = """You are a subagent planning a change for another agent, which sees none of your work \
but your final answer.

Read what the change touches with the tools you have (they change nothing): the code, its \
tests, how similar things are done. Then answer with a plan: numbered steps, each naming the \
files and functions to change and how, the tests to add or run, and the risks or open \
questions. Change nothing yourself."""

_GENERAL = """You are a subagent doing one task for another agent, which sees none of your work \
but your final answer.

Do the task with the tools you have, checking your work as you go. Then answer with a short \
report: what you did, what you found, what is left, with the paths of the files you changed."""

BUILT_IN: tuple[AgentDefinition, ...] = (
    AgentDefinition(
        "explore",
        "Searches and reads the workspace (read-only) to answer a question about it; use it to find"
        " where and how something is done without filling your context with the files it reads.",
        _EXPLORE,
        read_only=True,
    ),
    AgentDefinition(
        "plan",
        "Reads what a change touches (read-only) and answers with a step-by-step plan for it; use it"
        " before a change that spans several files.",
        _PLAN,
        read_only=True,
    ),
    AgentDefinition(
        "general",
        "Does a self-contained task with all your tools (it may change files) and reports back; use"
        " it for independent pieces of work, several at once.",
        _GENERAL,
    ),
)
