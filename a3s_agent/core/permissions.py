"""Permission rules: which tool calls run at once, which are refused and which need a human's yes.

A rule is `Tool` (every call of the tool) or `Tool(pattern)` (calls whose key argument matches).
A policy holds three lists of rules, deny, ask and allow, and a `default_decision`:

- deny beats ask, ask beats allow; `default_decision` applies when no rule matches.
- `default_decision` defaults to "allow": a policy with no rules changes nothing, deny lists work
  on their own, and a host with nobody to confirm is not left waiting. Allow rules only matter
  when it is "ask" or "deny": set one of those for allow-list policies.
- A disabled policy (`enabled=False`) allows every call, whatever its rules say.

Tool names are case-insensitive. Besides our own names (`bash`, `read_file`, ...) the rules
accept the aliases in `TOOL_ALIASES` (Read, Write, Edit/MultiEdit, Delete, LS/List, Glob,
WebFetch, WebSearch; Git means the four built-in git_* tools), and `*` means every tool; calls
checked by an alias, or with A3S Code's argument names (tools/aliases.py), match as ours do. Any
other name made of letters, digits, `_` and `-` is taken as a tool registered later; one that ends
in `*` covers every tool whose name starts with what precedes it (`mcp__git__*`: the tools of the
MCP server `git`).

The pattern is matched against the tool's key argument:

- bash, `command`: `prefix:*` means the command is `prefix` or starts with `prefix` and a space
  (`git:*` matches `git` and `git status`, not `gitk`); any other pattern is a glob over the whole
  command where `*` is any text. Commands are split on `;`, `&`, `&&`, `|`, `||`, `|&`, newlines,
  subshell parentheses and command substitutions (quotes respected, whitespace squeezed). An allow
  rule must match every part and never matches a command with `$(...)`, backticks or `<(...)`;
  deny and ask rules match when any part matches, also after leading `VAR=value` assignments and
  shell keywords (`if`, `then`, `!`, `{`...) are dropped, and when any program the command runs
  (shell_commands.py) matches (shell_rules.py `leads`): its basename, then at least the rule's
  flags, normalised (`rm -fr`, `rm -r -f` and `rm --recursive --force` have those of `rm -rf`),
  and the rule's other words where its own begin, passing over a flag's value (`git -c k=v push`
  leads with `git push`); wrappers are seen through (`sudo rm`, `env X=1 rm`, `timeout 5 rm`,
  `xargs rm`, `find -exec rm`, the string of `bash -c` or `eval`), quotes removed, and `/bin/rm`,
  `\\rm` and `'r''m'` are `rm`. Deny rules on bash are still a tripwire, not a sandbox: a program
  spelt at run time (`$CMD`), one run by an interpreter (`python -c`) or by a wrapper not
  modelled is not seen, nor is anything in a command the parser cannot read or one longer than
  64 KiB (their text is still matched).
- file tools, `path` (git_commit: each of `paths`; run_script: `path`, else its `code` as text):
  the path relative to the workspace, normalised lexically (`./` dropped, `..` collapsed; an
  absolute path inside the workspace made relative), as a glob where `**` spans directories and
  `*` and `?` stay within one name. A missing path is `.`, the workspace root; `src/**` matches
  `src` itself too. The policy is not the sandbox: tools refuse paths outside the workspace.
- web_fetch, `url`: `domain:example.com` matches that host and its subdomains; any other pattern
  is a glob over the URL. web_search: `query`. ask_user: `question`.
- any other tool: its arguments as JSON text (`json.dumps(arguments, sort_keys=True)`).

Globs other than paths have only `*`; matching is case-sensitive except tool names and domains.
With several subjects (bash parts, git_commit paths) allow rules must match all, deny and ask any.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePath, PurePosixPath
from typing import Any, Final, Literal, cast, get_args
from urllib.parse import urlsplit

from ..base.errors import InvalidArgument
from ..tools.aliases import TOOL_NAMES, our_arguments
from .shell_commands import Invocation, Unparsable, parse_command
from .shell_rules import compile_pattern, leads

Decision = Literal["allow", "deny", "ask"]
RuleType = Decision
# Strongest first: the first group with a matching rule decides.
PRECEDENCE: Final[tuple[Decision, ...]] = ("deny", "ask", "allow")
RULE_TYPES: Final[tuple[RuleType, ...]] = get_args(RuleType)
DEFAULT_DECISION: Final[Decision] = "allow"

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
_PATH_TOOLS: Final = frozenset(
    {
        "read_file",
        "write_file",
        "edit_file",
        "delete_file",
        "list_files",
        "search_files",
        "grep",
        "find_definition",
        "find_references",
        "format_code",
        "lint_code",
        "git_status",
        "git_diff",
        "git_log",
    }
)
_TEXT_KEYS: Final = {"web_search": "query", "ask_user": "question"}

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]+\*?|\*")
_RULE = re.compile(r"(?P<tool>[A-Za-z0-9_-]+\*?|\*)(?:\((?P<pattern>.*)\))?", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DOMAIN = re.compile(r"[a-z0-9-]+(?:\.[a-z0-9-]+)*")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=\S*")
_SHELL_KEYWORDS: Final = frozenset(
    {"!", "{", "}", "if", "then", "elif", "else", "do", "while", "until", "time"}
)
_SHELL_OPERATORS: Final = ("&&", "||", "|&", ";;", "|", ";", "\n")
_PARSED_ON_THE_LOOP: Final = 4096
"""The longest command whose rules are matched on the event loop (see `evaluated`)."""
_MOST_PARSED_CHARS: Final = 65536
"""The longest command a deny or ask rule sees parsed (about 0.6 s of the parser here); a longer
one is matched as text."""


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
        workspace: str | PurePath | None = None,
    ) -> bool:
        """Whether this rule, used as a `rule_type` rule, matches the call.

        Allow rules must match every subject of the call (each part of a compound command,
        each path of git_commit); deny and ask rules match when any one does. `workspace` makes
        absolute paths in the arguments relative; nothing on disk is looked at.
        """
        if not self.covers(tool_name):
            return False
        if self.pattern is None:
            return True
        tool = canonical_tool_name(tool_name)
        if tool == "bash":
            return _bash_matches(
                self.pattern, _text_argument(arguments, "command"), strict=rule_type == "allow"
            )
        subjects, test = _subjects(tool, self.pattern, arguments, workspace)
        combine = all if rule_type == "allow" else any
        return combine(test(subject) for subject in subjects)


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


# --- matching -----------------------------------------------------------------------------------


def _text_argument(arguments: Mapping[str, Any], key: str) -> str:
    value = arguments.get(key)
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _subjects(
    tool: str, pattern: str, arguments: Mapping[str, Any], workspace: str | PurePath | None
) -> tuple[list[str], Callable[[str], bool]]:
    """What a non-bash tool's pattern is matched against, and the test for one subject."""
    if tool in _PATH_TOOLS or (tool == "run_script" and arguments.get("path")):
        return [workspace_path(_text_argument(arguments, "path"), workspace)], _path_test(pattern)
    if tool == "git_commit":
        paths = arguments.get("paths") or ["."]
        paths = [paths] if isinstance(paths, str) else paths
        return [workspace_path(str(path), workspace) for path in paths], _path_test(pattern)
    if tool == "run_script":
        return [_text_argument(arguments, "code")], _text_test(pattern)
    if tool == "web_fetch":
        return [_text_argument(arguments, "url")], _url_test(pattern)
    if tool in _TEXT_KEYS:
        return [_text_argument(arguments, _TEXT_KEYS[tool])], _text_test(pattern)
    return [json.dumps(dict(arguments), sort_keys=True, ensure_ascii=False, default=str)], _text_test(pattern)


def workspace_path(raw: str, workspace: str | PurePath | None = None) -> str:
    """`raw` as rules see it: normalised lexically and relative to `workspace` when inside it.

    `./` is dropped and `..` collapsed (`src/../x` is `x`, `../x` stays); an absolute path
    inside the workspace becomes relative (the workspace itself is `.`), one outside stays
    absolute. The filesystem is not consulted.
    """
    path = posixpath.normpath(raw) if raw else "."
    if workspace is None or not posixpath.isabs(path):
        return path
    absolute = PurePosixPath(path)
    root = PurePosixPath(posixpath.normpath(str(workspace)))
    return absolute.relative_to(root).as_posix() if absolute.is_relative_to(root) else path


def _path_test(pattern: str) -> Callable[[str], bool]:
    regex = _path_regex(pattern)
    return lambda path: regex.fullmatch(path) is not None


def _text_test(pattern: str) -> Callable[[str], bool]:
    regex = _text_regex(pattern)
    return lambda text: regex.fullmatch(text) is not None


def _url_test(pattern: str) -> Callable[[str], bool]:
    if not pattern.startswith("domain:"):
        return _text_test(pattern)
    domain = pattern.removeprefix("domain:").strip().lower()
    return lambda url: _host_within(_host(url), domain)


def _host(url: str) -> str | None:
    try:
        host = urlsplit(url).hostname
    except ValueError:  # malformed IPv6 brackets
        return None
    return host.rstrip(".") if host else None


def _host_within(host: str | None, domain: str) -> bool:
    return host is not None and (host == domain or host.endswith("." + domain))


@lru_cache(maxsize=1024)
def _path_regex(pattern: str) -> re.Pattern[str]:
    """A path glob as a regex: `**/` is any directories (or none), `**` anything, `*`/`?` one name's."""
    while pattern.startswith("./"):
        pattern = pattern[2:]
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            parts.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        else:
            parts.append({"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i])))
            i += 1
    return re.compile("".join(parts), re.DOTALL)


@lru_cache(maxsize=1024)
def _text_regex(pattern: str) -> re.Pattern[str]:
    """A text glob as a regex: `*` is any text, everything else literal."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def _squeeze(text: str) -> str:
    return " ".join(text.split())


def _bash_matches(pattern: str, command: str, *, strict: bool) -> bool:
    parts, substitutes = split_command(command)
    if strict:
        return not substitutes and all(_command_matches(pattern, part) for part in parts)
    return any(
        _command_matches(pattern, part) or _command_matches(pattern, _without_prelude(part)) for part in parts
    ) or any(leads(compile_pattern(pattern), run) for run in _programs_run(command))


@lru_cache(maxsize=32)  # a call is checked against each rule in turn: parsed once
def _programs_run(command: str) -> tuple[Invocation, ...]:
    """Every program the command runs, wrappers seen through; none when the parser cannot tell or
    the command is longer than _MOST_PARSED_CHARS (the rule then sees the command's text only)."""
    if len(command) > _MOST_PARSED_CHARS:
        return ()
    try:
        return tuple(parse_command(command).invocations)
    except Unparsable:
        return ()


def _command_matches(pattern: str, command: str) -> bool:
    pattern = _squeeze(pattern)
    if pattern.endswith(":*"):
        prefix = pattern[:-2].rstrip()
        return command == prefix or command.startswith(prefix + " ")
    return _text_regex(pattern).fullmatch(command) is not None


def _without_prelude(command: str) -> str:
    """The command with leading `VAR=value` assignments and shell keywords dropped."""
    words = command.split(" ")
    while words and (words[0] in _SHELL_KEYWORDS or _ASSIGNMENT.fullmatch(words[0])):
        words.pop(0)
    return " ".join(words)


def split_command(command: str) -> tuple[list[str], bool]:
    """The simple commands in a shell command line, and whether it has command substitutions.

    Splits outside quotes on `;`, `&`, `&&`, `|`, `||`, `|&`, newlines and subshell parentheses,
    and at `$(`, backticks, `<(` and `>(` (also inside double quotes), whose contents count as
    commands of their own. Redirections such as `2>&1` and `&>` are not operators. Whitespace in
    each part is squeezed to single spaces; the whole (squeezed) line is returned if no part is
    left, so the list is never empty.
    """
    splitter = _CommandSplitter(command)
    parts = splitter.run()
    return parts or [_squeeze(command)], splitter.substitutes


class _CommandSplitter:
    """A small shell scanner: quotes, escapes, substitutions and operators, nothing more."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.quote: str | None = None
        self.substitutes = False
        self.parts: list[str] = []
        self._current: list[str] = []
        # Open substitutions and subshells: the character that closes each, and the quote to resume.
        self._stack: list[tuple[str, str | None]] = []

    def run(self) -> list[str]:
        while self.pos < len(self.text):
            self.pos += self._step()
        self._flush()
        return self.parts

    def _step(self) -> int:
        """Handle the text at `pos`; return how many characters were consumed."""
        text, char = self.text, self.text[self.pos]
        if self.quote == "'":
            self.quote = None if char == "'" else self.quote
            return self._keep(1)
        if char == "\\":
            return self._keep(2)
        if text.startswith("$(", self.pos) or (
            self.quote is None and text.startswith(("<(", ">("), self.pos)
        ):
            return self._enter(")", 2, substitution=True)
        if char == "`":
            return self._leave() if self._inside("`") else self._enter("`", 1, substitution=True)
        if self.quote == '"':
            self.quote = None if char == '"' else self.quote
            return self._keep(1)
        return self._unquoted(char)

    def _unquoted(self, char: str) -> int:
        if char in "'\"":
            self.quote = char
            return self._keep(1)
        if char == "(":
            return self._enter(")", 1, substitution=False)
        if char == ")":
            return self._leave() if self._inside(")") else self._split(1)
        operator = next((op for op in _SHELL_OPERATORS if self.text.startswith(op, self.pos)), None)
        if operator:
            return self._split(len(operator))
        if char == "&" and not self._is_redirection():
            return self._split(1)
        return self._keep(1)

    def _is_redirection(self) -> bool:
        before = self.text[self.pos - 1] if self.pos else ""
        return before in ("<", ">") or self.text.startswith("&>", self.pos)

    def _inside(self, closer: str) -> bool:
        return bool(self._stack) and self._stack[-1][0] == closer

    def _keep(self, width: int) -> int:
        self._current.append(self.text[self.pos : self.pos + width])
        return width

    def _split(self, width: int) -> int:
        self._flush()
        return width

    def _enter(self, closer: str, width: int, *, substitution: bool) -> int:
        self._flush()
        self._stack.append((closer, self.quote))
        self.quote = None
        self.substitutes = self.substitutes or substitution
        return width

    def _leave(self) -> int:
        self._flush()
        _closer, self.quote = self._stack.pop()
        return 1

    def _flush(self) -> None:
        part = _squeeze("".join(self._current))
        self._current = []
        if part:
            self.parts.append(part)


# --- policies -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """A decision and the rules behind it (as given), empty when the default or a disabled policy decided."""

    decision: Decision
    matching_rules: tuple[str, ...] = ()


@dataclass
class PermissionPolicy:
    """Rules by the decision they lead to; see the module docstring for how they combine."""

    deny: list[str] = field(default_factory=list)
    allow: list[str] = field(default_factory=list)
    ask: list[str] = field(default_factory=list)
    default_decision: Decision = DEFAULT_DECISION
    enabled: bool = True

    def rules(self, rule_type: RuleType) -> list[str]:
        return cast(list[str], getattr(self, rule_type))

    def validate(self) -> None:
        """Raise InvalidArgument naming the first bad field or rule."""
        check_decision(self.default_decision, "default_decision")
        if not isinstance(self.enabled, bool):
            raise InvalidArgument(f"enabled must be true or false, not {self.enabled!r}")
        for rule_type in RULE_TYPES:
            check_rules(self.rules(rule_type), rule_type)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that `from_dict` turns back into an equal policy."""
        return {
            "enabled": self.enabled,
            "default_decision": self.default_decision,
            "deny": list(self.deny),
            "allow": list(self.allow),
            "ask": list(self.ask),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PermissionPolicy:
        """A validated policy from `to_dict`'s shape; missing keys take their defaults."""
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"permission policy must be an object, not {type(data).__name__}")
        unknown = sorted(set(data) - {"enabled", "default_decision", *RULE_TYPES})
        if unknown:
            raise InvalidArgument(f"unknown permission policy fields: {', '.join(map(str, unknown))}")
        policy = cls(
            deny=_copied(data.get("deny", [])),
            allow=_copied(data.get("allow", [])),
            ask=_copied(data.get("ask", [])),
            default_decision=data.get("default_decision", DEFAULT_DECISION),
            enabled=data.get("enabled", True),
        )
        policy.validate()
        return policy


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


def _copied(rules: Any) -> Any:
    """A list's copy, so the policy does not share it; anything else is left for validate() to name."""
    return list(rules) if isinstance(rules, list) else rules


def evaluate(
    policy: PermissionPolicy,
    tool_name: str,
    arguments: Mapping[str, Any],
    workspace: str | PurePath | None = None,
) -> Evaluation:
    """The decision for one call: the strongest group with a matching rule, else the default.

    `matching_rules` lists the deciding group's matching rules, in policy order. A3S Code's
    argument names (`file_path`...) count as ours; one given under both names with different
    values is InvalidArgument.
    """
    arguments = our_arguments(canonical_tool_name(tool_name), arguments)
    if not policy.enabled:
        return Evaluation("allow")
    for rule_type in PRECEDENCE:
        matching = tuple(
            text
            for text in policy.rules(rule_type)
            if parse_rule(text).matches(tool_name, arguments, rule_type=rule_type, workspace=workspace)
        )
        if matching:
            return Evaluation(rule_type, matching)
    return Evaluation(policy.default_decision)


async def evaluated(
    policy: PermissionPolicy,
    tool_name: str,
    arguments: Mapping[str, Any],
    workspace: str | PurePath | None = None,
) -> Evaluation:
    """`evaluate`, on a worker thread when the call has a long command: parsing one takes about
    10 µs a character, which on the event loop would hold up every session."""
    if len(str(arguments.get("command") or "")) > _PARSED_ON_THE_LOOP:
        return await asyncio.to_thread(evaluate, policy, tool_name, arguments, workspace)
    return evaluate(policy, tool_name, arguments, workspace)


def add_rule(policy: PermissionPolicy, rule_type: str, rule: str) -> PermissionPolicy:
    """A copy of `policy` with `rule` appended to the `rule_type` list (allow, deny or ask).

    `rule_type` is case-insensitive. Adding a rule the list already has changes nothing.
    """
    kind = rule_type.strip().lower() if isinstance(rule_type, str) else rule_type
    if kind not in RULE_TYPES:
        raise InvalidArgument(f"rule_type must be one of {', '.join(RULE_TYPES)}, not {rule_type!r}")
    parse_rule(rule)
    lists = {name: list(policy.rules(name)) for name in RULE_TYPES}
    if rule not in lists[kind]:
        lists[kind].append(rule)
    return PermissionPolicy(**lists, default_decision=policy.default_decision, enabled=policy.enabled)
