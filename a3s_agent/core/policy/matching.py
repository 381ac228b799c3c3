"""Whether a rule's pattern matches a call: what each tool's pattern is matched against, and how.

The pattern is matched against the tool's key argument:

- bash, `command`: `prefix:*` means the command is `prefix` or starts with `prefix` and a space
  (`git:*` matches `git` and `git status`, not `gitk`); any other pattern is a glob over the whole
  command where `*` is any text. Allow rules are matched on the parsed command (shell_grants.py:
  each program it runs proved by a rule, no variable set). Deny and ask rules see the command
  split on `;`, `&`, `&&`, `|`, `||`, `|&`, newlines, subshell parentheses and command
  substitutions (shell_split.py: quotes respected, whitespace squeezed) and match when any part
  matches, also after leading
  `VAR=value` assignments and shell keywords (`if`, `then`, `!`, `{`...) are dropped, and when any
  program the command runs (shell_commands.py) matches (shell_rules.py `leads`): its basename,
  then at least the rule's flags, normalised (`rm -fr`, `rm -r -f` and `rm --recursive --force`
  have those of `rm -rf`), and the rule's other words where its own begin, passing over a flag's
  value (`git -c k=v push` leads with `git push`); wrappers are seen through (`sudo rm`,
  `env X=1 rm`, `timeout 5 rm`, `xargs rm`, `find -exec rm`, the string of `bash -c` or `eval`),
  quotes removed, and `/bin/rm`, `\\rm` and `'r''m'` are `rm`. Deny rules on bash are still a
  tripwire, not a sandbox: a program spelt at run time (`$CMD`), one run by an interpreter
  (`python -c`) or by a wrapper not modelled is not seen, nor is anything in a command the parser
  cannot read or one longer than 64 KiB (their text is still matched).
- any other tool, the argument its definition declares as its rule subject (`RuleSubject`,
  tools/registry.py), read as the subject's kind says:
  - a path (`path` of the file, code and git tools; each of git_commit's `paths`; run_script's
    `path`, else its `code` as text): the path relative to the workspace, normalised lexically
    (`./` dropped, `..` collapsed; an absolute path inside the workspace made relative), as a glob
    where `**` spans directories and `*` and `?` stay within one name. A missing path is `.`, the
    workspace root; `src/**` matches `src` itself too. The policy is not the sandbox: tools refuse
    paths outside the workspace.
  - a URL (web_fetch's `url`): `domain:example.com` matches that host and its subdomains; any
    other pattern is a glob over the URL.
  - text (web_search's `query`, ask_user's `question`): a glob over it.
- a tool that declares no subject (MCP, skill and client tools): its arguments as JSON text
  (`json.dumps(arguments, sort_keys=True)`).

Globs other than paths have only `*`; matching is case-sensitive except tool names and domains.
With several subjects (bash parts, git_commit paths) allow rules must match all, deny and ask any.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import PurePath, PurePosixPath
from typing import Any, Final
from urllib.parse import urlsplit

from ...tools.registry import RuleSubject
from .shell_commands import CommandLine
from .shell_grants import parsed_line, proving_rules
from .shell_rules import compile_pattern, leads
from .shell_split import split_command, squeeze

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=\S*")
_SHELL_KEYWORDS: Final = frozenset(
    {"!", "{", "}", "if", "then", "elif", "else", "do", "while", "until", "time"}
)


def text_argument(arguments: Mapping[str, Any], key: str) -> str:
    value = arguments.get(key)
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def subjects(
    subject: RuleSubject | None, pattern: str, arguments: Mapping[str, Any], workspace: str | PurePath | None
) -> tuple[list[str], Callable[[str], bool]]:
    """What a non-bash tool's pattern is matched against, as the tool declares (`subject`), and
    the test for one of them."""
    if subject is None:
        text = json.dumps(dict(arguments), sort_keys=True, ensure_ascii=False, default=str)
        return [text], _text_test(pattern)
    if subject.kind == "url":
        return [text_argument(arguments, subject.argument)], _url_test(pattern)
    if subject.kind == "text":
        return [text_argument(arguments, subject.argument)], _text_test(pattern)
    value = arguments.get(subject.argument)
    if not value and subject.otherwise is not None:
        return subjects(subject.otherwise, pattern, arguments, workspace)
    paths = (
        [str(path) for path in value]
        if isinstance(value, list)
        else [text_argument(arguments, subject.argument)]
    )
    return [workspace_path(path, workspace) for path in paths or ["."]], _path_test(pattern)


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


def beyond_workspace(path: str) -> bool:
    """Whether a path as `workspace_path` gives it is outside the workspace (absolute, or `../x`)."""
    return posixpath.isabs(path) or path == ".." or path.startswith("../")


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


def bash_matches(pattern: str, command: str, *, strict: bool) -> bool:
    """Whether one rule's pattern matches a command: as an allow rule (`strict`), it proves every
    program the command runs (shell_grants.py); as a deny or ask rule, any part of its text or any
    program it runs matches."""
    line = parsed_line(command)
    if strict:
        return line is not None and proving_rules([(pattern, compile_pattern(pattern))], line) is not None
    return any(
        _command_matches(pattern, part) or _command_matches(pattern, _without_prelude(part))
        for part in split_command(command)
    ) or any(leads(compile_pattern(pattern), run) for run in (line.invocations if line else ()))


def bash_allowing_rules(rules: Sequence[tuple[str, str | None]], command: str) -> tuple[str, ...]:
    """The allow rules (as written, with their patterns) that together allow `command`, or none."""
    grants = [(text, None if pattern is None else compile_pattern(pattern)) for text, pattern in rules]
    return proving_rules(grants, parsed_line(command) or CommandLine()) or ()


def _command_matches(pattern: str, command: str) -> bool:
    pattern = squeeze(pattern)
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
