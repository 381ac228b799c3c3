"""Which language server serves a language, and which language a file is in.

Built in: Python by basedpyright (PyPI `basedpyright`, which brings its own Node runtime), else
python-lsp-server (`pylsp`); TypeScript and JavaScript by typescript-language-server (npm); Rust,
Go and C/C++ by rust-analyzer, gopls and clangd when they are on PATH. The operator adds or
replaces servers with `--lsp-server LANGUAGE[:.ext,.ext]=COMMAND` (A3S_LSP_SERVERS, `;`-separated):
its command is split as a shell would (no shell runs it), its extensions (needed only for a
language not built in) say which files are its.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath

from ...base.errors import FailedPrecondition, InvalidArgument
from ..process import find_binary


@dataclass(frozen=True)
class Candidate:
    """One way to run a language's server: its argv (program first, found beside our interpreter
    or on PATH), and how to install it."""

    argv: tuple[str, ...]
    install: str


@dataclass(frozen=True)
class Language:
    name: str
    extensions: Mapping[str, str]
    """File extension (lower case, with its dot) -> the LSP languageId of such a file."""
    candidates: tuple[Candidate, ...]
    configured: bool = False  # the operator's: its one candidate is what runs, found or not

    def server(self) -> tuple[str, ...]:
        """The argv of the first candidate installed here (program resolved); FailedPrecondition
        naming what to install when none is."""
        for candidate in self.candidates:
            program = find_binary(candidate.argv[0])
            if program is not None:
                return (program, *candidate.argv[1:])
        if self.configured:
            raise FailedPrecondition(
                f"the language server configured for {self.name} ({shlex.join(self.candidates[0].argv)})"
                " is not installed on this server: its program is neither beside the server's Python"
                " nor on PATH"
            )
        ways = " or ".join(c.install for c in self.candidates)
        raise FailedPrecondition(
            f"no language server for {self.name} is installed on this server: {ways}"
            f" (or configure one: --lsp-server {self.name}=COMMAND)"
        )


_PYTHON = Language(
    "python",
    {".py": "python", ".pyi": "python"},
    (
        Candidate(("basedpyright-langserver", "--stdio"), "pip install basedpyright"),
        Candidate(("pylsp",), "pip install python-lsp-server"),
    ),
)
_TYPESCRIPT = Language(
    "typescript",
    {
        ".ts": "typescript",
        ".mts": "typescript",
        ".cts": "typescript",
        ".tsx": "typescriptreact",
        ".js": "javascript",
        ".mjs": "javascript",
        ".cjs": "javascript",
        ".jsx": "javascriptreact",
    },
    (
        Candidate(
            ("typescript-language-server", "--stdio"),
            "npm install -g typescript-language-server typescript",
        ),
    ),
)
_RUST = Language(
    "rust", {".rs": "rust"}, (Candidate(("rust-analyzer",), "rustup component add rust-analyzer"),)
)
_GO = Language("go", {".go": "go"}, (Candidate(("gopls",), "go install golang.org/x/tools/gopls@latest"),))
_C_EXTENSIONS = {".c": "c", ".h": "c"}
_CPP_EXTENSIONS = {ext: "cpp" for ext in (".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx")}
_CPP = Language(
    "cpp", {**_C_EXTENSIONS, **_CPP_EXTENSIONS}, (Candidate(("clangd",), "apt-get install clangd"),)
)

BUILT_IN: tuple[Language, ...] = (_PYTHON, _TYPESCRIPT, _RUST, _GO, _CPP)
ALIASES = {"py": "python", "javascript": "typescript", "js": "typescript", "ts": "typescript", "c": "cpp"}
"""Other names clients use for a built-in language (A3S's examples say "javascript", "c")."""

MAX_CONFIGURED = 32
MAX_SPEC_CHARS = 4096


@dataclass
class Catalog:
    """The languages this server knows: the built-in ones, with the operator's on top."""

    languages: dict[str, Language] = field(default_factory=lambda: {lang.name: lang for lang in BUILT_IN})

    @classmethod
    def with_configured(cls, specs: Iterable[str]) -> Catalog:
        """The built-in languages and the operator's `--lsp-server` specs; ValueError naming
        the bad one."""
        catalog = cls()
        for spec in specs:
            language = parse_spec(spec, catalog.languages)
            catalog.languages[language.name] = language
        if len(catalog.languages) > len(BUILT_IN) + MAX_CONFIGURED:
            raise ValueError(f"at most {MAX_CONFIGURED} languages can be configured")
        return catalog

    def language(self, name: str) -> Language:
        """The language a client names (case and A3S's aliases aside); FailedPrecondition for one
        without a server."""
        key = name.strip().lower()
        if not key:
            raise InvalidArgument("language is required (python, typescript, ...)")
        found = self.languages.get(ALIASES.get(key, key)) or self.languages.get(key)
        if found is None:
            raise FailedPrecondition(
                f"no language server is known for {name[:60]!r} (known: {', '.join(sorted(self.languages))});"
                f" the operator can configure one: --lsp-server {key[:60]}:.EXT=COMMAND"
            )
        return found

    def of_file(self, path: PurePath, field_name: str) -> tuple[Language, str]:
        """The language of a file and its LSP languageId, by extension; FailedPrecondition for a
        file no known server reads."""
        suffix = path.suffix.lower()
        for language in reversed(self.languages.values()):  # the operator's first
            if suffix in language.extensions:
                return language, language.extensions[suffix]
        raise FailedPrecondition(
            f"{field_name} {path.name!r}: no language server is known for {suffix or 'extension-less'}"
            f" files; the operator can configure one: --lsp-server LANGUAGE:{suffix or '.EXT'}=COMMAND"
        )


def parse_spec(spec: str, known: Mapping[str, Language]) -> Language:
    """One `LANGUAGE[:.ext,.ext]=COMMAND [ARGS...]`; ValueError naming what is wrong."""
    if len(spec) > MAX_SPEC_CHARS:
        raise ValueError(f"an --lsp-server value is longer than {MAX_SPEC_CHARS} characters")
    head, equals, command = spec.partition("=")
    name, _, extension_list = head.partition(":")
    name = name.strip().lower()
    if not equals or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--lsp-server {spec[:80]!r}: expected LANGUAGE[:.ext,.ext]=COMMAND")
    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise ValueError(f"--lsp-server {spec[:80]!r}: {exc}") from None
    if not argv:
        raise ValueError(f"--lsp-server {spec[:80]!r}: the command is empty")
    name = ALIASES.get(name, name)
    extensions = [e.strip().lower() for e in extension_list.split(",") if e.strip()]
    if any(not e.startswith(".") or len(e) < 2 for e in extensions):
        raise ValueError(f"--lsp-server {spec[:80]!r}: extensions are written .ext, comma-separated")
    base = known.get(name)
    if base is None and not extensions:
        raise ValueError(f"--lsp-server {spec[:80]!r}: say which files are {name}'s ({name}:.ext=COMMAND)")
    mapping = dict(base.extensions) if base is not None else {}
    mapping.update({e: name for e in extensions})
    return Language(name, mapping, (Candidate(argv, ""),), configured=True)
