"""Permission rules: their syntax, the tools their names stand for, and whether one matches a call.

A rule is `Tool` (every call of the tool) or `Tool(pattern)` (calls whose key argument, the rule
subject the tool declares, matches; how, is matching.py's job). Tool names are
case-insensitive. Besides our own names (`bash`, `read_file`, ...) the rules accept the aliases in
`TOOL_ALIASES` (Read, Write, Edit/MultiEdit, Delete, LS/List, Glob, WebFetch, WebSearch; Git means
the four built-in git_* tools), and `*` means every tool; calls checked by an alias, or with A3S
Code's argument names (tools/aliases.py), match as ours do. Any other name made of letters,
digits, `_` and `-` is taken as a tool registered later; one that ends in `*` covers every tool
whose name starts with what precedes it (`mcp__git__*`: the tools of the MCP server `git`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePath
from typing import Any, Final, Literal, get_args

from ...base.errors import InvalidArgument
from ...tools.aliases import TOOL_NAMES
from ...tools.registry import RuleSubject
from .matching import bash_matches, subjects, text_argument

Decision = Literal["allow", "deny", "ask"]
RuleType = Decision
RULE_TYPES: Final[tuple[RuleType, ...]] = get_args(RuleType)

GIT_TOOLS: Final = ("git_status", "git_diff", "git_log", "git_commit")
TOOL_ALIASES: Final[Mapping[str, tuple[str, ...]]] = {
    **{alias: (ours,) for alias, ours in TOOL_NAMES.items()},  # A3S Code's read, edit, ls...
    "multiedit": ("edit_file",),
    "delete": ("delete_file",),
    "list": ("list_files",),
    "webfetch": ("web_fetch",),
    "websearch": ("web_search",),
    "git": GIT_TOOLS,
}

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]+\*?|\*")
_RULE = re.compile(r"(?P<tool>[A-Za-z0-9_-]+\*?|\*)(?:\((?P<pattern>.*)\))?", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DOMAIN = re.compile(r"[a-z0-9-]+(?:\.[a-z0-9-]+)*")


def canonical_tool_name(name: str) -> str:
    """The tool a name means: lower-cased, with a one-tool alias (Read, WebFetch...) resolved."""
    lowered = name.lower()
    tools = TOOL_ALIASES.get(lowered, ())
    return tools[0] if len(tools) == 1 else lowered


@dataclass(frozen=True)
class Rule:
    """One parsed rule: `tool` and `pattern` as written (pattern stripped), `raw` the text given."""

    tool: str
    pattern: str | None
    raw: str

    @property
    def tools(self) -> frozenset[str] | None:
        """The canonical tool names the rule covers; None for `*`, every tool."""
        return _named_tools(self.tool)

    def covers(self, tool_name: str) -> bool:
        """Whether the rule is about this tool at all, whatever the arguments."""
        if len(self.tool) > 1 and self.tool.endswith("*"):  # a prefix: `mcp__git__*`
            return tool_name.lower().startswith(self.tool[:-1].lower())
        tools = self.tools
        return tools is None or canonical_tool_name(tool_name) in tools

    def matches(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        *,
        rule_type: RuleType,
        subject: RuleSubject | None,
        workspace: str | PurePath | None = None,
    ) -> bool:
        """Whether this rule, used as a `rule_type` rule, matches the call of a tool whose rule
        subject (what its pattern is matched against) is `subject`.

        Allow rules must match every subject of the call (each program a command runs, each path
        of git_commit); deny and ask rules match when any one does. `workspace` makes absolute
        paths in the arguments relative; nothing on disk is looked at.
        """
        if not self.covers(tool_name):
            return False
        if self.pattern is None:
            return True
        if canonical_tool_name(tool_name) == "bash":
            return bash_matches(
                self.pattern, text_argument(arguments, "command"), strict=rule_type == "allow"
            )
        found, test = subjects(subject, self.pattern, arguments, workspace)
        combine = all if rule_type == "allow" else any
        return combine(test(subject) for subject in found)


def _named_tools(name: str) -> frozenset[str] | None:
    """The canonical tools a rule's tool name stands for; None for `*`."""
    if name == "*":
        return None
    lowered = name.lower()
    return frozenset(TOOL_ALIASES.get(lowered, (lowered,)))


def parse_rule(text: str) -> Rule:
    """The rule `text` spells, or InvalidArgument saying what is wrong with it."""
    if not isinstance(text, str):
        raise InvalidArgument(f"permission rule must be a string, not {type(text).__name__}")
    return _parse_rule(text)


@lru_cache(maxsize=1024)
def _parse_rule(text: str) -> Rule:
    stripped = text.strip()
    if not stripped:
        raise InvalidArgument("permission rule is empty")
    if _CONTROL.search(stripped):
        raise InvalidArgument(f"permission rule {text!r} contains a control character")
    match = _RULE.fullmatch(stripped)
    if match is None:
        raise InvalidArgument(f"permission rule {text!r}: {_syntax_problem(stripped)}")
    pattern = match["pattern"]
    if pattern is not None:
        pattern = pattern.strip()
        _check_pattern(text, match["tool"], pattern)
    return Rule(tool=match["tool"], pattern=pattern, raw=text)


def _syntax_problem(text: str) -> str:
    """Why a rule that does not fit `Tool` or `Tool(pattern)` is malformed."""
    name, _, rest = text.partition("(")
    if not name:
        return "the tool name before '(' is missing"
    if ")" in name:
        return "unbalanced parentheses: ')' without '('"
    if not _TOOL_NAME.fullmatch(name):
        return f"tool name {name!r} must be '*' or letters, digits, '_' and '-' (a trailing '*' for a prefix)"
    if ")" not in rest:
        return "unbalanced parentheses: the pattern is not closed with ')'"
    return "unexpected text after the closing ')'"


def _check_pattern(text: str, tool: str, pattern: str) -> None:
    def fail(reason: str) -> InvalidArgument:
        return InvalidArgument(f"permission rule {text!r}: {reason}")

    if not pattern:
        raise fail(f"the pattern is empty; write {tool!r} alone to cover every call")
    if not _balanced(pattern):
        raise fail("unbalanced parentheses in the pattern")
    tools = _named_tools(tool)
    if (tools is None or "bash" in tools) and pattern.endswith(":*") and not pattern[:-2].strip():
        raise fail("a command prefix is needed before ':*', e.g. 'Bash(git:*)'")
    if (tools is None or "web_fetch" in tools) and pattern.startswith("domain:"):
        domain = pattern.removeprefix("domain:").strip().lower()
        if not _DOMAIN.fullmatch(domain):
            raise fail(f"{domain!r} is not a host name, e.g. 'domain:example.com' (subdomains included)")


def _balanced(pattern: str) -> bool:
    depth = 0
    for char in pattern:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def check_decision(value: object, where: str) -> None:
    """InvalidArgument naming `where` unless `value` is a decision (allow, deny, ask)."""
    if value not in RULE_TYPES:
        raise InvalidArgument(f"{where} must be one of {', '.join(RULE_TYPES)}, not {value!r}")


def check_rules(rules: object, where: str) -> None:
    """InvalidArgument naming `where` (and the rule's index) unless `rules` is a list of valid rules."""
    if not isinstance(rules, list):
        raise InvalidArgument(f"{where} must be a list of rule strings, not {type(rules).__name__}")
    for index, rule in enumerate(rules):
        try:
            parse_rule(rule)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}[{index}]: {exc}") from None
