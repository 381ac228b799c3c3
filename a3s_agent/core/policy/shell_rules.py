"""Matching `Bash(...)` rule patterns against the invocations of a parsed command line.

A pattern `P:*` (or `P` alone, an exact command) is split into words like a command: its program,
its flags and its other words. Flags are normalised: a cluster `-rf` is the flags r and f, so
`rm -fr`, `rm -r -f`, `rm -Rf` and `rm --recursive --force` (also GNU's unambiguous abbreviations
such as `--rec`) all have the flags of `rm -rf`; `--` ends the flags.

- deny and ask rules (loose): an invocation of the program with at least the rule's flags and
  the rule's other words in order among its own (`rm -rf /` matches `rm -rf build /`);
- allow rules (strict): the program word as the rule writes it (allowing `ls` allows neither
  `./ls` nor `/bin/ls`); `P:*` needs the rule's flags and its other words as the invocation's
  first ones; an exact rule needs the same flags and words; a dynamic word never proves a match.

A session's deny and ask rules (core/policy/matching.py) use `leads`: the program, at least the
rule's flags, and the rule's other words where the invocation's words begin, passing over the
words that may be options before a subcommand: a word right after a flag (that flag's value) and
a `+` word (cargo's `+nightly`). So `git -c k=v push`, `git --no-pager push` and
`cargo +nightly publish` lead with their rules' words; `git log --grep push` does not.

Other patterns are globs (`*` is any text) over the invocation's program and words, or over the
simple command as written. `match` answers "maybe" when only a dynamic word ($VAR, a glob, the
arguments xargs adds) could make a loose rule match.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Final, Literal

from .shell_commands import Invocation, Word

Match = Literal["yes", "maybe", "no"]

# Per program: long options (GNU style, abbreviations accepted) and the short flag each is the
# same as, or itself; plus short flags that mean another one (rm -R is rm -r).
_LONG: Final[Mapping[str, Mapping[str, str]]] = {
    "rm": {
        "recursive": "r", "force": "f", "dir": "d", "interactive": "interactive",
        "one-file-system": "one-file-system", "no-preserve-root": "no-preserve-root",
        "preserve-root": "preserve-root", "verbose": "v",
    },
    "cp": {"recursive": "r", "force": "f", "archive": "a"},
    "chmod": {"recursive": "R"},
    "chown": {"recursive": "R"},
    "chgrp": {"recursive": "R"},
    "git": {"force": "f"},
}  # fmt: skip
_SHORT_ALIASES: Final[Mapping[str, Mapping[str, str]]] = {"rm": {"R": "r"}, "cp": {"R": "r"}}


@dataclass(frozen=True)
class CommandPattern:
    kind: Literal["prefix", "exact", "glob"]
    program: str = ""
    path: str = ""  # the program word as the rule writes it
    flags: frozenset[str] = frozenset()
    words: tuple[str, ...] = ()
    glob: re.Pattern[str] | None = None


@dataclass(frozen=True)
class _Shape:
    """An invocation's flags and other words (None for a dynamic one), in order."""

    flags: frozenset[str]
    words: tuple[str | None, ...]
    dynamic: bool
    # Per word: it may be an option before a subcommand (it follows a flag, or is a `+` word).
    passable: tuple[bool, ...]


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> CommandPattern:
    """The pattern of a `Bash(pattern)` rule."""
    text = " ".join(pattern.split())
    if text.endswith(":*"):
        return _words_pattern("prefix", text[:-2].strip())
    if "*" in text:
        glob = re.compile(".*".join(re.escape(part) for part in text.split("*")), re.DOTALL)
        return CommandPattern("glob", glob=glob)
    return _words_pattern("exact", text)


def _words_pattern(kind: Literal["prefix", "exact"], text: str) -> CommandPattern:
    try:
        words = shlex.split(text)
    except ValueError:  # unbalanced quotes: take the words as they are
        words = text.split()
    path = words[0] if words else ""
    program = posixpath.basename(path)
    shape = _shape(program, [Word(word) for word in words[1:]])
    return CommandPattern(kind, program, path, shape.flags, tuple(word or "" for word in shape.words))


def match(pattern: CommandPattern, invocation: Invocation, *, strict: bool) -> Match:
    """Whether the rule matches the invocation: used as an allow rule (`strict`) or a deny/ask rule."""
    if pattern.kind == "glob":
        assert pattern.glob is not None
        subjects = [invocation.words, " ".join(invocation.text.split())]
        hit = invocation.program and any(pattern.glob.fullmatch(s) for s in subjects[: 1 if strict else 2])
        return "yes" if hit else "no"
    if not invocation.program:  # the program is known only when it runs
        return "no" if strict else "maybe"
    if invocation.program != pattern.program:
        return "no"
    if strict and invocation.path != pattern.path:  # allowing `ls` does not allow ./ls
        return "no"
    shape = _shape(invocation.program, invocation.args)
    if invocation.more_args:
        shape = replace(shape, dynamic=True)
    if strict:
        return "yes" if _proves(pattern, shape) else "no"
    if pattern.kind == "exact":
        found = shape.flags == pattern.flags and shape.words == pattern.words and not shape.dynamic
    else:
        known = [word for word in shape.words if word is not None]
        found = pattern.flags <= shape.flags and _in_order(pattern.words, known)
    if found:
        return "yes"
    return "maybe" if shape.dynamic else "no"


def leads(pattern: CommandPattern, invocation: Invocation) -> bool:
    """Whether a session's deny or ask rule matches the invocation (see the module's docstring)."""
    if pattern.kind == "glob":
        return match(pattern, invocation, strict=False) == "yes"
    if not invocation.program or invocation.program != pattern.program:
        return False
    shape = _shape(invocation.program, invocation.args)
    if not pattern.flags <= shape.flags or (pattern.kind == "exact" and shape.flags != pattern.flags):
        return False
    wanted, start = len(pattern.words), 0
    while True:
        head = shape.words[start : start + wanted]
        if head == pattern.words and (pattern.kind == "prefix" or start + wanted == len(shape.words)):
            return True
        if start == len(shape.words) or not shape.passable[start]:
            return False
        start += 1


def _proves(pattern: CommandPattern, shape: _Shape) -> bool:
    if pattern.kind == "exact":
        return not shape.dynamic and shape.flags == pattern.flags and shape.words == pattern.words
    head = shape.words[: len(pattern.words)]
    return pattern.flags <= shape.flags and head == pattern.words


def _in_order(wanted: tuple[str, ...], words: list[str]) -> bool:
    remaining = iter(words)
    return all(any(word == item for item in remaining) for word in wanted)


def _shape(program: str, args: tuple[Word, ...] | list[Word]) -> _Shape:
    flags: set[str] = set()
    words: list[str | None] = []
    passable: list[bool] = []
    dynamic = False
    options_end = False
    flag_before = False
    for arg in args:
        text = arg.text
        is_flag = False
        if arg.dynamic:
            words.append(None)
            passable.append(flag_before)
            dynamic = True
        elif not options_end and text == "--":
            options_end = True
        elif not options_end and text.startswith("--") and len(text) > 2:
            flags.add(_long_flag(program, text[2:].split("=", 1)[0]))
            is_flag = True
        elif not options_end and text.startswith("-") and len(text) > 1:
            aliases = _SHORT_ALIASES.get(program, {})
            flags.update(aliases.get(letter, letter) for letter in text[1:])
            is_flag = True
        else:
            words.append(_normal_path(text))
            passable.append(flag_before or (not options_end and text.startswith("+")))
        flag_before = is_flag
    return _Shape(frozenset(flags), tuple(words), dynamic, tuple(passable))


def _long_flag(program: str, name: str) -> str:
    """The flag a long option is: its short twin, or `--name` (an unambiguous abbreviation expanded)."""
    known = _LONG.get(program, {})
    if name in known:
        return known[name] if len(known[name]) == 1 else "--" + known[name]
    candidates = [option for option in known if option.startswith(name)]
    if len(candidates) == 1:
        return _long_flag(program, candidates[0])
    return "--" + name


def _normal_path(text: str) -> str:
    """A word that is a path, spelt one way: `//x/./` is `/x`, `~/` is `~`."""
    if "/" not in text:
        return text
    return posixpath.normpath(re.sub("/+", "/", text))
