"""What a shell command line runs: every program it invokes, found with a real shell parser (bashlex).

    line = parse_command("cd src && env -i nohup /bin/rm -fr build | tee log")
    [inv.program for inv in line.invocations]   # ['cd', 'env', 'nohup', 'rm', 'tee']

Every simple command counts: those of pipelines, lists, subshells, `{ ...; }`, if/while/for bodies,
function bodies, command substitutions ($(...), backticks, also inside double quotes and in
assignments) and process substitutions. The program is the basename of the first word after
quote removal (`/bin/rm`, `\\rm` and `'r''m'` are all `rm`). Wrappers are seen through: `env`
(its options and VAR=value words), `command`, `exec`, `nohup`, `nice`, `timeout`, `stdbuf`,
`setsid`, `sudo`, `doas`, `xargs`, `busybox`, `builtin`, `time`, `find -exec/-execdir/-ok`, and the
string of `bash -c`/`sh -c`/`eval` is parsed as a command line of its own; the wrapper and what
it runs are both invocations. The targets of redirections that open a file for writing are
recorded too (`CommandLine.redirected`; shell_grants.py decides what they mean).

A word whose value is known only when the command runs ($VAR, $(...), globs, brace expansion,
$'...') is `dynamic`. `Unparsable` is raised for what cannot be told statically: text bashlex
cannot parse or does not model (case, [[ ]], $(( )), select, coproc), a command substitution
inside ${...} or an unquoted here-document, a dynamic `bash -c` or `eval` string, `env -S`.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import bashlex
import bashlex.ast
import bashlex.errors
import bashlex.state
import bashlex.tokenizer

MAX_DEPTH: Final = 4  # nested `bash -c` / `eval` strings parsed
_DYNAMIC_PARTS: Final = frozenset({"parameter", "commandsubstitution", "processsubstitution"})
_SUBSTITUTION = re.compile(r"\$\(|`|[<>]\(")
# A quoted here-document delimiter (<<'EOF', <<"EOF", <<\EOF), which bashlex does not accept.
_QUOTED_HEREDOC = re.compile(r"<<-?[ \t]*(?:(['\"])([A-Za-z0-9_.-]+)\1|\\([A-Za-z0-9_.-]+))")
_SHELLS: Final = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh"})
# Wrappers that are more than a way to start their command: allow rules must allow them too.
_OWN_AUTHORITY: Final = frozenset({"sudo", "doas", "find"})
_DECLARERS: Final = frozenset({"export", "declare", "typeset", "readonly", "local"})
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=")
_FIND_EXEC: Final = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_WRITING_REDIRECTIONS: Final = frozenset({">", ">>", ">|", "&>", "&>>", ">&", "<>"})


class Unparsable(Exception):
    """The command line cannot be checked statically; the message says why."""


@dataclass(frozen=True)
class Word:
    text: str  # after quote removal
    dynamic: bool = False  # its value is known only when the command runs


@dataclass(frozen=True)
class Invocation:
    """One program the command line runs, with its arguments."""

    program: str  # the basename of the program word; "" when that word is dynamic
    args: tuple[Word, ...]
    text: str  # the simple command as written, for glob rules
    path: str = ""  # the program word itself (`/bin/rm`, `./ls`)
    transparent: bool = False  # a wrapper whose command is an invocation of its own (env, nohup...)
    more_args: bool = False  # arguments are added when it runs (xargs, find -exec's {})

    @property
    def words(self) -> str:
        """The program and its arguments as one line, as glob rules see it."""
        return " ".join([self.program, *(word.text for word in self.args)])


@dataclass
class CommandLine:
    invocations: list[Invocation] = field(default_factory=list)
    assigned: set[str] = field(default_factory=set)  # variables set anywhere (X=1, env X=1, export X=1)
    # The targets of redirections that open a file for writing (> >> >| &> &>> >&FILE <>), in order.
    redirected: list[Word] = field(default_factory=list)


def parse_command(command: str, depth: int = 0) -> CommandLine:
    """Every invocation in `command`; Unparsable says what could not be parsed."""
    if depth > MAX_DEPTH:
        raise Unparsable(f"commands nested more than {MAX_DEPTH} deep in bash -c or eval strings")
    text, literal_heredocs = _unquote_heredoc_delimiters(command)
    line = CommandLine()
    try:
        for node in _parse(text):
            _Walker(text, literal_heredocs, line, depth).walk(node)
    except RecursionError:
        raise Unparsable("it is nested too deeply to check") from None
    return line


def _parse(text: str) -> list[Any]:
    if _runs_nothing(text):
        return []
    try:
        return list(bashlex.parse(text))
    except NotImplementedError as exc:
        if "time command" not in str(exc):
            raise Unparsable(f"the parser does not support {_construct(exc)}") from None
    except Exception as exc:  # bashlex raises ParsingError, and on odd input anything
        raise Unparsable(f"the shell parser cannot parse it: {exc}") from None
    # bash's `time` keyword, which bashlex does not model: blank it out (time runs its pipeline).
    try:
        text = _without_time_keyword(text)
        return [] if _runs_nothing(text) else list(bashlex.parse(text))
    except Exception as exc:
        raise Unparsable(f"the shell parser cannot parse it: {exc}") from None


def _runs_nothing(text: str) -> bool:
    """Only blanks, `;` and comments, which bashlex cannot parse."""
    return all(not line.strip(" \t;") or line.strip(" \t;").startswith("#") for line in text.split("\n"))


def _construct(exc: NotImplementedError) -> str:
    message = str(exc)
    found = re.search(r"type = \{([^}]*)\}", message)
    return found.group(1) if found else message


def _without_time_keyword(text: str) -> str:
    chars = list(text)
    tokens = bashlex.tokenizer.tokenizer(text, bashlex.state.parserstate())
    kinds = {"TIME", "TIMEOPT", "TIMEIGN"}
    for token in tokens:
        if token.ttype is not None and token.ttype.name in kinds:
            start = token.lexpos
            chars[start : start + len(token.value)] = " " * len(token.value)
    return "".join(chars)


def _unquote_heredoc_delimiters(text: str) -> tuple[str, set[int]]:
    """`text` with the quotes of <<'EOF' (<<"EOF", <<\\EOF) blanked, and where those delimiters start.

    A quoted delimiter makes the here-document literal; bashlex accepts only unquoted ones.
    Blanking keeps every position, so the words of the parse still index `text`.
    """
    chars, starts = list(text), set()
    for match in _QUOTED_HEREDOC.finditer(text):
        if match.group(2):
            chars[match.start(1)] = chars[match.end(2)] = " "
            starts.add(match.start(2))
        else:
            chars[match.start(3) - 1] = " "
            starts.add(match.start(3))
    return "".join(chars), starts


class _Walker:
    def __init__(self, text: str, literal_heredocs: set[int], line: CommandLine, depth: int) -> None:
        self.text = text
        self.literal_heredocs = literal_heredocs
        self.line = line
        self.depth = depth
        self._seen: set[int] = set()

    def walk(self, node: Any) -> None:
        if id(node) in self._seen:  # bashlex lists a function's body twice
            return
        self._seen.add(id(node))
        kind = node.kind
        if kind == "command":
            self._command(node)
        elif kind == "parameter" and _SUBSTITUTION.search(node.value):
            raise Unparsable("a command substitution inside ${...}, which the parser does not read")
        elif kind == "redirect" and getattr(node, "heredoc", None) is not None:
            self._heredoc(node)
        elif kind == "redirect" and node.type in _WRITING_REDIRECTIONS and _is_node(node.output):
            self.line.redirected.append(self._word(node.output))  # not `2>&1` or `>&-`: no file
        elif kind == "assignment":
            self.note_assignment(node.word)
        for child in _children(node):
            self.walk(child)

    def _heredoc(self, node: Any) -> None:
        delimiter = node.output
        literal = getattr(delimiter, "pos", (-1,))[0] in self.literal_heredocs
        if not literal and _SUBSTITUTION.search(node.heredoc.value):
            raise Unparsable("a command substitution in a here-document, which the parser does not read")

    def note_assignment(self, word: str) -> None:
        """Record the variable a `NAME=value` word sets."""
        found = _ASSIGNMENT.match(word)
        if found:
            self.line.assigned.add(found.group(1))

    def _command(self, node: Any) -> None:
        words = [self._word(part) for part in node.parts if part.kind == "word"]
        if words:
            raw = self.text[node.pos[0] : node.pos[1]]
            self.line.invocations.extend(self._invocations(words, raw))

    def _word(self, node: Any) -> Word:
        raw = self.text[node.pos[0] : node.pos[1]]
        dynamic = (
            any(part.kind in _DYNAMIC_PARTS for part in _descendants(node))
            or "$'" in raw
            or '$"' in raw
            or _expands(_unquoted_skeleton(raw))
        )
        # bashlex's own quote removal leaves quotes in words like 'r''m'.
        return Word(raw if dynamic else _unquote(raw), dynamic)

    def _invocations(self, words: Sequence[Word], raw: str) -> list[Invocation]:
        """The invocation `words` make and those of the commands it wraps."""
        head, args = words[0], tuple(words[1:])
        if head.dynamic:
            return [Invocation("", args, raw, head.text)]
        program = posixpath.basename(head.text.rstrip("/")) or head.text
        if program in _DECLARERS:
            for arg in args:
                self.note_assignment(arg.text)
        inner, more_args, extra = self._wrapped(program, args)
        transparent = bool(inner or extra) and program not in _OWN_AUTHORITY
        own = Invocation(program, args, raw, head.text, transparent=transparent)
        found = [own, *extra]
        if inner:
            found.extend(
                _with_more_args(invocation, more_args) for invocation in self._invocations(inner, raw)
            )
        return found

    def _wrapped(self, program: str, args: tuple[Word, ...]) -> tuple[list[Word], bool, list[Invocation]]:
        """What `program` runs: the command in its arguments, whether it adds arguments to that
        command when it runs (xargs), and the invocations of strings or -exec it runs."""
        spec = _WRAPPERS.get(program)
        if spec is not None:
            try:
                start = spec.command_start(args, self)
            except _NoCommand:
                return [], False, []
            return (list(args[start:]) if start is not None else []), program == "xargs", []
        if program in _SHELLS:
            script = _shell_c_string(args)
            return [], False, (self._nested(script, f"{program} -c") if script is not None else [])
        if program == "eval":
            return [], False, self._nested(_joined(args), "eval")
        if program == "find":
            found = [self._invocations(words, " ".join(w.text for w in words)) for words in _find_exec(args)]
            return [], False, [invocation for invocations in found for invocation in invocations]
        return [], False, []

    def _nested(self, script: Word, what: str) -> list[Invocation]:
        if script.dynamic:
            raise Unparsable(f"the string {what} runs is known only when it runs")
        nested = parse_command(script.text, self.depth + 1)
        self.line.assigned |= nested.assigned
        self.line.redirected.extend(nested.redirected)
        return nested.invocations


def _with_more_args(invocation: Invocation, more_args: bool) -> Invocation:
    return dataclasses.replace(invocation, more_args=True) if more_args else invocation


def _joined(args: Sequence[Word]) -> Word:
    return Word(" ".join(arg.text for arg in args), any(arg.dynamic for arg in args))


def _shell_c_string(args: Sequence[Word]) -> Word | None:
    """The command string of `bash -c STRING` (None without -c)."""
    with_value = {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}
    index, has_c = 0, False
    while index < len(args):
        arg = args[index]
        if arg.dynamic:
            if has_c:
                break
            raise Unparsable("a shell's options are known only when it runs")
        if arg.text == "--":
            index += 1
            break
        if arg.text in with_value:
            index += 2
            continue
        if len(arg.text) > 1 and arg.text[0] in "-+" and not arg.text.startswith("--"):
            has_c = has_c or "c" in arg.text[1:]
        elif not arg.text.startswith("--"):
            break
        index += 1
    if not has_c:
        return None
    if index >= len(args):
        raise Unparsable("bash -c without a command string")
    return args[index]


def _find_exec(args: Sequence[Word]) -> Iterator[list[Word]]:
    """The commands of find's -exec, -execdir, -ok and -okdir; `{}` is a file name found at run time."""
    index = 0
    while index < len(args):
        if args[index].text in _FIND_EXEC and not args[index].dynamic:
            end = index + 1
            while end < len(args) and args[end].text not in (";", "+"):
                end += 1
            words = [Word(w.text, w.dynamic or "{}" in w.text) for w in args[index + 1 : end]]
            if words:
                yield words
            index = end
        index += 1


@dataclass(frozen=True)
class _Wrapper:
    """How a wrapper's own options are written: which take a value, and what comes before the command."""

    short_values: str = ""  # short options that take a value (-u root, -uroot)
    long_values: frozenset[str] = frozenset()  # long options that take one (--user root, --user=root)
    attached_only: str = ""  # short options whose value, if any, is attached (-i{}, -l5)
    assignments: bool = False  # VAR=value words before the command (env, sudo)
    operands: int = 0  # words before the command (timeout's duration)
    refuse: frozenset[str] = frozenset()  # options that make the command unknowable (env -S)
    no_command: frozenset[str] = frozenset()  # options after which nothing runs (command -v)

    def command_start(self, args: Sequence[Word], walker: _Walker) -> int | None:
        """Where the wrapped command starts in `args`; None when the wrapper runs no command."""
        index = 0
        while index < len(args):
            arg = args[index]
            text = arg.text
            if arg.dynamic:
                raise Unparsable(f"a wrapper's option {text!r} is known only when it runs")
            if text == "--":
                index += 1
                break
            if text.startswith("--") and len(text) > 2:
                name = text[2:].split("=", 1)[0]
                self._check(name, text)
                index += 2 if name in self.long_values and "=" not in text else 1
                continue
            if text.startswith("-") and len(text) > 1:
                index += self._short(text)
                continue
            break
        if self.assignments:
            while index < len(args) and _ASSIGNMENT.match(args[index].text):
                walker.note_assignment(args[index].text)
                index += 1
        index += self.operands
        return index if index < len(args) else None

    def _check(self, name: str, text: str) -> None:
        if name in self.refuse:
            raise Unparsable(f"the option {text!r} makes the command it runs unknowable")
        if name in self.no_command:
            raise _NoCommand

    def _short(self, text: str) -> int:
        """How many words the short option cluster `text` takes: 1, or 2 when its value follows."""
        for position, letter in enumerate(text[1:], 1):
            self._check(letter, text)
            if letter in self.attached_only:
                return 1
            if letter in self.short_values:
                return 1 if position < len(text) - 1 else 2
        return 1


class _NoCommand(Exception):
    """The wrapper was asked to look up, not run, its command (`command -v`)."""


def _wrapper(**options: Any) -> _Wrapper:
    for name in ("long_values", "refuse", "no_command"):
        if name in options:
            options[name] = frozenset(options[name])
    return _Wrapper(**options)


_WRAPPERS: Final[dict[str, _Wrapper]] = {
    "env": _wrapper(
        short_values="uCS", long_values={"unset", "chdir", "split-string"}, assignments=True,
        refuse={"S", "split-string"},
    ),
    "command": _wrapper(no_command={"v", "V"}),
    "exec": _wrapper(short_values="a"),
    "nohup": _wrapper(),
    "nice": _wrapper(short_values="n", long_values={"adjustment"}),
    "timeout": _wrapper(short_values="sk", long_values={"signal", "kill-after"}, operands=1),
    "stdbuf": _wrapper(short_values="ioe", long_values={"input", "output", "error"}),
    "setsid": _wrapper(),
    "sudo": _wrapper(
        short_values="ugCDhprtTU",
        long_values={"user", "group", "close-from", "chdir", "host", "prompt", "role", "type",
                     "command-timeout", "other-user"},
        assignments=True,
    ),
    "doas": _wrapper(short_values="uC"),
    "xargs": _wrapper(
        short_values="adEILnPs",
        long_values={"arg-file", "delimiter", "eof", "replace", "max-lines", "max-args", "max-procs",
                     "max-chars", "process-slot-var"},
        attached_only="eil",
    ),
    "busybox": _wrapper(),
    "builtin": _wrapper(),
    "time": _wrapper(short_values="fo", long_values={"format", "output"}),
}  # fmt: skip


def _is_node(value: object) -> bool:
    return isinstance(value, bashlex.ast.node)


def _children(node: Any) -> Iterator[Any]:
    for value in vars(node).values():
        if isinstance(value, bashlex.ast.node):
            yield value
        elif isinstance(value, list):
            yield from (item for item in value if isinstance(item, bashlex.ast.node))


def _descendants(node: Any) -> Iterator[Any]:
    for child in _children(node):
        yield child
        yield from _descendants(child)


def _unquote(raw: str) -> str:
    """A static word as the program receives it: quotes removed, backslash escapes applied."""
    out: list[str] = []
    quote: str | None = None
    index = 0
    while index < len(raw):
        char = raw[index]
        index += 1
        if quote == "'":
            if char == "'":
                quote = None
            else:
                out.append(char)
        elif char == "\\" and index < len(raw):
            following = raw[index]
            index += 1
            if following == "\n":
                continue
            if quote == '"' and following not in '$`"\\':
                out.append(char)
            out.append(following)
        elif char == '"':
            quote = None if quote else '"'
        elif char == "'" and quote is None:
            quote = "'"
        else:
            out.append(char)
    return "".join(out)


def _expands(skeleton: str) -> bool:
    """Whether an unquoted glob (*, ?, [...]) or brace expansion ({a,b}, {1..3}) is in the word."""
    if "*" in skeleton or "?" in skeleton:
        return True
    bracket = skeleton.find("[")
    if bracket >= 0 and "]" in skeleton[bracket:]:
        return True
    start = skeleton.find("{")
    while start >= 0:
        end = skeleton.find("}", start)
        if end < 0:
            return False
        if "," in skeleton[start:end] or ".." in skeleton[start:end]:
            return True
        start = skeleton.find("{", end)
    return False


def _unquoted_skeleton(raw: str) -> str:
    """`raw`, a word as written, with every quoted or escaped character (and the quotes) as `_`."""
    out: list[str] = []
    quote: str | None = None
    escaped = False
    for char in raw:
        if escaped:
            escaped = False
            out.append("_")
        elif char == "\\" and quote != "'":
            escaped = True
            out.append("_")
        elif quote:
            quote = None if char == quote else quote
            out.append("_")
        elif char in "'\"":
            quote = char
            out.append("_")
        else:
            out.append(char)
    return "".join(out)
