"""Splitting a shell command line into its simple commands by text: quotes, escapes,
substitutions and operators, nothing more (no parser). Deny and ask rules on bash match these parts
as text (core/policy/matching.py), which reads any command, also one the shell parser refuses.
"""

from __future__ import annotations

from typing import Final

_SHELL_OPERATORS: Final = ("&&", "||", "|&", ";;", "|", ";", "\n")


def squeeze(text: str) -> str:
    """`text` with each run of whitespace one space, and none at either end."""
    return " ".join(text.split())


def split_command(command: str) -> list[str]:
    """The simple commands in a shell command line.

    Splits outside quotes on `;`, `&`, `&&`, `|`, `||`, `|&`, newlines and subshell parentheses,
    and at `$(`, backticks, `<(` and `>(` (also inside double quotes), whose contents count as
    commands of their own. Redirections such as `2>&1` and `&>` are not operators. Whitespace in
    each part is squeezed to single spaces; the whole (squeezed) line is returned if no part is
    left, so the list is never empty.
    """
    return _CommandSplitter(command).run() or [squeeze(command)]


class _CommandSplitter:
    """A small shell scanner: quotes, escapes, substitutions and operators, nothing more."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.quote: str | None = None
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
            return self._enter(")", 2)
        if char == "`":
            return self._leave() if self._inside("`") else self._enter("`", 1)
        if self.quote == '"':
            self.quote = None if char == '"' else self.quote
            return self._keep(1)
        return self._unquoted(char)

    def _unquoted(self, char: str) -> int:
        if char in "'\"":
            self.quote = char
            return self._keep(1)
        if char == "(":
            return self._enter(")", 1)
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

    def _enter(self, closer: str, width: int) -> int:
        self._flush()
        self._stack.append((closer, self.quote))
        self.quote = None
        return width

    def _leave(self) -> int:
        self._flush()
        _closer, self.quote = self._stack.pop()
        return 1

    def _flush(self) -> None:
        part = squeeze("".join(self._current))
        self._current = []
        if part:
            self.parts.append(part)
