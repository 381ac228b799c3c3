"""What allow rules on bash cover: the one matcher of session policies (and so ACP's "Always
allow") and Agent Spaces policies, on a command line parsed by shell_commands.py.

An allow rule for a program (`Bash(echo:*)`) covers running that program with the arguments the
rule allows, and whatever the program then does itself (an allowed `cp`, `sed -i` or `dd` writes
where it is told to). The rules together allow a command line when each program it runs is proved
by one of them (shell_rules.py `match`, strict; plain wrappers such as `env` and `nohup` need only
their command proved). They do not cover:

- a command line that sets a variable (`GIT_SSH_COMMAND=x git fetch`, `env LD_PRELOAD=x ls`,
  `export PATH=.`): a variable can change what an allowed program runs;
- the files the shell opens for writing on a program's behalf, and those `tee` writes (`file_writes`):
  each is decided as a write of that file (the `write_file` tool's rules), so `echo x > f` needs a
  rule that covers writing `f` as well as one for `echo`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from .shell_commands import CommandLine, Invocation, Unparsable, Word, parse_command
from .shell_rules import CommandPattern, match

MOST_PARSED_CHARS: Final = 65536
"""The longest command the rules see parsed (about 0.6 s of the parser here); a longer one is
matched as text by deny and ask rules and allowed by no rule with a pattern."""
_NOT_FILES: Final = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})
_CHANGE_DIRECTORY: Final = frozenset({"cd", "pushd", "popd"})
# Wrappers with an option that starts their command in another directory: its short letter.
_CHDIR_OPTIONS: Final = {"env": "C", "sudo": "D"}

Grant = tuple[str, CommandPattern | None]
"""An allow rule as written, and its compiled pattern (None: the rule covers every command)."""


@lru_cache(maxsize=32)  # a call is checked against each rule in turn: parsed once
def parsed_line(command: str) -> CommandLine | None:
    """What `command` runs, or None when the parser cannot tell or the command is longer than
    MOST_PARSED_CHARS. The value is shared between callers: read it, never change it."""
    if len(command) > MOST_PARSED_CHARS:
        return None
    try:
        return parse_command(command)
    except Unparsable:
        return None


def proving_rules(grants: Sequence[Grant], line: CommandLine) -> tuple[str, ...] | None:
    """The allow rules that prove a program `line` runs (and those that cover every command), in
    the order given; None unless together they prove every program, or when the line runs none
    or sets a variable (a rule that covers every command allows those too)."""
    whole = [text for text, pattern in grants if pattern is None]
    if not whole and (not line.invocations or line.assigned):
        return None
    used = set(whole)
    for invocation in line.invocations:
        if invocation.transparent:
            continue
        proofs = [text for text, pattern in grants if _proves(pattern, invocation)]
        if not proofs and not whole:
            return None
        used.update(proofs)
    return tuple(text for text, _ in grants if text in used)


def _proves(pattern: CommandPattern | None, invocation: Invocation) -> bool:
    return pattern is not None and match(pattern, invocation, strict=True) == "yes"


@dataclass(frozen=True)
class FileWrite:
    """A file the shell or `tee` opens for writing: `target` as written, and `path`, normalised
    lexically and joined to the command's directory (absolute when written so); None when it is
    known only when the command runs ($F, a glob, `~`, a relative name after a `cd`)."""

    target: str
    path: str | None


def file_writes(line: CommandLine, cwd: str = ".") -> list[FileWrite]:
    """The files `line` writes through redirections and `tee`, but not /dev/null and the like.

    `cwd` is the directory the command starts in (relative to the workspace or absolute).
    """
    moves = any(_changes_directory(invocation) for invocation in line.invocations)
    found = [_file_write(word, cwd, moves) for word in [*line.redirected, *_tee_files(line)]]
    return [write for write in found if write.path not in _NOT_FILES]


def _file_write(word: Word, cwd: str, moves: bool) -> FileWrite:
    text = word.text
    if word.dynamic or text.startswith("~") or (moves and not posixpath.isabs(text)):
        return FileWrite(text, None)
    return FileWrite(text, posixpath.normpath(posixpath.join(cwd or ".", text)))


def _changes_directory(invocation: Invocation) -> bool:
    if invocation.program in _CHANGE_DIRECTORY:
        return True
    letter = _CHDIR_OPTIONS.get(invocation.program)
    if letter is None:
        return False
    # Any word that may be the option counts, also one of the command it runs (`env ls -C`).
    return any(
        arg.text.startswith("--chdir")
        or (arg.text[:1] == "-" and arg.text[1:2] != "-" and letter in arg.text)
        for arg in invocation.args
    )


def _tee_files(line: CommandLine) -> Iterator[Word]:
    for invocation in line.invocations:
        if invocation.program != "tee":
            continue
        options = True
        for arg in invocation.args:
            if options and arg.text == "--" and not arg.dynamic:
                options = False
            elif options and arg.text.startswith("-") and arg.text != "-" and not arg.dynamic:
                continue
            else:
                yield arg
        if invocation.more_args:  # xargs tee: the files are known only when it runs
            yield Word("(the arguments xargs adds)", dynamic=True)
